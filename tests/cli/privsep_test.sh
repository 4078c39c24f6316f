#!/usr/bin/env bash
# `cellgate serve --user` (privilege separation), end to end as root: the process that speaks
# HTTP runs as the given user with no capabilities and no_new_privs; kernels start in the root
# broker (cold: no zygote, the path where ipykernel binds some sockets after it chmods the
# connection dir) and work as usual (state across cells, files both ways, interrupt, restart keeping the
# work dir, shutdown); on SIGTERM the broker ends too and leaves nothing behind. Wrong --user
# uses are usage errors (exit 2) that name the problem. Exit 77 (skipped) when not root.
set -uo pipefail
BIN="${1:?usage: privsep_test.sh BIN_DIR}"
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root"; exit 77; }
WORK="$(mktemp -d /tmp/cellgate-privsep-XXXXXX)"
chmod 0755 "$WORK"
pid=
cleanup() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$WORK/log" ] && tail -20 "$WORK/log" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

for bad in "0" "no-such-user-cellgate" "64000:x"; do
  out=$("$BIN/cellgate" serve --port 0 --state-dir "$WORK/bad" --user "$bad" 2>&1)
  [ $? -eq 2 ] || fail "--user $bad was not a usage error: $out"
done
grep -q "useradd --system" <<<"$("$BIN/cellgate" serve --port 0 --state-dir "$WORK/bad" \
  --user no-such-user-cellgate 2>&1)" || fail "an unknown user gets no hint"
out=$("$BIN/cellgate" serve --port 0 --state-dir "$WORK/bad" --user 64000 --no-jail 2>&1)
[ $? -eq 2 ] && grep -q "do not combine" <<<"$out" || fail "--user with --no-jail: $out"

STATE="$WORK/state"
"$BIN/cellgate" serve --ip 127.0.0.1 --port 0 --state-dir "$STATE" --user 64001:64002 \
  --token t --pool-size 1 --no-zygote > "$WORK/log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -qs "listening on" "$WORK/log" && break; sleep 0.1; done
URL=$(grep -o "listening on http://[0-9.:]*" "$WORK/log" | sed 's/listening on //')
[ -n "$URL" ] || fail "did not start"
H="Authorization: token t"

# The gateway: the user, no capability in any set, no_new_privs. The broker: its root child.
st=/proc/$pid/status
[ "$(awk '/^Uid:/{print $2,$3,$4,$5}' $st)" = "64001 64001 64001 64001" ] || fail "uid: $(grep Uid $st)"
[ "$(awk '/^Gid:/{print $2,$3,$4,$5}' $st)" = "64002 64002 64002 64002" ] || fail "gid: $(grep Gid $st)"
for cap in CapInh CapPrm CapEff CapBnd CapAmb; do
  [ "$(awk -v c="$cap:" '$1==c{print $2}' $st)" = "0000000000000000" ] || fail "$cap: $(grep $cap $st)"
done
[ "$(awk '/^NoNewPrivs:/{print $2}' $st)" = "1" ] || fail "no_new_privs is not set"
broker=$(ps -o pid= --ppid "$pid" | head -1 | tr -d ' ')
[ -n "$broker" ] && [ "$(awk '/^Uid:/{print $2}' /proc/$broker/status)" = "0" ] || fail "no root broker"
grep -q "privilege separation: this gateway runs as 64001" "$WORK/log" || fail "not logged"

kid=$(curl -sf -H "$H" -X POST "$URL/api/kernels" -d '{}' | json 'd["id"]') || fail "no kernel"
run() { curl -sf -H "$H" -X POST "$URL/api/kernels/$kid/execute" -d "$(python3 -c 'import json,sys; print(json.dumps({"code": sys.argv[1]}))' "$1")"; }
r=$(run "x = 6 * 7; open('k.txt', 'w').write('from kernel')") || fail "cell 1"
[ "$(json 'd["status"]' <<<"$r")" = "ok" ] || fail "cell 1: $r"
[ "$(run 'print(x)' | json 'd["stdout"].strip()')" = "42" ] || fail "state across cells"
[ "$(curl -sf -H "$H" "$URL/api/kernels/$kid/files/k.txt")" = "from kernel" ] ||
  fail "the gateway cannot read the kernel's file"
curl -sf -H "$H" -X PUT --data-binary "from gateway" "$URL/api/kernels/$kid/files/d/up.txt" \
  > /dev/null || fail "upload"
r=$(run "open('d/up.txt', 'a').write(' and kernel'); print(open('d/up.txt').read())")
[ "$(json 'd["stdout"].strip()' <<<"$r")" = "from gateway and kernel" ] ||
  fail "the kernel cannot change the gateway's file: $r"
[ "$(curl -sf -H "$H" "$URL/api/kernels/$kid/files/d/up.txt")" = "from gateway and kernel" ] ||
  fail "the gateway does not see the kernel's change"

# Interrupt goes through the broker (the gateway cannot signal the kernel itself).
# Sent once the cell says it sleeps (a file it writes, read through the gateway), not after a
# guessed delay: on a loaded machine an interrupt before the cell runs finds the kernel idle.
( for _ in $(seq 600); do
    curl -sf -o /dev/null -H "$H" "$URL/api/kernels/$kid/files/sleeping" && break
    sleep 0.1
  done
  curl -sf -H "$H" -X POST "$URL/api/kernels/$kid/interrupt" > /dev/null ) &
r=$(run "import time; open('sleeping', 'w').close(); time.sleep(30)")
[ "$(json 'd["error"]["ename"]' <<<"$r")" = "KeyboardInterrupt" ] || fail "not interrupted: $r"
curl -sf -H "$H" -X POST "$URL/api/kernels/$kid/restart" > /dev/null || fail "restart"
r=$(run "import os; print(os.path.exists('k.txt'), 'x' in globals())")
[ "$(json 'd["stdout"].strip()' <<<"$r")" = "True False" ] || fail "restart: $r"
[ -d "$STATE/work/$kid" ] || fail "no work dir $STATE/work/$kid"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H "$H" -X DELETE "$URL/api/kernels/$kid")" = 204 ] ||
  fail "shutdown"
[ ! -e "$STATE/work/$kid" ] || fail "the work dir outlived its kernel"

kill -TERM "$pid"
wait "$pid" 2>/dev/null
pid=
for _ in $(seq 1 50); do kill -0 "$broker" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$broker" 2>/dev/null || fail "the broker outlived its gateway"
[ -z "$(ls -A "$STATE/work")" ] || fail "work dirs left: $(ls -A "$STATE/work")"
[ -z "$(ls -A "$STATE/run")" ] || fail "runtime dirs left: $(ls -A "$STATE/run")"
echo ok

#!/usr/bin/env bash
# `cellgate serve --optional-limits`: an unknown limit name is a usage error (exit 2, naming the
# known ones) before anything starts; known ones are accepted and logged as warnings.
set -uo pipefail
BIN="${1:?usage: optional_limits_test.sh BIN_DIR}"
WORK="$(mktemp -d)"
pid=
cleanup() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$BIN/cellgate" serve --port 0 --state-dir "$WORK/a" --optional-limits landlock,bogus 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "exit $rc for an unknown limit: $out"
grep -q "unknown optional limit 'bogus' (known: memory, swap, pids, cpu, work_size, landlock)" \
  <<<"$out" || fail "no naming of the known limits: $out"
[ ! -e "$WORK/a/lock" ] || fail "the state dir was claimed before the options were checked"

"$BIN/cellgate" serve --ip 127.0.0.1 --port 0 --state-dir "$WORK/b" --pool-size 0 --no-zygote \
  --optional-limits swap,landlock > "$WORK/log" 2>&1 &
pid=$!
# -s: the background shell may not have made the log yet. 50 s: a loaded machine's start.
for _ in $(seq 1 500); do grep -qs "listening on" "$WORK/log" && break; sleep 0.1; done
grep -q "listening on" "$WORK/log" || fail "did not start: $(cat "$WORK/log")"
grep -q "kernels start without the swap limit where this host cannot enforce it" "$WORK/log" ||
  fail "no warning for swap: $(cat "$WORK/log")"
grep -q "kernels start without the landlock limit" "$WORK/log" || fail "no warning for landlock"
echo ok

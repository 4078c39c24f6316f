#!/usr/bin/env bash
# `cellgate exec --url` against a `cellgate serve` started here (loopback, a free port, a temp
# state dir), stopped by its pid. Checks streamed output, a chart saved as a PNG file, the exit
# codes for an error, a timeout and a wrong token, and --kernel-id keeping state.
set -euo pipefail
BIN="${1:?usage: exec_remote_test.sh BIN_DIR}"
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [[ -n "${SERVER_PID}" ]]; then
    kill "${SERVER_PID}" 2>/dev/null || true
    wait "${SERVER_PID}" 2>/dev/null || true
  fi
  rm -rf "${WORK}"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"${BIN}/cellgate" serve --ip 127.0.0.1 --port 0 --token sekrit --state-dir "${WORK}/state" \
  > "${WORK}/serve.out" 2> "${WORK}/serve.err" &
SERVER_PID=$!
for _ in $(seq 500); do  # 50 s: a loaded machine's start
  grep -q "listening on" "${WORK}/serve.out" 2>/dev/null && break
  sleep 0.1
done
URL="$(sed -n 's|.*listening on \(http://[0-9.:]*\).*|\1|p' "${WORK}/serve.out" | head -1)"
[[ -n "${URL}" ]] || fail "the server did not start: $(cat "${WORK}/serve.err")"

out="$("${BIN}/cellgate" exec --url "${URL}" --token sekrit --artifacts "${WORK}/art" \
  'import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show(); print("streamed"); 6 * 7')"
grep -qx "streamed" <<<"${out}" || fail "no stdout in: ${out}"
grep -qx "42" <<<"${out}" || fail "no result in: ${out}"
png="$(sed -n 's|^<image/png saved to \(.*\)>$|\1|p' <<<"${out}")"
[[ -f "${png}" ]] || fail "no saved PNG in: ${out}"
[[ "$(head -c 8 "${png}" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] || fail "not a PNG: ${png}"

set +e
"${BIN}/cellgate" exec --url "${URL}" --token sekrit '1/0' > /dev/null 2> "${WORK}/err"
rc=$?
set -e
[[ ${rc} -eq 1 ]] || fail "an error exits ${rc}, not 1"
grep -q "ZeroDivisionError" "${WORK}/err" || fail "no traceback on stderr"

set +e
"${BIN}/cellgate" exec --url "${URL}" --token sekrit --timeout 1 'while True: pass' > /dev/null 2>&1
rc=$?
"${BIN}/cellgate" exec --url "${URL}" --token wrong 'print(1)' > /dev/null 2>&1
rc_token=$?
set -e
[[ ${rc} -eq 124 ]] || fail "a timeout exits ${rc}, not 124"
[[ ${rc_token} -eq 2 ]] || fail "a wrong token exits ${rc_token}, not 2"

id="$(curl -sf -H 'Authorization: token sekrit' -X POST "${URL}/api/kernels" -d '{}' \
  | sed -n 's|.*"id":"\([^"]*\)".*|\1|p')"
[[ -n "${id}" ]] || fail "cannot start a kernel"
"${BIN}/cellgate" exec --url "${URL}" --token sekrit --kernel-id "${id}" 'x = 20' > /dev/null
out="$("${BIN}/cellgate" exec --url "${URL}" --token sekrit --kernel-id "${id}" 'x + 1')"
[[ "${out}" == "21" ]] || fail "state not kept in --kernel-id: ${out}"
echo "ok"

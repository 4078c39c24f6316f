#!/usr/bin/env bash
# Two `cellgate serve` on one host (different state dirs, loopback, free ports) each start a
# kernel: their uid ranges (leased under /run/cellgate/uid-ranges) and their kernels' uids must
# differ, and each kernel must really run as the uid its gateway logged. Servers are stopped by
# their pids.
set -euo pipefail
BIN="${1:?usage: uid_ranges_test.sh BIN_DIR}"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill "${pid}" 2>/dev/null || true
    wait "${pid}" 2>/dev/null || true
  done
  rm -rf "${WORK}"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

serve() {  # name -> prints the URL
  "${BIN}/cellgate" serve --ip 127.0.0.1 --port 0 --token sekrit --state-dir "${WORK}/$1" \
    --pool-size 0 --no-zygote > "${WORK}/$1.log" 2>&1 &
  PIDS+=($!)
}
url_of() {
  for _ in $(seq 500); do  # 50 s: a loaded machine's start
    grep -q "listening on" "${WORK}/$1.log" 2>/dev/null && break
    sleep 0.1
  done
  sed -n 's|.*listening on \(http://[0-9.:]*\).*|\1|p' "${WORK}/$1.log" | head -1
}
serve a
serve b
URL_A="$(url_of a)"
URL_B="$(url_of b)"
[[ -n "${URL_A}" && -n "${URL_B}" ]] || fail "a server did not start: $(cat "${WORK}"/*.log)"
for url in "${URL_A}" "${URL_B}"; do
  curl -sf -H 'Authorization: token sekrit' -X POST "${url}/api/kernels" -d '{}' > /dev/null \
    || fail "cannot start a kernel at ${url}"
done

range_of() { sed -n 's|.*kernels run as uids \([0-9]*-[0-9]*\).*|\1|p' "${WORK}/$1.log" | head -1; }
uid_of() { sed -n 's|.*started (python3), uid \([0-9]*\).*|\1|p' "${WORK}/$1.log" | head -1; }
RA="$(range_of a)"; RB="$(range_of b)"; UA="$(uid_of a)"; UB="$(uid_of b)"
[[ -n "${RA}" && -n "${RB}" && -n "${UA}" && -n "${UB}" ]] || fail "no uid lines: $(cat "${WORK}"/*.log)"
[[ "${RA}" != "${RB}" ]] || fail "both gateways leased uids ${RA}"
inside() { (( $1 >= ${2%-*} && $1 <= ${2#*-} )); }
inside "${UA}" "${RA}" || fail "kernel uid ${UA} outside its range ${RA}"
inside "${UB}" "${RB}" || fail "kernel uid ${UB} outside its range ${RB}"
(( ${RA#*-} < ${RB%-*} || ${RB#*-} < ${RA%-*} )) || fail "ranges ${RA} and ${RB} overlap"
for u in "${UA}" "${UB}"; do
  ps -eo uid=,comm= | awk -v u="${u}" '$1 == u && $2 ~ /python/ { found = 1 } END { exit !found }' \
    || fail "no python process runs as uid ${u}"
done
echo "ok"

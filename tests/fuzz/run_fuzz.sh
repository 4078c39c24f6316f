#!/usr/bin/env bash
# Runs one libFuzzer target over a COPY of its seed corpus (the source tree is never written):
#   run_fuzz.sh <fuzzer> <seed dir> <work dir> <seconds> [crash dir]
# The copy is made afresh in <work dir>/corpus unless KEEP_CORPUS=1 (scripts/fuzz: what a long
# run finds stays there for the next one). Reproducers saved in <crash dir> (tests/fuzz/crashes/
# <name>) are run first, every time: a fixed bug stays fixed. Exits non-zero on any crash, leak,
# timeout (-timeout=10) or broken invariant; the failing input lands in <work dir>/artifacts/.
# MAX_LEN in the environment is passed as -max_len (cellgate_fuzz(… MAX_LEN n) sets it for the
# CTest run); without it libFuzzer takes the largest seed's length.
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4 crashes=${5:-}
mkdir -p "$work/artifacts"
if [ "${KEEP_CORPUS:-0}" != 1 ] || [ ! -d "$work/corpus" ]; then
  rm -rf "$work/corpus"
  cp -r "$seeds" "$work/corpus"
fi
if [ -n "$crashes" ] && [ -d "$crashes" ] && [ -n "$(ls -A "$crashes")" ]; then
  "$fuzzer" -runs=0 "$crashes"/*
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  ${MAX_LEN:+-max_len="$MAX_LEN"} -artifact_prefix="$work/artifacts/" "$work/corpus"

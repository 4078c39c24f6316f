#!/usr/bin/env bash
# The JavaScript clients (tests/js/*.test.mjs) against `cellgate serve`: the files named, else
# every one. Needs Node >= 20 and npm.
# CELLGATE_BIN_DIR: where `cellgate` is (default ../../build/bin, relative to this directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

export CELLGATE_BIN_DIR="${CELLGATE_BIN_DIR:-../../build/bin}"
if [[ ! -x "${CELLGATE_BIN_DIR}/cellgate" ]]; then
  echo "run.sh: no cellgate binary in ${CELLGATE_BIN_DIR} (set CELLGATE_BIN_DIR)" >&2
  exit 1
fi

# Install exactly what package-lock.json pins, again whenever the lock file is newer; one install
# at a time (CTest runs the test files side by side), under a lock on this directory.
(
  flock 9
  if [[ ! -d node_modules || package-lock.json -nt node_modules ]]; then
    npm ci --no-audit --no-fund --loglevel=error
    touch node_modules
  fi
) 9<.

# Test files named on the command line, else every one.
if [[ $# -eq 0 ]]; then
  set -- ./*.test.mjs
fi
exec node --test --test-concurrency=1 --test-reporter=spec "$@"

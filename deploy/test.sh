#!/usr/bin/env bash
# Set up and build (deploy/build.sh), then run every test.  GPU suites skip
# themselves where no GPU is usable; their reasons are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KVD_BUILD_DIR:-build}
./deploy/build.sh "$@"
rc=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" || rc=$?
# ctest keeps the output of skipped tests to itself: show why they skipped.
grep -h '^SKIP:' "$build/Testing/Temporary/LastTest.log" 2>/dev/null | sort | uniq -c || true
exit $rc

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

# The whole suite again, built with AddressSanitizer and
# UndefinedBehaviorSanitizer (cpu backend) in its own tree ($build-asan).
# KVD_ASAN=0 leaves it out.
if [ "${KVD_ASAN:-1}" != 0 ]; then
  asan="$build-asan"
  t0=$SECONDS
  cmake -S . -B "$asan" -DKVD_SANITIZE=ON -DKVD_CUDA=OFF >/dev/null
  cmake --build "$asan" -j "$(nproc)"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir "$asan" --output-on-failure -j "$(nproc)" || rc=$?
  echo "test.sh: sanitizer build and tests: $((SECONDS - t0)) s"
fi

# The libFuzzer target (clang, ASan + UBSan) for a bounded time:
# $KVD_FUZZ_SECONDS (default 60; 0 leaves it out).
if [ "${KVD_FUZZ_SECONDS:-60}" != 0 ]; then
  t0=$SECONDS
  ./tests/fuzz/run.sh "${KVD_FUZZ_SECONDS:-60}" || rc=$?
  echo "test.sh: fuzzing: $((SECONDS - t0)) s"
fi
exit $rc

#!/usr/bin/env bash
# Install what the build and the tests need (deploy/setup.sh --tests), build
# (deploy/build.sh), then run every test.  GPU suites skip themselves where
# no GPU is usable; their reasons are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KVD_BUILD_DIR:-build}
./deploy/setup.sh --tests
./deploy/build.sh "$@"
rc=0
passed=0
failed=0
# run_ctest DIR: ctest in DIR; adds its counts to passed/failed.
run_ctest() {
  local out=$1/Testing/ctest-summary.log line total fails
  mkdir -p "$1/Testing"
  ctest --test-dir "$1" --output-on-failure -j "$(nproc)" 2>&1 | tee "$out" || rc=1
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$out" | tail -n 1)
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  fails=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  if [ -n "$line" ]; then
    passed=$((passed + total - fails))
    failed=$((failed + fails))
  else
    failed=$((failed + 1))
  fi
}
run_ctest "$build"
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
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  run_ctest "$asan"
  echo "test.sh: sanitizer build and tests: $((SECONDS - t0)) s"
fi

# The libFuzzer target (clang, ASan + UBSan) for a bounded time:
# $KVD_FUZZ_SECONDS (default 60; 0 leaves it out).
if [ "${KVD_FUZZ_SECONDS:-60}" != 0 ]; then
  t0=$SECONDS
  if ./tests/fuzz/run.sh "${KVD_FUZZ_SECONDS:-60}"; then
    passed=$((passed + 1))
  else
    rc=1
    failed=$((failed + 1))
  fi
  echo "test.sh: fuzzing: $((SECONDS - t0)) s"
fi
# One closing line over every stage (skipped GPU suites count as passed, as
# ctest counts them; their reasons are printed above).
echo "test.sh: $passed passed, $failed failed"
exit $rc

#!/usr/bin/env bash
# Install what the build and the tests need (deploy/setup.sh --tests), build
# (deploy/build.sh), then run every test: the normal tree, the same suites
# built with AddressSanitizer and UndefinedBehaviorSanitizer, and the fuzzer
# for a bounded time.
#
# Skips: a test that cannot run here skips saying why (tests/CMakeLists.txt);
# the closing lines name each skipped test and each case a passing test
# skipped, with its reason, per tree.  KVD_NO_SKIP_LABEL=cpu (.ci/run sets
# it) makes a cpu-labelled test that skips fail.
#
# Time: every time bound of the suites is scaled by KVD_TEST_TIME_SCALE
# (default 1), which this raises by the machine's load when a tree starts
# (the 1-minute load average per core, rounded up) and by 3 for the
# sanitizer tree.
#
# The last line is `test.sh: N passed, N failed, N skipped` over every
# stage; the exit status is 0 only when nothing failed.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n "2,18p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
build=${KVD_BUILD_DIR:-build}
./deploy/setup.sh --tests
./deploy/build.sh "$@"
rc=0
base_scale=${KVD_TEST_TIME_SCALE:-1}
trees=()

# time_scale FACTOR: base scale x FACTOR x the load per core (rounded up).
time_scale() {
  local cores load per
  cores=$(nproc)
  load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
  per=$(awk -v l="$load" -v c="$cores" 'BEGIN { p = int(l / c); if (p < l / c) p++; print p < 1 ? 1 : p }')
  echo $((base_scale * $1 * per))
}

# run_ctest DIR FACTOR: ctest in DIR under the scaled bounds; its results
# in DIR/Testing/results.xml for the closing account.
run_ctest() {
  local dir=$1 scale results
  scale=$(time_scale "$2")
  results=$dir/Testing/results.xml
  case $results in /*) ;; *) results=$PWD/$results ;; esac
  echo "test.sh: $dir: KVD_TEST_TIME_SCALE=$scale"
  rm -f "$results"
  KVD_TEST_TIME_SCALE=$scale ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" \
    --output-junit "$results" \
    --test-output-size-passed 1048576 --test-output-size-failed 1048576 || rc=1
  trees+=("$dir=$results")
}
run_ctest "$build" 1

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
  run_ctest "$asan" 3
  echo "test.sh: sanitizer build and tests: $((SECONDS - t0)) s"
fi

# The libFuzzer targets (clang, ASan + UBSan) for a bounded time each:
# $KVD_FUZZ_SECONDS (default 60; 0 leaves them out).
fuzz_passed=0
fuzz_failed=0
if [ "${KVD_FUZZ_SECONDS:-60}" != 0 ]; then
  for target in frames serial cluster cluster-msgs; do
    t0=$SECONDS
    if ./tests/fuzz/run.sh "${KVD_FUZZ_SECONDS:-60}" "$target"; then
      fuzz_passed=$((fuzz_passed + 1))
    else
      rc=1
      fuzz_failed=$((fuzz_failed + 1))
      echo "test.sh: fuzzing $target: failed"
    fi
    echo "test.sh: fuzzing $target: $((SECONDS - t0)) s"
  done
fi

# The closing account: per tree, then one line over every stage.
totals=$(mktemp)
trap 'rm -f "$totals"' EXIT
python3 tests/ctest_summary.py --totals "$totals" "${trees[@]}" || echo "0 1 0" >"$totals"
read -r passed failed skipped <"$totals"
passed=$((passed + fuzz_passed))
failed=$((failed + fuzz_failed))
if [ "$failed" -gt 0 ]; then
  rc=1
fi
echo "test.sh: $passed passed, $failed failed, $skipped skipped"
exit $rc

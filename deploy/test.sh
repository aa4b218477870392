#!/usr/bin/env bash
# Set up and build (deploy/build.sh), then run every test.  GPU suites skip themselves, saying
# why, where no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/build.sh "$@"
ctest --test-dir "${KVD_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

#!/usr/bin/env bash
# Install what the build needs (deploy/setup.sh; the tests' extra packages
# come with deploy/test.sh), then configure and build kvdock into ./build
# (or $KVD_BUILD_DIR).  Extra arguments go to cmake's configure step.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n "2,4p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
./deploy/setup.sh
build=${KVD_BUILD_DIR:-build}
args=()
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake -S . -B "$build" "${args[@]}" "$@"
cmake --build "$build" -j "$(nproc)"

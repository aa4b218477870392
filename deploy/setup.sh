#!/usr/bin/env bash
# Set up a fresh Debian or Ubuntu machine for kvdock.
#
#   deploy/setup.sh           what the build needs (deploy/build.sh runs this)
#   deploy/setup.sh --tests   that, and what the tests add: valgrind, clang,
#                             numpy, PyTorch, mypy, ... (deploy/test.sh runs this)
#   --list                    print the packages instead of installing them
#
# CUDA is not installed here: the script checks for nvcc and says what is
# missing (without it, kvdock builds its CPU backend only).
set -euo pipefail

tests=0
list=0
for a in "$@"; do
  case "$a" in
    --tests) tests=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kvdock setup: unknown argument '$a' (--tests, --list)" >&2; exit 2 ;;
  esac
done

# The build: the daemon, the libraries, the CLI and the test programs (the
# Check suites are built with everything else).
build_packages=(
  build-essential cmake pkg-config
  libuv1-dev                          # event loop (static libuv_a.a)
  libprotobuf-c-dev protobuf-c-compiler  # wire format (static libprotobuf-c.a, protoc-c)
  libucx-dev libnuma-dev              # the cluster's transport (static libucp.a ..., libnuma.a)
  liburing-dev                        # the disk level's I/O (static liburing.a)
  check libsubunit-dev                # the unit test programs (static libcheck.a)
)
# What running the tests adds.
test_packages=(
  ucx-utils                           # ucx_perftest, beside the cluster benchmark
  fio                                 # the disk level's yardstick (tests/bench/bench_disk.sh)
  clang libclang-rt-dev               # libFuzzer target (-fsanitize=fuzzer: libclang_rt.fuzzer)
  valgrind                            # the daemon's integration test under valgrind
  python3
  python3-numpy python3-venv python3-pip  # Python client (client/python) and its tests
  python3-torch                       # its PyTorch paths (CPU tensors in CI; ~600 MiB installed)
  mypy                                # its types, checked with mypy --strict
)

packages=("${build_packages[@]}")
if ((tests)); then
  packages+=("${test_packages[@]}")
fi
if ((list)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "kvdock setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "kvdock setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  if ((tests)); then
    echo "kvdock setup: all packages present (build and tests)"
  else
    echo "kvdock setup: all packages present (build)"
  fi
fi

# CUDA: look on PATH, then in the toolkit's usual home.
if command -v nvcc >/dev/null 2>&1; then
  echo "kvdock setup: CUDA compiler: $(command -v nvcc) ($(nvcc --version | tail -n 1))"
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "kvdock setup: CUDA compiler: /usr/local/cuda/bin/nvcc (not on PATH; the build finds it there)"
else
  echo "kvdock setup: nvcc not found: install the CUDA Toolkit (12.8 or newer) for the GPU backend;" \
       "building the CPU backend only" >&2
fi

#!/usr/bin/env bash
# Set up a fresh Debian or Ubuntu machine to build and test kvdock.
# Installs every package the build and the tests need; CUDA is not
# installed here: the script checks for nvcc and says what is missing
# (without it, kvdock builds its CPU backend only).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libuv1-dev                          # event loop (static libuv_a.a)
  libprotobuf-c-dev protobuf-c-compiler  # wire format (static libprotobuf-c.a, protoc-c)
  libucx-dev libnuma-dev ucx-utils    # the cluster's transport (static libucp.a ..., libnuma.a), ucx_perftest
  check libsubunit-dev                # unit tests (static libcheck.a)
  clang libclang-rt-dev               # libFuzzer target (-fsanitize=fuzzer: libclang_rt.fuzzer)
  valgrind                            # the daemon's integration test under valgrind
  python3
  python3-numpy python3-venv python3-pip  # Python client (client/python) and its tests
  python3-torch                       # its PyTorch paths (CPU tensors in CI; ~600 MiB installed)
  mypy                                # its types, checked with mypy --strict
)

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
  echo "kvdock setup: all packages present"
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

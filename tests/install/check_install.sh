#!/usr/bin/env bash
# check_install.sh BUILD_DIR CONSUMER_DIR CMAKE CC
#
# `cmake --install` the build into a temporary prefix (and with DESTDIR),
# check the installed tree, then build tests/install/consumer against it
# with pkg-config and with find_package(kvdock), shared and static, and
# run it against the installed kvdockd.
set -euo pipefail

build=$1 consumer=$2 cmake=$3 cc=$4
tmp=$(mktemp -d /tmp/kvdock-install-XXXXXX)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not found"; exit 77; }

step "cmake --install $build --prefix $tmp/prefix"
"$cmake" --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
prefix=$tmp/prefix
libdir=$(dirname "$(find "$prefix" -name kvdock.pc -path '*/pkgconfig/*' | head -n 1)")/..
libdir=$(cd "$libdir" && pwd)

# the library's soname carries the client ABI of the installed header
abi=$(sed -n 's/^#define KVD_CLIENT_ABI_VERSION \([0-9]*\).*/\1/p' "$prefix/include/kvdock/client.h")
[ -n "$abi" ] || fail "no KVD_CLIENT_ABI_VERSION in the installed client.h"

step "installed files"
for f in bin/kvdockd bin/kvdock include/kvdock/client.h include/kvdock/status.h include/kvdock/types.h include/kvdock/kernels.h \
         share/kvdock/kvdockd.example.conf share/kvdock/systemd/kvdockd.service \
         share/kvdock/systemd/kvdockd.socket lib/systemd/system/kvdockd.service \
         lib/systemd/system/kvdockd.socket; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
for f in libkvdock.so "libkvdock.so.$abi" libkvdock.a libkvdock_kernels.so libkvdock_kernels.a \
         pkgconfig/kvdock.pc pkgconfig/kvdock-kernels.pc cmake/kvdock/kvdockConfig.cmake \
         cmake/kvdock/kvdockConfigVersion.cmake; do
  [ -e "$libdir/$f" ] || fail "lib/$f not installed"
done
# the public headers only: the internal ones (proto/src: wire.h, blake2s.h,
# parse.h) stay out, and an installed header includes only installed ones
installed=$(cd "$prefix/include/kvdock" && ls | sort | tr '\n' ' ')
[ "$installed" = "client.h kernels.h status.h types.h " ] ||
  fail "include/kvdock holds '$installed', not the four public headers"
for h in "$prefix"/include/kvdock/*.h; do
  for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$h"); do
    [ -e "$prefix/include/$inc" ] || fail "installed $(basename "$h") includes $inc, which is not installed"
  done
done
# the static archive carries the protocol runtime it needs
# (whole outputs captured first: grep -q would cut a pipe under pipefail)
syms=$(nm -g --defined-only "$libdir/libkvdock.a")
grep -q ' T kvdock__request__pack$' <<< "$syms" || fail "libkvdock.a lacks the protocol messages"
grep -q ' T kvd__frame_pack$' <<< "$syms" || fail "libkvdock.a lacks the framing code"
# the shared library exports the API only
dsyms=$(nm -D --defined-only "$libdir/libkvdock.so" | awk 'NF == 3 {print $3}')
others=$(grep -v '^kvd_' <<< "$dsyms" || true)
[ -z "$others" ] || { echo "$others" | head; fail "libkvdock.so exports more than kvd_*"; }
# ...and each of them is declared in an installed header (no private helper
# leaks into the ABI)
hdrs=$(cat "$prefix"/include/kvdock/*.h)
for s in $dsyms; do
  grep -q "\b$s(" <<< "$hdrs" || fail "libkvdock.so exports $s, which no installed header declares"
done
for u in lib/systemd/system share/kvdock/systemd; do
  grep -q "^ExecStart=$prefix/bin/kvdockd " "$prefix/$u/kvdockd.service" ||
    fail "$u/kvdockd.service: ExecStart does not name $prefix/bin/kvdockd"
done
grep -q '^kvdockd ' <<< "$("$prefix/bin/kvdockd" --version)" || fail "installed kvdockd --version"
grep -q 'usage: kvdock' <<< "$("$prefix/bin/kvdock" --help)" || fail "installed kvdock --help"

step "DESTDIR install"
DESTDIR=$tmp/dest "$cmake" --install "$build" > /dev/null || fail "DESTDIR install"
[ -n "$(find "$tmp/dest" -name libkvdock.a)" ] || fail "DESTDIR install has no libkvdock.a"

step "the installed kvdockd"
mkdir -m 0700 "$tmp/run"
sock=$tmp/run/kvdockd.sock
"$prefix/bin/kvdockd" --backend cpu --socket "$sock" 2> "$tmp/kvdockd.log" &
daemon_pid=$!
for _ in $(seq 1 500); do [ -S "$sock" ] && break; sleep 0.02; done
[ -S "$sock" ] || { cat "$tmp/kvdockd.log"; fail "kvdockd did not start"; }

run_consumer() { # NAME BINARY
  local out
  out=$("$2" "$sock") || { echo "$out"; fail "$1 failed"; }
  echo "$out" | sed "s/^/  $1: /"
  grep -qx 'strerror(EINVAL)=invalid argument' <<< "$out" || fail "$1: strerror"
  grep -qx 'connect(nonexistent)=ECONN' <<< "$out" || fail "$1: connect"
  grep -qx 'ping=OK backend=cpu' <<< "$out" || fail "$1: ping"
}

step "pkg-config, shared"
export PKG_CONFIG_PATH=$libdir/pkgconfig
pkg-config --exists --print-errors kvdock || fail "pkg-config kvdock"
[ "$(pkg-config --modversion kvdock)" = "$("$prefix/bin/kvdockd" --version | awk '{print $2}')" ] ||
  fail "pkg-config version differs from kvdockd --version"
"$cc" -Wall -Werror -std=c11 -o "$tmp/pc_shared" "$consumer/consumer.c" \
  $(pkg-config --cflags --libs kvdock) -Wl,-rpath,"$(pkg-config --variable=libdir kvdock)"
grep -q "NEEDED.*libkvdock\\.so\\.$abi\\]" <<< "$(readelf -d "$tmp/pc_shared")" ||
  fail "pc_shared does not use libkvdock.so.$abi"
# libkvdock.so.ABI is a link to libkvdock.so.ABI.MINOR.PATCH
case "$(readlink "$libdir/libkvdock.so.$abi")" in
libkvdock.so."$abi".*) ;;
*) fail "libkvdock.so.$abi points at $(readlink "$libdir/libkvdock.so.$abi")" ;;
esac
run_consumer pc_shared "$tmp/pc_shared"

step "pkg-config, static, as kvdock.pc's comment says"
# the command the installed kvdock.pc shows, run as it stands
static_cmd=$(sed -n 's/^#   cc prog\.c \(.*-l:libkvdock\.a.*\)$/\1/p' "$libdir/pkgconfig/kvdock.pc")
[ -n "$static_cmd" ] || fail "kvdock.pc shows no static link command"
eval "\"\$cc\" -Wall -Werror -std=c11 -o \"\$tmp/pc_static\" \"\$consumer/consumer.c\" $static_cmd" ||
  fail "kvdock.pc's static link command fails: $static_cmd"
if grep -q 'NEEDED.*libkvdock' <<< "$(readelf -d "$tmp/pc_static")"; then fail "pc_static needs libkvdock.so"; fi
run_consumer pc_static "$tmp/pc_static"

step "pkg-config files name no path of the build machine"
# Only ${pcfiledir}-relative paths, and the CUDA runtime's folder through
# the variable cudalibdir (a CUDA build's), which a user may redefine.
for pc in kvdock kvdock-kernels; do
  if grep -nE '^(Libs|Libs\.private|Cflags):.*-[LI]/' "$libdir/pkgconfig/$pc.pc"; then
    fail "$pc.pc names an absolute path where a variable belongs"
  fi
  cudalibdir=$(pkg-config --variable=cudalibdir "$pc")
  static_libs=$(pkg-config --static --libs "$pc")
  if [ -n "$cudalibdir" ]; then
    grep -q -- "-lcudart_static" <<< "$static_libs" || fail "$pc.pc has cudalibdir but no -lcudart_static"
    moved=$(pkg-config --static --libs --define-variable=cudalibdir=/opt/elsewhere/cuda/lib "$pc")
    grep -q -- "-L/opt/elsewhere/cuda/lib " <<< "$moved " || fail "$pc.pc ignores cudalibdir: $moved"
    if grep -qF -- "-L$cudalibdir " <<< "$moved "; then fail "$pc.pc names $cudalibdir itself: $moved"; fi
  elif grep -q cudart <<< "$static_libs"; then
    fail "$pc.pc links the CUDA runtime without a cudalibdir: $static_libs"
  fi
done

step "pkg-config, kernels"
"$cc" -Wall -Werror -std=c11 -o "$tmp/pc_kernels" "$consumer/kernels.c" \
  $(pkg-config --cflags --libs kvdock-kernels) -Wl,-rpath,"$libdir"
"$tmp/pc_kernels" || fail "pc_kernels"

step "find_package(kvdock)"
"$cmake" -S "$consumer" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release > "$tmp/consumer-cfg.log" 2>&1 ||
  { cat "$tmp/consumer-cfg.log"; fail "consumer configure"; }
"$cmake" --build "$tmp/consumer-build" > "$tmp/consumer-build.log" 2>&1 ||
  { cat "$tmp/consumer-build.log"; fail "consumer build"; }
grep -q "NEEDED.*libkvdock\\.so\\.$abi\\]" <<< "$(readelf -d "$tmp/consumer-build/consumer_shared")" ||
  fail "consumer_shared does not use libkvdock.so.$abi"
if grep -q 'NEEDED.*libkvdock' <<< "$(readelf -d "$tmp/consumer-build/consumer_static")"; then
  fail "consumer_static needs libkvdock.so"
fi
run_consumer cmake_shared "$tmp/consumer-build/consumer_shared"
run_consumer cmake_static "$tmp/consumer-build/consumer_static"
"$tmp/consumer-build/kernels_static" || fail "kernels_static"

if command -v systemd-analyze >/dev/null 2>&1; then
  step "systemd-analyze verify"
  # The installed units, as they are, must parse and name what exists.
  out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no \
        "$prefix/lib/systemd/system/kvdockd.socket" \
        "$prefix/lib/systemd/system/kvdockd.service" 2>&1) || true
  bad=$(grep -E 'kvdockd\.(service|socket)' <<< "$out" | grep -viE 'bus|Failed to (connect|create)' || true)
  if [ -n "$bad" ]; then
    echo "$out"
    fail "systemd-analyze verify complained about the units"
  fi
fi
echo "check_install: OK"

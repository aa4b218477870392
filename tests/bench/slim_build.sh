#!/usr/bin/env bash
# Copy a build folder without what only the compiler needs (object files,
# static archives, CMakeFiles/), so that it fits the GPU machine's carry
# limit (64 MiB with the working tree); binaries, shared libraries and the
# ctest files stay.
#
#   tests/bench/slim_build.sh [BUILD_DIR] [DEST]      (default build-gpu .carry/bg)
#
# DEST should be a folder git ignores (.carry/ is).  On the GPU machine,
# tests/bench/gpu_round.sh DEST finds the ctest paths through a link from
# the original folder's name.  A DEST ending in .tgz is the same copy
# packed (about a quarter of the size: room in the carry for a second
# library build); gpu_round.sh unpacks it beside itself.
set -euo pipefail
src=${1:-build-gpu}
dest=${2:-.carry/bg}
if [ ! -f "$src/CMakeCache.txt" ]; then
    echo "slim_build: $src is not a configured build folder" >&2
    exit 2
fi
# what only the compiler needs
skip=(--exclude='*.o' --exclude='*.a' --exclude='*.ii' --exclude='CMakeFiles' --exclude='Testing')
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
case "$dest" in
*.tgz) tar czf "$dest" -C "$src" "${skip[@]}" . ;;
*) mkdir -p "$dest" && tar cf - -C "$src" "${skip[@]}" . | tar xf - -C "$dest" ;;
esac
# ucx_perftest and the shared libraries it needs beyond the C library, as
# ucx/bin and ucx/lib, for bench_cluster.sh on a machine without UCX
if [ -x "$src/tests/bench/bench_cluster" ] && command -v ucx_perftest >/dev/null; then
    ucx=$(mktemp -d)
    mkdir -p "$ucx/ucx/bin" "$ucx/ucx/lib"
    cp "$(command -v ucx_perftest)" "$ucx/ucx/bin/"
    ldd "$(command -v ucx_perftest)" | awk '/=> \// {print $3}' |
        grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
        xargs -r cp -L -t "$ucx/ucx/lib/"
    case "$dest" in
    *.tgz) gunzip -c "$dest" >"$ucx/b.tar" && tar rf "$ucx/b.tar" -C "$ucx" ucx &&
        gzip -c "$ucx/b.tar" >"$dest" ;;
    *) cp -r "$ucx/ucx" "$dest/" ;;
    esac
    rm -rf "$ucx"
fi
du -sh "$dest"

#!/usr/bin/env bash
# The disk level's store against fio on the same directory, in one run:
#
#   tests/bench/bench_disk.sh BUILD DIR [BLOCK] [BYTES] [DEPTH]
#                                       (default 2m 1g 32)
#
# fio (io_uring, O_DIRECT) writes BYTES sequentially in the store's batch
# size with as many writes in flight as the store keeps (8 of 8 MiB), then
# reads them at random in the size one record's read takes, DEPTH at once;
# bench_disk then spills BYTES of BLOCK-sized blocks and loads them all back
# in a random order, DEPTH at once.  Each line says the rate; the last two
# say the store's rate as a share of fio's.  DIR must be on the file system
# the cache directory will use (not tmpfs: O_DIRECT); its files are removed.
# Without fio (the GPU machine), disk_probe (built beside bench_disk) runs
# the same two jobs and the lines say so (BENCH_DISK_TOOL=disk_probe: also
# where fio is there, to compare the two).  BENCH_DISK_ARGS goes to the
# store's run (for instance "--prep-threads 1").
set -euo pipefail
build=${1:?usage: bench_disk.sh BUILD DIR [BLOCK] [BYTES] [DEPTH]}
dir=${2:?usage: bench_disk.sh BUILD DIR [BLOCK] [BYTES] [DEPTH]}
block=${3:-2m}
bytes=${4:-1g}
depth=${5:-32}
bench=$build/tests/bench/bench_disk
probe=
if [ "${BENCH_DISK_TOOL:-}" = disk_probe ] || ! command -v fio >/dev/null; then
  probe=$build/tests/bench/disk_probe
  [ -x "$probe" ] || { echo "bench_disk: neither fio (deploy/setup.sh --tests) nor $probe" >&2; exit 2; }
fi
[ -x "$bench" ] || { echo "bench_disk: $bench not built" >&2; exit 2; }
work=$(mktemp -d "$dir/bench-disk-XXXXXX")
chmod 700 "$work"
trap 'rm -rf "$work"' EXIT

# the store's shape: one record's aligned read size, from a tiny run
shape=$("$bench" "$work" --block "$block" --bytes "$block" --depth 1 | head -1)
read_bytes=$(sed -n 's/.*read_bytes=\([0-9]*\).*/\1/p' <<<"$shape")
rm -rf "${work:?}"/*

rate() { # fio's JSON: the job's bandwidth in MB/s
  python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; d=j[sys.argv[1]]; print("%.0f %.0f" % (d["bw_bytes"]/1e6, d["iops"]))' "$1"
}
if [ -z "$probe" ]; then
  tool=fio
  fio_w=$(fio --name=seqwrite --directory="$work" --rw=write --bs=8m --size="$bytes" \
    --ioengine=io_uring --direct=1 --iodepth=8 --output-format=json | rate write)
  fio_r=$(fio --name=seqwrite --directory="$work" --rw=randread --bs="$read_bytes" --size="$bytes" \
    --ioengine=io_uring --direct=1 --iodepth="$depth" --output-format=json | rate read)
else
  tool=disk_probe
  p=$("$probe" "$work" --bytes "$bytes" --write-bs 8m --write-depth 8 --read-bs "$read_bytes" \
    --read-depth "$depth")
  fio_w="$(sed -n 's/.*write_MBps=\([0-9]*\).*/\1/p' <<<"$p") 0"
  fio_r="$(sed -n 's/.*read_MBps=\([0-9]*\).*/\1/p' <<<"$p") $(sed -n 's/.*read_iops=\([0-9]*\).*/\1/p' <<<"$p")"
fi
rm -rf "${work:?}"/*
# shellcheck disable=SC2086 # words: bench_disk's options
out=$("$bench" "$work" --block "$block" --bytes "$bytes" --depth "$depth" ${BENCH_DISK_ARGS:-})
echo "$out"
spill=$(sed -n 's/.*spill_MBps=\([0-9]*\).*/\1/p' <<<"$out")
load=$(sed -n 's/.*load_MBps=\([0-9]*\).*/\1/p' <<<"$out")
set -- $fio_w
echo "$tool sequential write (8 MiB, depth 8): ${1} MB/s"
w=$1
set -- $fio_r
echo "$tool random read ($read_bytes B, depth $depth): ${1} MB/s, ${2} IOPS"
r=$1
python3 -c "import sys; s,l,w,r=map(float,sys.argv[1:5]); print('spill / %s write: %.0f%%   load / %s read: %.0f%%' % (sys.argv[5], 100*s/w, sys.argv[5], 100*l/r))" "$spill" "$load" "$w" "$r" "$tool"

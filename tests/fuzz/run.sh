#!/usr/bin/env bash
# Build the libFuzzer target (clang, -DKVD_FUZZ=ON: ASan + UBSan + coverage)
# in its own tree and fuzz the daemon's decode and dispatch path for a
# bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [frames|serial|cluster|cluster-msgs]
#       (default 60 s of frames; $KVD_FUZZ_DIR, default build-fuzz)
#
# serial: fuzz_frames as a client that waits for each reply before its
# next request (KVD_FUZZ_SERIAL=1), so sessions reach what their earlier
# requests made: saved chains, and chains named in a key area the harness
# fills with the input; its corpus grows in $KVD_FUZZ_DIR/corpus-serial.
#
# cluster: fuzz_cluster instead, the cluster's front door (framing before
# and after the proof, decoding, the check of peers' UCX addresses); its
# corpus grows in $KVD_FUZZ_DIR/corpus-cluster.
# cluster-msgs: fuzz_cluster_msgs, the messages a peer that knows the
# secret sends after the proof, read by a whole daemon (serving, pulls,
# lanes); seeded from its own seeds, its corpus grows in
# $KVD_FUZZ_DIR/corpus-cluster-msgs.
#
# The corpus grows in $KVD_FUZZ_DIR/corpus (seeded from the generated
# seeds); a crash leaves crash-* in $KVD_FUZZ_DIR/artifacts and fails the
# script.  One worker (CI has two cores, and other tests beside it).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
target=${2:-frames}
dir=${KVD_FUZZ_DIR:-build-fuzz}

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: clang not found (deploy/setup.sh installs it)" >&2
  exit 1
fi
CC=clang cmake -S . -B "$dir" -DKVD_FUZZ=ON -DKVD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if [ "$target" = cluster ]; then
  cmake --build "$dir" -j "$(nproc)" --target fuzz_cluster
  mkdir -p "$dir/corpus-cluster" "$dir/artifacts"
  rc=0
  "$dir/tests/fuzz/fuzz_cluster" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    "$dir/corpus-cluster" >"$dir/fuzz-cluster.log" 2>&1 || rc=$?
  grep -E '^stat::|^#[0-9]+.*DONE|ERROR|SUMMARY' "$dir/fuzz-cluster.log" | tail -n 20 || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: fuzz_cluster failed (exit $rc); see $dir/fuzz-cluster.log and $dir/artifacts/" >&2
    tail -n 60 "$dir/fuzz-cluster.log" >&2
    exit "$rc"
  fi
  echo "fuzz: fuzz_cluster ${secs}s, no crash"
  exit 0
elif [ "$target" = cluster-msgs ]; then
  cmake --build "$dir" -j "$(nproc)" --target fuzz_cluster_msgs fuzz_cluster_msgs_seeds
  mkdir -p "$dir/corpus-cluster-msgs" "$dir/artifacts"
  rc=0
  "$dir/tests/fuzz/fuzz_cluster_msgs" -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    "$dir/corpus-cluster-msgs" "$dir/tests/fuzz/seeds-cluster-msgs" \
    >"$dir/fuzz-cluster-msgs.log" 2>&1 || rc=$?
  grep -E '^stat::|^#[0-9]+.*DONE|ERROR|SUMMARY' "$dir/fuzz-cluster-msgs.log" | tail -n 20 || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: fuzz_cluster_msgs failed (exit $rc); see $dir/fuzz-cluster-msgs.log and $dir/artifacts/" >&2
    tail -n 60 "$dir/fuzz-cluster-msgs.log" >&2
    exit "$rc"
  fi
  echo "fuzz: fuzz_cluster_msgs ${secs}s, no crash"
  exit 0
elif [ "$target" != frames ] && [ "$target" != serial ]; then
  echo "fuzz: no target '$target' (frames, serial, cluster or cluster-msgs)" >&2
  exit 2
fi
cmake --build "$dir" -j "$(nproc)" --target fuzz_frames

bin=$dir/tests/fuzz/fuzz_frames
mkdir -p "$dir/corpus" "$dir/artifacts"
# Every seed (the regression inputs among them) once; the valid sessions
# (all but err-*) again, each request to get one reply and that reply OK;
# then fuzz.
"$bin" -runs=0 -malloc_limit_mb=4 "$dir/tests/fuzz/seeds" 2>&1 | tail -n 2
mapfile -t valid < <(find "$dir/tests/fuzz/seeds" -type f ! -name 'err-*' ! -name '.*' | sort)
if ! KVD_FUZZ_EXPECT_OK=1 "$bin" -runs=1 "${valid[@]}" >"$dir/valid-seeds.log" 2>&1; then
  echo "fuzz: a valid seed session did not get one OK reply per request:" >&2
  tail -n 20 "$dir/valid-seeds.log" >&2
  exit 1
fi
echo "fuzz: ${#valid[@]} valid seed sessions, every request answered OK"
# -rss_limit_mb: pools are capped at 64 MiB in the target; ASan's shadow
# and the corpus stay well under 2 GiB.
# -malloc_limit_mb: no single allocation past 4 MiB (decoding is measured
# from the wire first, and its arena is mapped, not malloc'd).
rc=0
corpus=$dir/corpus
if [ "$target" = serial ]; then
  export KVD_FUZZ_SERIAL=1
  corpus=$dir/corpus-serial
  mkdir -p "$corpus"
fi
"$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=4 -max_len=65536 \
  -print_final_stats=1 \
  -artifact_prefix="$dir/artifacts/" "$corpus" "$dir/tests/fuzz/seeds" \
  >"$dir/fuzz.log" 2>&1 || rc=$?
grep -E '^stat::|^#[0-9]+.*DONE|ERROR|SUMMARY' "$dir/fuzz.log" | tail -n 20 || true
if [ "$rc" -ne 0 ]; then
  echo "fuzz: the target failed (exit $rc); see $dir/fuzz.log and $dir/artifacts/" >&2
  tail -n 60 "$dir/fuzz.log" >&2
  exit "$rc"
fi
echo "fuzz: ${secs}s ($target), no crash"

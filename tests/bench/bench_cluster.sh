#!/usr/bin/env bash
# The cluster's benchmark on one machine, from the repository root:
#
#   tests/bench/bench_cluster.sh [BUILD_DIR] [bench_cluster options...]
#
# Starts two kvdockd (cpu backend; BACKEND=cuda for the GPU machine) in one
# cluster on the loopback, runs bench_cluster against them (a load of
# 1,024 blocks of 1 MiB pulled from A through B, a 1,000-key lookup that
# misses on B), then ucx_perftest's active-message bandwidth with the same
# message size over the same transport (UCX_TLS, default tcp), and prints
# the ratio.  Figures go to $OUT/cluster.json (OUT defaults to /tmp).
# Memory: about 3 GiB at the defaults (each daemon's budget is 3 GiB).
set -euo pipefail

BUILD=${1:-build}
[ $# -gt 0 ] && shift
BACKEND=${BACKEND:-cpu}
OUT=${OUT:-/tmp}
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_WARN_UNUSED_ENV_VARS=n

tmp=$(mktemp -d /tmp/kvdock-bench-cluster.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

head -c 32 /dev/urandom | base64 > "$tmp/secret"
chmod 600 "$tmp/secret"
pa=$(free_port)
pb=$(free_port)
peers="127.0.0.1:$pa,127.0.0.1:$pb"
for n in a b; do
    port=$pa
    [ "$n" = b ] && port=$pb
    "$BUILD/daemon/kvdockd" --backend "$BACKEND" --socket "$tmp/$n.sock" \
        --host-memory-budget 3G --cluster-listen "127.0.0.1:$port" --cluster-peers "$peers" \
        --cluster-secret-file "$tmp/secret" --log-level warn 2> "$tmp/$n.log" &
    pids+=($!)
done
for _ in $(seq 200); do
    [ -S "$tmp/a.sock" ] && [ -S "$tmp/b.sock" ] && break
    sleep 0.05
done
sleep 1 # the daemons find each other

echo "== bench_cluster (UCX_TLS=$UCX_TLS, backend $BACKEND)"
"$BUILD/tests/bench/bench_cluster" --socket-a "$tmp/a.sock" --socket-b "$tmp/b.sock" "$@" \
    --json > "$tmp/kvdock.json"
python3 -m json.tool "$tmp/kvdock.json"

echo "== ucx_perftest -t ucp_am_bw, 1 MiB messages, the same transport"
pp=$(free_port)
ucx_perftest -p "$pp" > "$tmp/perf-server.log" 2>&1 &
pids+=($!)
sleep 1
ucx_perftest 127.0.0.1 -p "$pp" -t ucp_am_bw -s 1048576 -n 2000 -w 200 \
    > "$tmp/perf.log" 2>&1 || { cat "$tmp/perf.log"; exit 1; }
cat "$tmp/perf.log"

python3 - "$tmp/kvdock.json" "$tmp/perf.log" "$OUT/cluster.json" <<'EOF'
import json, sys
k = json.load(open(sys.argv[1]))
# ucx_perftest's final line: ... bandwidth (MB/s) average and overall, then
# message rate: the "overall" bandwidth column, MB/s of 2^20 bytes
rows = [l.split() for l in open(sys.argv[2]) if l.strip().startswith("Final:")]
if not rows:
    raise SystemExit("no Final: line in ucx_perftest's output")
mbs = float(rows[-1][-3])  # bandwidth overall (MB/s)
perf_gbps = mbs * 2**20 / 1e9
k["ucx_perftest_am_bw_gbps"] = perf_gbps
k["load_over_perftest"] = k["load_gbps"] / perf_gbps
k["lookup_bound_us"] = 3 * k["lookup_local_p50_us"] + k["rtt_us"]
json.dump(k, open(sys.argv[3], "w"), indent=1)
print(f"kvdock pull-and-load {k['load_gbps']:.2f} GB/s, ucx_perftest am_bw {perf_gbps:.2f} GB/s:"
      f" {k['load_over_perftest']:.2f} of it (target >= 0.8)")
print(f"lookup that misses locally p50 {k['lookup_remote_p50_us']:.1f} us, bound 3 x "
      f"{k['lookup_local_p50_us']:.1f} + {k['rtt_us']} = {k['lookup_bound_us']:.1f} us")
EOF

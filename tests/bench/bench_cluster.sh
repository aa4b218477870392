#!/usr/bin/env bash
# The cluster's benchmark on one machine, from the repository root:
#
#   tests/bench/bench_cluster.sh [BUILD_DIR] [bench_cluster options...]
#
# Starts two kvdockd (cpu backend; BACKEND=cuda for the GPU machine; LANES
# sets their --cluster-lanes) in one cluster on the loopback; then ROUNDS (5) rounds of bench_cluster against
# them (a load of 1,024 blocks of 1 MiB pulled from A through B, a
# 1,000-key lookup that misses on B), each followed by ucx_perftest's
# active-message bandwidth with the same message size and count over the
# same transport (UCX_TLS, default tcp), so that a noisy machine weighs on
# both alike; prints the medians and the ratios.  ucx_perftest sends one
# buffer again and again, so at 1 MiB its bytes stay in the CPU's caches
# while the load moves a GiB of distinct memory; a second perftest run
# moves 1 GiB as 256 MiB messages, memory that does not fit there, and
# the load is set against that too.  Figures go to $OUT/cluster.json
# (OUT defaults to /tmp).
# ucx_perftest: $UCX_PERFTEST, else BUILD_DIR/ucx/bin/ucx_perftest with
# its libraries beside it (slim_build.sh carries them to a machine
# without UCX), else the one on PATH.
# Memory: about 3.5 GiB at the defaults (each daemon's budget is 3 GiB, the
# second perftest run holds 256 MiB a side).
set -euo pipefail

BUILD=${1:-build}
[ $# -gt 0 ] && shift
BACKEND=${BACKEND:-cpu}
LANES=${LANES:-0}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-/tmp}
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_WARN_UNUSED_ENV_VARS=n
perftest=${UCX_PERFTEST:-}
if [ -z "$perftest" ] && [ -x "$BUILD/ucx/bin/ucx_perftest" ]; then
    perftest=$BUILD/ucx/bin/ucx_perftest
    export LD_LIBRARY_PATH="$BUILD/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
perftest=${perftest:-ucx_perftest}

tmp=$(mktemp -d /tmp/kvdock-bench-cluster.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# a free port below the ephemeral range (one the kernel gives outgoing
# connections could be taken again before a daemon listens on it)
free_port() {
    python3 -c '
import random, socket
while True:
    p = random.randrange(20000, 32000)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
        print(p)
        break
    except OSError:
        pass
    finally:
        s.close()'
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
        --cluster-secret-file "$tmp/secret" --cluster-lanes "$LANES" --log-level warn \
        2> "$tmp/$n.log" &
    pids+=($!)
done
for _ in $(seq 200); do
    [ -S "$tmp/a.sock" ] && [ -S "$tmp/b.sock" ] && break
    sleep 0.05
done
sleep 1 # the daemons find each other

echo "== $ROUNDS rounds: bench_cluster, then ucx_perftest -t ucp_am_bw (1,024 x 1 MiB, 4 x 256 MiB);" \
    "UCX_TLS=$UCX_TLS, backend $BACKEND, lanes $LANES (0: by the CPUs)"
for _ in $(seq "$ROUNDS"); do
    "$BUILD/tests/bench/bench_cluster" --socket-a "$tmp/a.sock" --socket-b "$tmp/b.sock" \
        --iterations 3 "$@" --json >> "$tmp/kvdock.jsonl"
    tail -n 1 "$tmp/kvdock.jsonl"
    pp=$(free_port)
    "$perftest" -p "$pp" > "$tmp/perf-server.log" 2>&1 & # serves one run
    pids+=($!)
    sleep 0.5
    "$perftest" 127.0.0.1 -p "$pp" -t ucp_am_bw -s 1048576 -n 1024 -w 64 \
        > "$tmp/perf.log" 2>&1 || { cat "$tmp/perf.log"; exit 1; }
    grep '^Final:' "$tmp/perf.log" | tee -a "$tmp/perf.final"
    pp=$(free_port)
    "$perftest" -p "$pp" > "$tmp/perf-server.log" 2>&1 &
    pids+=($!)
    sleep 0.5
    "$perftest" 127.0.0.1 -p "$pp" -t ucp_am_bw -s 268435456 -n 4 -w 1 \
        > "$tmp/perf.log" 2>&1 || { cat "$tmp/perf.log"; exit 1; }
    grep '^Final:' "$tmp/perf.log" | tee -a "$tmp/perf-big.final"
done

python3 - "$tmp/kvdock.jsonl" "$tmp/perf.final" "$OUT/cluster.json" "$tmp/perf-big.final" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
# ucx_perftest's Final line ends: bandwidth (MB/s) average, overall, then
# message rate average, overall; MB of 2^20 bytes
perf = [float(l.split()[-3]) * 2**20 / 1e9 for l in open(sys.argv[2])]
big = [float(l.split()[-3]) * 2**20 / 1e9 for l in open(sys.argv[4])]
# medians of the figures; the rest (the pool's kind) as the first round says
k = {key: statistics.median(r[key] for r in runs) if isinstance(v, (int, float)) else v
     for key, v in runs[0].items()}
k["rounds"] = len(runs)
k["load_runs_gbps"] = [r["load_gbps"] for r in runs]
k["ucx_perftest_runs_gbps"] = perf
k["ucx_perftest_am_bw_gbps"] = p = statistics.median(perf)
k["load_over_perftest"] = k["load_gbps"] / p
# each round's load against the perftest run right after it: the machine's
# slow and fast spells fall on both
k["paired_ratio"] = statistics.median(r["load_gbps"] / q for r, q in zip(runs, perf))
# the pull alone: the load's time less that of the same load from B's tier
k["pull_gbps"] = 1 / (1 / k["load_gbps"] - 1 / k["local_load_gbps"])
k["pull_over_perftest"] = k["pull_gbps"] / p
k["lookup_bound_us"] = 3 * k["lookup_local_p50_us"] + k["rtt_us"]
k["ucx_perftest_256m_runs_gbps"] = big
k["ucx_perftest_256m_gbps"] = q = statistics.median(big)
k["load_over_perftest_256m"] = k["load_gbps"] / q
json.dump(k, open(sys.argv[3], "w"), indent=1)
print(f"medians of {len(runs)} rounds: kvdock pull-and-load {k['load_gbps']:.2f} GB/s, "
      f"ucx_perftest am_bw {p:.2f} GB/s: {k['load_over_perftest']:.2f} of it (target >= 0.8);"
      f" the pull alone {k['pull_gbps']:.2f} GB/s, {k['pull_over_perftest']:.2f} of it;"
      f" round by round, the median ratio {k['paired_ratio']:.2f}")
print(f"ucx_perftest moving the GiB as 256 MiB messages (not one cached MiB): {q:.2f} GB/s;"
      f" the load is {k['load_over_perftest_256m']:.2f} of it")
print(f"lookup that misses locally p50 {k['lookup_remote_p50_us']:.1f} us, bound 3 x "
      f"{k['lookup_local_p50_us']:.1f} + {k['rtt_us']:.0f} = {k['lookup_bound_us']:.1f} us")
PY

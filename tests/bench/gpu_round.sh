#!/usr/bin/env bash
# One round on the GPU machine, run from the repository root:
#
#   tests/bench/gpu_round.sh [BUILD_DIR] [STAGE...]
#
# BUILD_DIR (default build-gpu) was configured and built on the CPU machine
# (cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build
# build-gpu) and carried over, whole or as a copy without object files
# (tests/bench/slim_build.sh build-gpu .carry/bg, then BUILD_DIR .carry/bg)
# or that copy packed (slim_build.sh build-gpu .carry/bg.tgz, then BUILD_DIR
# .carry/bg.tgz: unpacked into .carry/bg first); nothing is built here.
# Stages, in order:
#
#   info      nvidia-smi -L, driver and CUDA versions, torch and triton, the
#             GPU's uuid, clocks and power limit, the host's kernel and CPU
#   test      ctest -L gpu: every GPU suite (kernels against the CPU
#             reference, the cuda daemon, IPC workers, the Python worker)
#   memcheck  each GPU test binary once under compute-sanitizer memcheck,
#             following the processes it starts, with KVD_TEST_QUICK=1
#             (smaller counts); fails the stage without compute-sanitizer
#   bench     tests/bench/bench_kernels.py: kvdock against the seed,
#             rows in $OUT/kvdock_vs_seed.json
#   daemonbench  tests/bench/bench_daemon.sh: `kvdock bench` and bench_paths
#             through a cuda daemon, figures in $OUT/bench_daemon.json and
#             $OUT/bench_paths.json
#   chunks    the copy engines' ceiling per chunk size (dma_chunks.cu from
#             $TOOLS, default .carry/tools: a copy of shared/tools) beside
#             the daemon's copy-engine path (bench_paths --case chunks)
#   interference  tests/bench/bench_interference.py: a worker's decode and
#             prefill steps beside the daemon's movement, each path (the
#             cache tier's saves and loads among them)
#   cetable   tests/bench/bench_interference.py --table chunks --probes: the
#             daemon's copy-engine rate per chunk size, direction and cache
#             layout as a fraction of the copy engines' own (bench_ce),
#             alone and beside a decode step, and the step's slowdown
#   cache     tests/bench/bench_cache: the cache tier's lookups, save and
#             load rates, both at once, layer-wise load, against the same
#             copies in-process; figures in $OUT/cache.json
#   engine    tests/bench/bench_engine.py: a transformers Llama's prefix
#             reused across worker processes through kvdock.Connector
#             (logits against a recompute, time to first token, a decode
#             step beside saves); figures in $OUT/engine.json
#   cluster   tests/bench/bench_cluster.sh: two cuda daemons of one cluster
#             (UCX over TCP on the loopback), 1,024 blocks of 1 MiB pulled
#             from A into a device pool through B, beside ucx_perftest
#             (carried in the build by slim_build.sh); $OUT/cluster.json
#   reqpath   tests/bench/bench_reqpath.sh: the request path with 1, 8 and
#             64 clients beside a raw Unix socket, on the daemon's defaults
#             and with polling off (--busy-poll-us 0, KVDOCK_SPIN_US=0),
#             each row with the loop thread's CPU per request;
#             $OUT/reqpath.log
#   disklevel the cache tier's disk level: the drive's own sequential write
#             and random read (disk_probe: io_uring, O_DIRECT, fio's two
#             jobs of bench_disk.sh, for a machine without fio) on a
#             directory of $DISK_DIR (default /var/tmp), before and after
#             the daemon (the yardstick: their mean); the daemon, a cuda one
#             with --cache-dir there: 1,024 blocks of 2 MiB spilled and
#             loaded from disk into an imported device pool
#             (bench_disk_load), beside the host-to-device copy of the same
#             bytes; $OUT/disklevel.json (DISKLEVEL_BACKEND=cpu
#             DISKLEVEL_POOL=host DISKLEVEL_BLOCKS=64 DISKLEVEL_BYTES=256m
#             run these on a machine without a GPU, smaller);
#             then a worker's decode step beside a spill at full rate
#             (bench_interference.py --conditions disk --disk-dir)
#
# Pick stages as arguments after BUILD_DIR or with STAGES="test bench"
# (default: all thirteen).  Each stage's output is tee'd to
# $OUT/<stage>.log (OUT defaults to /tmp/kvdock-gpu-round); a summary with
# every stage's exit code ends the run, and the script exits non-zero when
# any stage failed.  Per-stage time limits (seconds): TEST_TIMEOUT (420),
# MEMCHECK_TIMEOUT (480), BENCH_TIMEOUT (540).  The bench needs the seed at
# .peer (a copy of shared/peer) unless PEER names another folder.
# The stage functions are called through run_stage.
# shellcheck disable=SC2317
set -u

BUILD=build-gpu
if [ $# -gt 0 ]; then
    case "$1" in
    info | test | memcheck | bench | daemonbench | chunks | interference | cetable | cache | engine | cluster | reqpath | disklevel) ;;
    *) BUILD=$1; shift ;;
    esac
fi
if [ $# -gt 0 ]; then
    STAGES="$*"
fi
STAGES=${STAGES:-"info test memcheck bench daemonbench chunks interference cetable cache engine cluster reqpath disklevel"}
OUT=${OUT:-/tmp/kvdock-gpu-round}
PEER=${PEER:-.peer}
TOOLS=${TOOLS:-.carry/tools}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}
MEMCHECK_TIMEOUT=${MEMCHECK_TIMEOUT:-480}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-540}
export OUT
mkdir -p "$OUT"

if [ ! -f CMakeLists.txt ] || [ ! -d kernels ]; then
    echo "gpu_round: run this from the repository root" >&2
    exit 2
fi
if [ "${BUILD%.tgz}" != "$BUILD" ] && [ -f "$BUILD" ]; then # packed by slim_build.sh
    packed=$BUILD
    BUILD=${BUILD%.tgz}
    if ! { rm -rf "$BUILD" && mkdir -p "$BUILD" && tar xzf "$packed" -C "$BUILD"; }; then
        echo "gpu_round: cannot unpack $packed into $BUILD" >&2
        exit 2
    fi
    echo "gpu_round: unpacked $packed into $BUILD"
fi
if [ ! -d "$BUILD" ]; then
    echo "gpu_round: no build folder $BUILD (build it on the CPU machine and carry it)" >&2
    exit 2
fi

# ctest files and the tests' compiled-in paths name the folder the build was
# configured in on the CPU machine: make that path lead here.
src_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -n "$src_dir" ] && [ "$src_dir" != "$PWD" ] && [ ! -e "$src_dir" ]; then
    mkdir -p "$(dirname "$src_dir")" && ln -s "$PWD" "$src_dir" &&
        echo "gpu_round: linked $src_dir -> $PWD (the build's source folder)"
fi
# A copy made by slim_build.sh (e.g. .carry/bg) still names the original
# build folder: link that name to the copy.
bin_dir=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -n "$src_dir" ] && [ -n "$bin_dir" ] && [ "${bin_dir#"$src_dir"/}" != "$bin_dir" ]; then
    rel=${bin_dir#"$src_dir"/}
    if [ ! -e "$rel" ] && [ "$rel" != "$BUILD" ]; then
        ln -s "$BUILD" "$rel" && echo "gpu_round: linked $rel -> $BUILD (where the build was made)"
    fi
fi

declare -a NAMES=() CODES=() SECS=()

# run_stage NAME COMMAND...: runs the command, output tee'd to $OUT/NAME.log.
run_stage() {
    local name=$1
    shift
    local log="$OUT/$name.log" t0=$SECONDS
    echo
    echo "=== $name: $* ($(date -u +%H:%M:%S) UTC)" | tee "$log"
    "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$log"
    NAMES+=("$name")
    CODES+=("$rc")
    SECS+=("$((SECONDS - t0))")
}

stage_info() {
    nvidia-smi -L || return 1
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    nvidia-smi | sed -n 's/.*\(Driver Version:.*CUDA Version: *[0-9.]*\).*/\1/p'
    # which machine this is: small-case times differ between machines of one kind
    nvidia-smi --query-gpu=uuid,vbios_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,power.limit,temperature.gpu,pcie.link.gen.current \
        --format=csv
    echo "host: $(uname -r), $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | sort | uniq -c | head -n 2 | tr -s ' ')"
    if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; fi
    cmake --version | head -n 1
    python3 -c 'import torch, triton; print("torch", torch.__version__, "CUDA", torch.version.cuda, "| triton", triton.__version__)' ||
        echo "(torch/triton not importable)"
    echo "build: $BUILD ($(grep -m1 CMAKE_BUILD_TYPE: "$BUILD/CMakeCache.txt" 2>/dev/null))"
    return 0
}

# The GPU tests that a build with CUDA registers: each must be there, run
# and pass.  On the GPU machine nothing may skip, a whole test or one case
# ("SKIP:" lines, tests/CMakeLists.txt): a skip means the GPU or a part of
# it was not usable (check_kernels_cuda skips a case only when the GPU has
# too little free memory for it, and fails when an allocation fails with
# the memory free).
GPU_TESTS="check_kernels_cuda check_daemon_gpu check_gpu_ipc python_gpu"
stage_test() {
    local tmp="$OUT/.ctest.out" rc=0 py t listed
    # the Python GPU suite needs the interpreter that has PyTorch here,
    # not the one the build found on the CPU machine
    py=$(command -v python3)
    if [ -z "${KVDOCK_TEST_PYTHON:-}" ] && [ -n "$py" ] && "$py" -c 'import torch' 2>/dev/null; then
        export KVDOCK_TEST_PYTHON=$py
        echo "gpu_round: Python suites run under $py (it imports torch)"
    fi
    listed=$(ctest --test-dir "$BUILD" -N -L gpu 2>&1)
    for t in $GPU_TESTS; do
        if ! grep -Eq "Test +#[0-9]+: $t\$" <<<"$listed"; then
            echo "gpu_round: $t is not registered in $BUILD (configured without CUDA, or without the Python client?): failing the stage"
            rc=1
        fi
    done
    rm -f "$OUT/gpu.xml" "$OUT/python_gpu.xml"
    # the Python suite last and verbose: ctest shows a test's output only
    # once it ends, and the stage's time limit may end it first
    timeout --kill-after=15 "$TEST_TIMEOUT" bash -c '
        ctest --test-dir "$1" -L gpu -E python_gpu --output-on-failure --timeout "$2" \
            --output-junit "$3/gpu.xml" --test-output-size-passed 1048576 || rc=1
        if ctest --test-dir "$1" -N -R python_gpu | grep -q "Total Tests: [1-9]"; then
            ctest --test-dir "$1" -R python_gpu -V --timeout "$2" \
                --output-junit "$3/python_gpu.xml" --test-output-size-passed 1048576 || rc=1
        fi
        exit "${rc:-0}"' _ "$BUILD" "$TEST_TIMEOUT" "$OUT" 2>&1 | tee "$tmp"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    if grep -q "No tests were found" "$tmp"; then
        echo "gpu_round: no tests labelled gpu in $BUILD (configured without CUDA?)"
        rc=1
    fi
    # every skip, of a test or of a case, named with its reason
    python3 tests/ctest_summary.py --prefix "gpu_round: " gpu="$OUT/gpu.xml" \
        python_gpu="$OUT/python_gpu.xml" |
        tee "$tmp"
    if grep -q "failed: \|no ctest results" "$tmp"; then
        rc=1
    fi
    if grep -q ": skipped: \|: case skipped in a passing test: " "$tmp"; then
        echo "gpu_round: GPU tests or cases were SKIPPED (listed above): failing the stage"
        rc=1
    fi
    rm -f "$tmp"
    return "$rc"
}

find_sanitizer() {
    if command -v compute-sanitizer >/dev/null; then
        command -v compute-sanitizer
        return 0
    fi
    local d
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/*/compute-sanitizer; do
        if [ -x "$d/compute-sanitizer" ]; then
            echo "$d/compute-sanitizer"
            return 0
        fi
    done
    return 1
}

# Every GPU suite once under memcheck, following the daemons and workers the
# tests start (--target-processes all).
stage_memcheck() {
    local san bin rc=0 one
    if ! san=$(find_sanitizer); then
        echo "gpu_round: compute-sanitizer not found (PATH, /usr/local/cuda*/bin): failing the stage"
        return 1
    fi
    "$san" --version | head -n 2
    for bin in tests/kernels/check_kernels_cuda tests/daemon/check_daemon_gpu tests/client/check_gpu_ipc; do
        if [ ! -x "$BUILD/$bin" ]; then
            echo "no test binary $BUILD/$bin"
            rc=1
            continue
        fi
        echo "--- memcheck $bin"
        # KVD_TEST_NO_GATE: streams are not held during launches, in case the
        # tool serialises them; asynchrony is checked by the plain test stage.
        KVD_TEST_QUICK=1 KVD_TEST_NO_GATE=1 timeout --kill-after=15 "$MEMCHECK_TIMEOUT" \
            "$san" --tool memcheck --target-processes all --error-exitcode 86 --print-limit 100 \
            "$BUILD/$bin"
        one=$?
        case $one in
        0) ;;
        77) echo "gpu_round: $bin skipped itself (no usable GPU): failing the stage"; rc=1 ;;
        86) echo "gpu_round: compute-sanitizer reported memory errors in $bin"; rc=1 ;;
        *) echo "gpu_round: $bin exited $one under memcheck"; rc=1 ;;
        esac
    done
    return "$rc"
}

stage_bench() {
    local lib="$BUILD/kernels/libkvdock_kernels.so"
    if [ ! -f "$lib" ]; then
        echo "no library $lib"
        return 1
    fi
    PYTHONUNBUFFERED=1 timeout --kill-after=15 "$BENCH_TIMEOUT" \
        python3 tests/bench/bench_kernels.py --lib "$lib" --peer "$PEER"
}

# The daemon benchmark: kvdock bench and bench_paths through a fresh cuda
# daemon on its defaults.
stage_daemonbench() {
    local rc=0
    timeout --kill-after=15 "$BENCH_TIMEOUT" \
        tests/bench/bench_daemon.sh "$BUILD/daemon/kvdockd" --kvdock "$BUILD/client/kvdock" \
        --bench-paths "$BUILD/tests/bench/bench_paths" --backend cuda --out "$OUT" || rc=1
    cat "$OUT/bench_daemon.json" "$OUT/bench_paths.json" 2>/dev/null
    return "$rc"
}

# The copy engines' ceiling per chunk size (shared/tools/dma_chunks.cu,
# copied to $TOOLS) beside the daemon's copy-engine path at the same sizes
# (bench_paths --case chunks).
stage_chunks() {
    local rc=0 src="$TOOLS/dma_chunks.cu"
    if [ -f "$src" ] && command -v nvcc >/dev/null; then
        nvcc -O2 -arch=sm_90 -std=c++17 -o "$OUT/dma_chunks" "$src" &&
            timeout --kill-after=15 "$BENCH_TIMEOUT" "$OUT/dma_chunks" | tee "$OUT/dma_chunks.txt" || rc=1
    else
        echo "no yardstick: $src or nvcc missing"
    fi
    local dir sock pid
    dir=$(mktemp -d /tmp/kvdock-chunks-XXXXXX)
    sock="$dir/kvdockd.sock"
    "$BUILD/daemon/kvdockd" --backend cuda --socket "$sock" --log-level info >"$OUT/chunks-kvdockd.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
    timeout --kill-after=15 "$BENCH_TIMEOUT" "$BUILD/tests/bench/bench_paths" --socket "$sock" \
        --case chunks || rc=1
    timeout --kill-after=15 "$BENCH_TIMEOUT" "$BUILD/tests/bench/bench_paths" --socket "$sock" \
        --case chunks --json >"$OUT/chunks.json" || rc=1
    kill "$pid"; wait "$pid"
    rm -rf "$dir"
    return "$rc"
}

# A worker's forward pass beside the daemon's movement, each path
# (bench_interference.py; MPS too where it starts).
stage_interference() {
    PYTHONUNBUFFERED=1 timeout --kill-after=15 "$BENCH_TIMEOUT" \
        python3 tests/bench/bench_interference.py --build "$BUILD" --mps
}

# The daemon's copy-engine path against the copy engines' own rate, alone
# and beside a decode step (bench_interference.py --table chunks).
# CETABLE_ARGS: more arguments, split into words.
# shellcheck disable=SC2086
stage_cetable() {
    PYTHONUNBUFFERED=1 timeout --kill-after=15 "$BENCH_TIMEOUT" \
        python3 tests/bench/bench_interference.py --build "$BUILD" --table chunks --probes \
        ${CETABLE_ARGS:-}
}

# The cache tier through a fresh cuda daemon (a host-memory budget that
# holds the benchmark's two sets of 1,024 blocks of 2 MiB).
stage_cache() {
    local rc=0 dir sock pid
    dir=$(mktemp -d /tmp/kvdock-cache-XXXXXX)
    sock="$dir/kvdockd.sock"
    "$BUILD/daemon/kvdockd" --backend cuda --socket "$sock" --log-level warn \
        --host-memory-budget 16G >"$OUT/cache-kvdockd.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
    timeout --kill-after=15 "$BENCH_TIMEOUT" "$BUILD/tests/bench/bench_cache" --socket "$sock" \
        --json >"$OUT/cache.json" || rc=1
    cat "$OUT/cache.json"
    kill "$pid"; wait "$pid"
    rm -rf "$dir"
    return "$rc"
}

# A transformers Llama's prefix reused across worker processes
# (bench_engine.py starts its own daemon).
stage_engine() {
    PYTHONUNBUFFERED=1 timeout --kill-after=15 "$BENCH_TIMEOUT" \
        python3 tests/bench/bench_engine.py --build "$BUILD"
}

# Two cuda daemons of one cluster: the pull into a worker's device pool
# against ucx_perftest on the same transport.
stage_cluster() {
    BACKEND=cuda timeout --kill-after=15 "$BENCH_TIMEOUT" \
        tests/bench/bench_cluster.sh "$BUILD" --pool device
}

# The request path (a cpu daemon: the same path on every backend), on the
# defaults and with polling off, beside a raw Unix socket in each run.
stage_reqpath() {
    local rc=0
    echo "--- defaults"
    timeout --kill-after=15 "$BENCH_TIMEOUT" tests/bench/bench_reqpath.sh "$BUILD" -- \
        --rounds 3 || rc=1
    echo "--- polling off"
    KVDOCKD_ARGS="--busy-poll-us 0" KVDOCK_SPIN_US=0 timeout --kill-after=15 "$BENCH_TIMEOUT" \
        tests/bench/bench_reqpath.sh "$BUILD" -- --rounds 3 || rc=1
    return "$rc"
}

# The disk level: the drive measured by disk_probe on the directory the
# daemon then uses (in the same run), and a load from disk into a worker's
# imported device pool beside the host-to-device copy of the same bytes.
stage_disklevel() {
    local rc=0 dir sock pid shape read_bs probe probe2
    dir=$(mktemp -d "${DISK_DIR:-/var/tmp}/kvdock-disklevel-XXXXXX") || return 1
    chmod 700 "$dir"
    sock="$dir/kvdockd.sock"
    echo "directory: $dir ($(df -hT "$dir" | tail -n 1 | tr -s ' '))"
    # one record's aligned read (what a disk load reads per 2 MiB block)
    mkdir "$dir/shape"
    shape=$("$BUILD/tests/bench/bench_disk" "$dir/shape" --block 2m --bytes 2m --depth 1 | head -n 1)
    read_bs=$(sed -n 's/.*read_bytes=\([0-9]*\).*/\1/p' <<<"$shape")
    rm -rf "$dir/shape"
    probe=$("$BUILD/tests/bench/disk_probe" "$dir" --bytes "${DISKLEVEL_BYTES:-2g}" \
        --read-bs "${read_bs:-2101248}" \
        --read-depth 32) || { rm -rf "$dir"; return 1; }
    echo "disk_probe: $probe"
    "$BUILD/daemon/kvdockd" --backend "${DISKLEVEL_BACKEND:-cuda}" --socket "$sock" \
        --log-level warn --host-memory-budget 16G --cache-dir "$dir/cache" --disk-budget 16G \
        >"$OUT/disklevel-kvdockd.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
    timeout --kill-after=15 "$BENCH_TIMEOUT" "$BUILD/tests/bench/bench_disk_load" --socket "$sock" \
        --pool "${DISKLEVEL_POOL:-device}" --blocks "${DISKLEVEL_BLOCKS:-1024}" --iterations 3 --json \
        >"$OUT/disklevel.json" || rc=1
    cat "$OUT/disklevel.json"
    kill "$pid"; wait "$pid"
    rm -rf "$dir/cache"
    # the drive again: its rate moves by a fifth from one minute to the
    # next, so the yardstick is the mean of the probes before and after
    probe2=$("$BUILD/tests/bench/disk_probe" "$dir" --bytes "${DISKLEVEL_BYTES:-2g}" \
        --read-bs "${read_bs:-2101248}" --read-depth 32) || rc=1
    echo "disk_probe after: $probe2"
    rm -rf "$dir"
    [ "$rc" = 0 ] || return "$rc"
    python3 - "$probe" "$probe2" "$OUT/disklevel.json" <<'PY'
import json, re, sys
probes = [dict(re.findall(r"(\w+)=([\d.]+)", a)) for a in sys.argv[1:3]]
probe = probes[0]
r = json.load(open(sys.argv[3]))
read = sum(float(p["read_MBps"]) for p in probes) / 2e3
write = sum(float(p["write_MBps"]) for p in probes) / 2e3
h2d, load = r["copy_GBps"], r["load_GBps"]
bound = min(read, h2d)  # the two overlapped
print(f"drive (mean of the probes before and after): write {write:.2f} GB/s, random read "
      f"{read:.2f} GB/s ({probe['read_bs']} B, depth {probe['read_depth']}); {r['copy']} copy "
      f"{h2d:.2f} GB/s")
print(f"spill {r['spill_MBps'] / 1e3:.2f} GB/s = {100 * r['spill_MBps'] / 1e3 / write:.0f}% of the "
      f"drive's write")
print(f"disk load {load:.2f} GB/s = {100 * load / bound:.0f}% of min(read, copy) = {bound:.2f} GB/s, "
      f"{100 * load / (1 / (1 / read + 1 / h2d)):.0f}% of the two in turn; "
      f"{r['disk_hits_min']} of {r['blocks']} blocks were on disk only")
PY
    # a decode step beside a spill at full rate (within 5%: issue 42)
    if [ "${DISKLEVEL_BACKEND:-cuda}" != cuda ]; then
        echo "(no decode step beside a spill: DISKLEVEL_BACKEND is not cuda)"
        return 0
    fi
    echo "--- decode step beside a spill (bench_interference.py --conditions disk)"
    mkdir -p "$OUT/disklevel-interference"
    PYTHONUNBUFFERED=1 OUT="$OUT/disklevel-interference" timeout --kill-after=15 "$BENCH_TIMEOUT" \
        python3 tests/bench/bench_interference.py --build "$BUILD" \
        --disk-dir "${DISK_DIR:-/var/tmp}" --conditions disk --rounds 3 ||
        return 1
}

for s in $STAGES; do
    case "$s" in
    info) run_stage info stage_info ;;
    test) run_stage test stage_test ;;
    memcheck) run_stage memcheck stage_memcheck ;;
    bench) run_stage bench stage_bench ;;
    daemonbench) run_stage daemonbench stage_daemonbench ;;
    chunks) run_stage chunks stage_chunks ;;
    interference) run_stage interference stage_interference ;;
    cetable) run_stage cetable stage_cetable ;;
    cache) run_stage cache stage_cache ;;
    engine) run_stage engine stage_engine ;;
    cluster) run_stage cluster stage_cluster ;;
    reqpath) run_stage reqpath stage_reqpath ;;
    disklevel) run_stage disklevel stage_disklevel ;;
    *)
        echo "gpu_round: unknown stage '$s' (info test memcheck bench daemonbench chunks interference cetable cache engine cluster reqpath disklevel)" >&2
        NAMES+=("$s")
        CODES+=(2)
        SECS+=(0)
        ;;
    esac
done

echo
echo "=== summary (logs in $OUT)" | tee "$OUT/summary.log"
fail=0
for i in "${!NAMES[@]}"; do
    rc=${CODES[$i]}
    what=ok
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        what="TIMED OUT"
    elif [ "$rc" != 0 ]; then
        what=FAILED
    elif grep -q '^SKIP:' "$OUT/${NAMES[$i]}.log" 2>/dev/null; then
        what="skipped (see its log)"
    fi
    [ "$rc" != 0 ] && fail=1
    printf '%-9s exit %-3s %5ss  %s\n' "${NAMES[$i]}" "$rc" "${SECS[$i]}" "$what" | tee -a "$OUT/summary.log"
done
exit $fail

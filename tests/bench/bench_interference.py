#!/usr/bin/env python3
"""The interference benchmark: how much a worker's forward pass slows while
kvdockd moves another worker's KV cache between device and host memory.

Three processes beside a kvdockd this script starts (--backend cuda, its
defaults otherwise):
- the compute worker times decode-like steps (batch 32, 32 layers of an
  8B-shaped MLP, bf16) and prefill-like steps (1,024 tokens, 8 layers) with
  CUDA events, back to back;
- the mover worker imports its own KV cache (32 layers, K and V, 16,384
  slots of 2 KiB: 2 GiB) into the daemon and keeps 4 all-layer transfers of
  64 MiB in flight, offload and reload in turn, between that cache and a
  daemon host pool (or only offload them: the target's condition), on the
  path the condition names: whole pages of 16 slots (32 KiB contiguous per
  layer and K/V, what a cache block is) on the copy engines or on kernels
  at a block budget, or 2 KiB rows scattered one by one on the copy
  engines; or, through the cache tier, saves of fresh blocks of 16 tokens
  (2 MiB each, 32 KiB per layer and K/V) from that cache into a kvdockd
  cache whose 4 GiB budget was filled first, and loads of blocks saved
  before, in turn;
- for the in-worker alternative to small scattered rows, the compute worker
  itself packs scattered 2 KiB rows of its own cache into a contiguous
  buffer with kvdock's kernel on a low-priority stream of its own context,
  within a block budget, while it computes.
Conditions alternate with no-movement controls between them, in rounds; a
step's slowdown is its median against the median of every control step.

Usage (GPU machine, repository root; the build carried there):
    python3 tests/bench/bench_interference.py --build .carry/bg [--rounds 2] [--mps]
Writes $OUT/interference.json (OUT defaults to /tmp) and prints a table.
With --mps the conditions run again under an MPS control daemon started
(and stopped) here, when the machine allows it.
"""
import argparse
import collections
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

LAYERS, SLOTS, ROW = 32, 16384, 2048        # the mover's cache: 2 GiB
REQ_SLOTS, PAGE, INFLIGHT = 512, 16, 4      # 64 MiB a request, 32 KiB chunks
CACHE_BUDGET = 4 << 30                      # the mover's cache tier
HIDDEN, FFN = 4096, 14336                   # an 8B-shaped MLP

# name: (mover mode, in-worker pack budget)
CONDITIONS = {
    "none": (None, 0),
    "copy_engine": ({"path": "copy_engine", "rows": "pages"}, 0),
    # the target condition: offload alone (device to host), 32 KiB chunks
    "offload": ({"path": "copy_engine", "rows": "pages", "d2h_only": True}, 0),
    "kernel_32": ({"path": "kernel", "max_blocks": 32, "rows": "pages"}, 0),
    "kernel_2": ({"path": "kernel", "max_blocks": 2, "rows": "pages"}, 0),
    "copy_engine_rows": ({"path": "copy_engine", "rows": "scattered"}, 0),
    "cache": ({"path": None, "cache": True}, 0),
    "pack_8": (None, 8),
    "pack_2": (None, 2),
}
ORDER = ["copy_engine", "offload", "cache", "kernel_32", "kernel_2", "copy_engine_rows", "pack_8",
         "pack_2"]


def compute_worker(conn, kernels_lib):
    import torch
    sys.path.insert(0, str(HERE))
    torch.manual_seed(0)
    dev = torch.device("cuda")
    dt = torch.bfloat16
    up = [torch.randn(HIDDEN, FFN, device=dev, dtype=dt) * 0.01 for _ in range(LAYERS)]
    down = [torch.randn(FFN, HIDDEN, device=dev, dtype=dt) * 0.01 for _ in range(LAYERS)]
    xd = torch.randn(32, HIDDEN, device=dev, dtype=dt)
    xp = torch.randn(1024, HIDDEN, device=dev, dtype=dt)

    def decode():
        x = xd
        for l in range(LAYERS):
            x = torch.relu(x @ up[l]) @ down[l]
        return x

    def prefill():
        x = xp
        for l in range(8):
            x = torch.relu(x @ up[l]) @ down[l]
        return x

    # the in-worker packing: scattered 2 KiB rows of a cache of this
    # process into a contiguous buffer, kvdock's kernel, a budget of blocks
    from bench_kernels import Kvd, Launch, KVD_DTYPE_I64, KvSide, TransferArgs
    kvd = Kvd(kernels_lib)
    cache = torch.empty(LAYERS * 2 * SLOTS * ROW, dtype=torch.uint8, device=dev)
    packed = torch.empty(LAYERS * 2 * 4096 * ROW, dtype=torch.uint8, device=dev)
    src_idx = torch.randperm(SLOTS, device=dev)[:4096].to(torch.int64)
    dst_idx = torch.arange(4096, device=dev, dtype=torch.int64)
    side = torch.cuda.Stream(priority=0)  # the lowest priority
    lay = 2 * SLOTS * ROW
    a = TransferArgs()
    a.src = KvSide(cache.data_ptr(), cache.data_ptr() + SLOTS * ROW, None, None, lay, ROW, SLOTS)
    a.dst = KvSide(packed.data_ptr(), packed.data_ptr() + 4096 * ROW, None, None, 2 * 4096 * ROW,
                   ROW, 4096)
    a.num_layers, a.src_idx, a.dst_idx = LAYERS, src_idx.data_ptr(), dst_idx.data_ptr()
    a.idx_dtype, a.count, a.row_bytes, a.oob_count = KVD_DTYPE_I64, 4096, ROW, None
    pack_bytes = LAYERS * 2 * 4096 * ROW

    for _ in range(5):
        decode()
        prefill()
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        _, steps_d, steps_p, pack = msg
        launch = Launch(side.cuda_stream, pack, 0) if pack else None
        packs = 0
        t_pack0 = time.time()
        out = {}
        for name, fn, n in (("decode", decode, steps_d), ("prefill", prefill, steps_p)):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            ev[0].record()
            for i in range(n):
                if launch is not None and side.query():
                    kvd.bind("kvd_cuda_kv_transfer", a, launch)()
                    packs += 1
                fn()
                ev[i + 1].record()
            torch.cuda.synchronize()
            out[name] = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
        side.synchronize()
        out["pack_gbps"] = packs * pack_bytes / (time.time() - t_pack0) / 1e9 if pack else None
        conn.send(out)


def mover_worker(conn, socket):
    import torch
    import kvdock
    dev = torch.device("cuda")
    k = [torch.randint(0, 255, (SLOTS, ROW), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
    v = [torch.randint(0, 255, (SLOTS, ROW), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
    g = torch.Generator().manual_seed(1)
    with kvdock.Client(socket, name="mover") as cli:
        gpu = cli.import_pool("mover-kv", k, v, page_size=PAGE)
        host = cli.create_pool("mover-host", LAYERS, SLOTS, ROW, kind="host")

        saved = collections.deque(maxlen=32)  # keys of saves done: 32 x 64 MiB

        def cache_request(n):
            pages = torch.randperm(SLOTS // PAGE, generator=g)[:REQ_SLOTS // PAGE].tolist()
            if n % 2 == 0 or not saved:
                keys = [os.urandom(32) for _ in pages]
                return cache.save_async(gpu, keys, blocks=pages), keys
            keys = saved[int(torch.randint(len(saved), (1,), generator=g))]
            return cache.load_async(gpu, keys, blocks=pages), None

        def indices(rows):
            if rows == "pages":
                pages = torch.randperm(SLOTS // PAGE, generator=g)[:REQ_SLOTS // PAGE]
                return (pages[:, None] * PAGE + torch.arange(PAGE)[None, :]).reshape(-1)
            return torch.randperm(SLOTS, generator=g)[:REQ_SLOTS]

        cache = cli.create_cache("mover-cache", num_layers=LAYERS, tokens_per_block=PAGE,
                                 token_bytes=ROW, budget_bytes=CACHE_BUDGET, dtype="u8")
        # fill the budget first: a fresh cache pins a slab (1 GiB) when saves
        # first reach it, which is set-up, not the steady state measured here
        warm = []
        for _ in range(CACHE_BUDGET // (REQ_SLOTS * ROW * LAYERS * 2) + INFLIGHT):
            warm.append(cache_request(0))
            if len(warm) >= INFLIGHT:
                f, keys = warm.pop(0)
                f.result()
                saved.append(keys)
        for f, keys in warm:
            f.result()
            saved.append(keys)

        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                return
            mode = msg[1]
            kw = {"path": mode["path"], "max_blocks": mode.get("max_blocks", 0)}
            futs, moved, paths, n = [], 0, set(), 0
            t0 = time.time()
            while not conn.poll():
                while len(futs) < INFLIGHT:
                    if mode.get("cache"):
                        futs.append(cache_request(n))
                    else:
                        idx = indices(mode["rows"])
                        d2h = n % 2 == 0 or mode.get("d2h_only")
                        src, dst = (gpu, host) if d2h else (host, gpu)
                        futs.append((cli.transfer_async(src, dst, idx, idx, **kw), None))
                    n += 1
                f, keys = futs.pop(0)
                r = f.result()
                if keys is not None:
                    saved.append(keys)
                moved += r.bytes
                paths.add(r.path)
            for f, _ in futs:
                moved += f.result().bytes
            secs = time.time() - t0
            conn.recv()  # the stop
            conn.send({"gbps": moved / secs / 1e9, "paths": sorted(paths), "requests": n})


def start_daemon(kvdockd, sock, env, log):
    p = subprocess.Popen([kvdockd, "--backend", "cuda", "--socket", sock, "--log-level", "warn"],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(400):
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            raise SystemExit(f"kvdockd exited: {p.returncode}")
        time.sleep(0.05)
    raise SystemExit("kvdockd did not start")


def run_conditions(args, env_extra, label):
    tmp = tempfile.mkdtemp(prefix="kvdock-interf-")
    sock = os.path.join(tmp, "kvdockd.sock")
    env = dict(os.environ, **env_extra)
    os.environ.update(env_extra)
    log = open(os.path.join(args.out, f"interference-{label}-kvdockd.log"), "w")
    daemon = start_daemon(str(Path(args.build) / "daemon" / "kvdockd"), sock, env, log)
    ctx = mp.get_context("spawn")
    cpipe, cchild = ctx.Pipe()
    mpipe, mchild = ctx.Pipe()
    klib = str(Path(args.build) / "kernels" / "libkvdock_kernels.so")
    comp = ctx.Process(target=compute_worker, args=(cchild, klib))
    mover = ctx.Process(target=mover_worker, args=(mchild, sock))
    comp.start()
    mover.start()
    assert cpipe.recv() == "ready" and mpipe.recv() == "ready"
    steps = {}
    movers = {}

    def one(name):
        mode, pack = CONDITIONS[name]
        if mode is not None:
            mpipe.send(("run", mode))
            time.sleep(0.3)
        cpipe.send(("measure", args.decode_steps, args.prefill_steps, pack))
        out = cpipe.recv()
        if mode is not None:
            mpipe.send(("stop",))
            movers.setdefault(name, []).append(mpipe.recv())
        if pack:
            movers.setdefault(name, []).append({"gbps": out["pack_gbps"], "paths": ["in-worker"]})
        s = steps.setdefault(name, {"decode": [], "prefill": []})
        s["decode"] += out["decode"]
        s["prefill"] += out["prefill"]

    # each movement alone first (nothing computes): the rates alone
    alone = {}
    for name in ("copy_engine", "offload", "cache", "kernel_32"):
        mpipe.send(("run", CONDITIONS[name][0]))
        time.sleep(1.5)
        mpipe.send(("stop",))
        alone[name] = mpipe.recv()["gbps"]
    for _ in range(args.rounds):
        one("none")
        for name in ORDER:
            one(name)
            one("none")
    cpipe.send(("quit",))
    mpipe.send(("quit",))
    comp.join()
    mover.join()
    daemon.terminate()
    daemon.wait()
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)

    base = {k: statistics.median(steps["none"][k]) for k in ("decode", "prefill")}
    rows = []
    for name in ["none"] + ORDER:
        d = statistics.median(steps[name]["decode"])
        p = statistics.median(steps[name]["prefill"])
        m = movers.get(name)
        rows.append({"condition": name, "decode_ms": d, "decode_pct": 100 * (d / base["decode"] - 1),
                     "prefill_ms": p, "prefill_pct": 100 * (p / base["prefill"] - 1),
                     "move_gbps": statistics.median([x["gbps"] for x in m]) if m else None,
                     "paths": sorted({q for x in m for q in x["paths"]}) if m else [],
                     "alone_gbps": alone.get(name)})
    return rows


def print_rows(label, rows):
    print(f"\n{label}: decode step (32 x batch 32, 8B-shaped MLP) and prefill step (1,024 tokens, "
          f"8 layers), median ms; movement GB/s beside them (alone: nothing computing)")
    print(f"{'condition':18} {'decode ms':>10} {'+%':>7} {'prefill ms':>11} {'+%':>7} "
          f"{'move GB/s':>10} {'alone':>7}  path")
    for r in rows:
        mv = f"{r['move_gbps']:.1f}" if r["move_gbps"] is not None else "-"
        al = f"{r['alone_gbps']:.1f}" if r["alone_gbps"] is not None else "-"
        print(f"{r['condition']:18} {r['decode_ms']:10.3f} {r['decode_pct']:+7.1f} "
              f"{r['prefill_ms']:11.3f} {r['prefill_pct']:+7.1f} {mv:>10} {al:>7}  "
              f"{','.join(r['paths'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build folder (daemon/, client/, kernels/)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=150)
    ap.add_argument("--prefill-steps", type=int, default=40)
    ap.add_argument("--mps", action="store_true", help="run the conditions under MPS too")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    os.environ["KVDOCK_LIB"] = str(Path(args.build) / "client" / "libkvdock.so")
    sys.path.insert(0, str(REPO / "client" / "python"))
    os.environ["PYTHONPATH"] = str(REPO / "client" / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    result = {"default": run_conditions(args, {}, "default")}
    print_rows("default compute mode", result["default"])
    if args.mps:
        pipe, logd = tempfile.mkdtemp(prefix="mps-pipe-"), tempfile.mkdtemp(prefix="mps-log-")
        env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logd}
        ctl = shutil.which("nvidia-cuda-mps-control")
        started = ctl and subprocess.run([ctl, "-d"], env=dict(os.environ, **env)).returncode == 0
        if not started:
            result["mps"] = "not started: " + ("no nvidia-cuda-mps-control" if not ctl else "it failed")
            print(f"\nMPS: {result['mps']}")
        else:
            try:
                result["mps"] = run_conditions(args, env, "mps")
                print_rows("under MPS", result["mps"])
            finally:
                subprocess.run([ctl], input=b"quit\n", env=dict(os.environ, **env))
                for k in env:
                    os.environ.pop(k, None)
    Path(args.out, "interference.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

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
  before, in turn; or (--disk-dir, the daemon then has --cache-dir there)
  saves of fresh blocks into a cache of a 512 MiB host budget and a 16 GiB
  disk level: every save pushes older blocks to disk, so the disk level
  spills at the drive's full rate (the condition "disk"; issue 42's
  target: the decode step within 5%); a save the cache refuses (EBUSY, or
  some blocks refused, while the disk writer is far behind) is sent again
  after 5 ms, and the sendings again are counted and printed;
- for the in-worker alternative to small scattered rows, the compute worker
  itself packs scattered 2 KiB rows of its own cache into a contiguous
  buffer with kvdock's kernel on a low-priority stream of its own context,
  within a block budget, while it computes.
Conditions alternate with no-movement controls between them, in rounds; a
step's slowdown is its median against the median of every control step.

The chunks table (--table chunks) sets the daemon's copy-engine path
against the copy engines' own rate (bench_ce, built with the tree: one
descriptor a chunk through cudaMemcpyBatchAsync, no daemon), each measured
alone and beside the same decode step in the same run: for every chunk
size and direction, a mover worker keeps 4 all-layer transfers in flight
between its cache and a daemon host pool, pages of the chunk size (the
contiguous bytes of one layer and K or V) at random, the host pool's
slots in order (as the yardstick's host side is); its cache is either
32 layers of K and V in allocations of their own ("layers") or views into
one allocation ("one"); the daemon moves either as a descriptor a page,
layer and K/V.  With --layouts tier-layers or tier-one, the same cache
moves through a kvdockd cache instead: a pool of it paged by the chunk
(a block of 32 layers x K, V x the chunk), chains of blocks saved first,
then loads of them into random pages (host to device only), the cache
tier's own copy path.  A row's figure is the daemon's rate as a
fraction of the yardstick's beside the decode step; the decode step's
slowdown is against decode steps with nothing moving.

Usage (GPU machine, repository root; the build carried there):
    python3 tests/bench/bench_interference.py --build .carry/bg [--rounds 2] [--mps]
    python3 tests/bench/bench_interference.py --build .carry/bg --table chunks
        [--chunks 16K,32K,64K,2M] [--dirs d2h,h2d] [--layouts layers,one]
        [--seconds 1.5] [--daemon-args "--copy-threads 2"] ...
Writes $OUT/interference.json (OUT defaults to /tmp) and prints a table.
With --mps the conditions run again under an MPS control daemon started
(and stopped) here, when the machine allows it.  Each --daemon-args (may
be repeated; words of the form env:NAME=VALUE set the daemon's
environment) runs the chunks table's daemon rows once more on a fresh
daemon so configured.
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
TIER_BUDGET, TIER_CHAINS = 1 << 30, 8       # the chunks table's tier rows: 512 MiB saved
CACHE_BUDGET = 4 << 30                      # the mover's cache tier
DISK_HOST_BUDGET, DISK_BUDGET = 512 << 20, 16 << 30  # the disk condition's cache
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
    "disk": ({"path": None, "disk": True}, 0),
    "pack_8": (None, 8),
    "pack_2": (None, 2),
}
ORDER = ["copy_engine", "offload", "cache", "kernel_32", "kernel_2", "copy_engine_rows", "pack_8",
         "pack_2"]
DISK_ORDER = ["disk"]  # with --disk-dir
# A save the disk condition's cache refuses (EBUSY, or some blocks
# refused: every host slot still held by writes to a disk that fell
# behind) is sent again after RETRY_WAIT_S, for at most RETRY_FOR_S.
RETRY_WAIT_S, RETRY_FOR_S = 0.005, 60.0


def settle(fut, resend, counts):
    """The result of the request fut and the bytes it moved.  With resend
    (a callable that sends the same save again: the blocks stored already
    are skipped), a save the cache refused, EBUSY or with blocks refused,
    is sent again after RETRY_WAIT_S until every block is stored, each
    sending counted in counts["retries"]; past RETRY_FOR_S of refusals, or
    any other error, the error goes up."""
    import kvdock
    moved, t0 = 0, time.monotonic()
    while True:
        try:
            r = fut.result()
        except kvdock.Error as e:
            if resend is None or e.name != "EBUSY" or time.monotonic() - t0 > RETRY_FOR_S:
                raise
        else:
            moved += r.bytes
            if resend is None or r.refused == 0:
                return r, moved
            if time.monotonic() - t0 > RETRY_FOR_S:
                raise RuntimeError(f"a save still had {r.refused} blocks refused after "
                                   f"{RETRY_FOR_S:.0f} s of sending it again")
        counts["retries"] += 1
        time.sleep(RETRY_WAIT_S)
        fut = resend()


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


def mover_worker(conn, socket, disk=False):
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
        disk_cache, disk_why = None, None
        if disk:
            try:
                disk_cache = cli.create_cache("mover-disk", num_layers=LAYERS,
                                              tokens_per_block=PAGE, token_bytes=ROW,
                                              budget_bytes=DISK_HOST_BUDGET,
                                              disk_budget=DISK_BUDGET, dtype="u8")
            except kvdock.Error as e:
                disk_why = f"{e.name}: {e.message}"

        def disk_request():
            """A save of fresh blocks, and how to send it again."""
            pages = torch.randperm(SLOTS // PAGE, generator=g)[:REQ_SLOTS // PAGE].tolist()
            keys = [os.urandom(32) for _ in pages]

            def send():
                return disk_cache.save_async(gpu, keys, blocks=pages)
            return send(), send

        def disk_written():
            st = disk_cache.stats().disk if disk_cache is not None else None
            return st.write_bytes if st is not None else 0
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

        conn.send("ready" if disk_why is None else ("ready", disk_why))
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                return
            mode = msg[1]
            kw = {"path": mode["path"], "max_blocks": mode.get("max_blocks", 0)}
            # futs: (future, keys of a cache save to remember, how to send it again)
            futs, moved, paths, n = [], 0, set(), 0
            counts = {"retries": 0}
            t0, w0 = time.time(), disk_written()
            while not conn.poll():
                while len(futs) < INFLIGHT:
                    if mode.get("disk"):
                        f, again = disk_request()
                        futs.append((f, None, again))
                    elif mode.get("cache"):
                        futs.append((*cache_request(n), None))
                    else:
                        idx = indices(mode["rows"])
                        d2h = n % 2 == 0 or mode.get("d2h_only")
                        src, dst = (gpu, host) if d2h else (host, gpu)
                        futs.append((cli.transfer_async(src, dst, idx, idx, **kw), None, None))
                    n += 1
                f, keys, resend = futs.pop(0)
                r, b = settle(f, resend, counts)
                if keys is not None:
                    saved.append(keys)
                moved += b
                paths.add(r.path)
            for f, _, resend in futs:
                moved += settle(f, resend, counts)[1]
            secs = time.time() - t0
            conn.recv()  # the stop
            conn.send({"gbps": moved / secs / 1e9, "paths": sorted(paths), "requests": n,
                       "retries": counts["retries"],
                       "disk_write_gbps": (disk_written() - w0) / secs / 1e9
                       if mode.get("disk") else None})


def start_daemon(kvdockd, sock, env, log, cache_dir=None):
    extra = ["--cache-dir", cache_dir, "--disk-budget", str(DISK_BUDGET + (1 << 30))] \
        if cache_dir else []
    p = subprocess.Popen([kvdockd, "--backend", "cuda", "--socket", sock, "--log-level", "warn"]
                         + extra, stdout=log, stderr=subprocess.STDOUT, env=env)
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
    disk_tmp = tempfile.mkdtemp(prefix="kvdock-interf-disk-", dir=args.disk_dir) \
        if args.disk_dir else None
    daemon = start_daemon(str(Path(args.build) / "daemon" / "kvdockd"), sock, env, log,
                          os.path.join(disk_tmp, "cache") if disk_tmp else None)
    ctx = mp.get_context("spawn")
    cpipe, cchild = ctx.Pipe()
    mpipe, mchild = ctx.Pipe()
    klib = str(Path(args.build) / "kernels" / "libkvdock_kernels.so")
    comp = ctx.Process(target=compute_worker, args=(cchild, klib))
    mover = ctx.Process(target=mover_worker, args=(mchild, sock, disk_tmp is not None))
    comp.start()
    mover.start()
    assert cpipe.recv() == "ready"
    ready = mpipe.recv()
    order = ORDER + (DISK_ORDER if disk_tmp is not None else [])
    if ready != "ready":  # the daemon refused the disk level: say why, run the rest
        print(f"disk condition not run: {ready[1]}")
        order = ORDER
    if args.conditions:
        order = [c for c in order if c in args.conditions.split(",")]
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
    disk_alone, retries_alone = None, None
    for name in [c for c in ("copy_engine", "offload", "cache", "kernel_32", "disk") if c in order]:
        mpipe.send(("run", CONDITIONS[name][0]))
        time.sleep(1.5)
        mpipe.send(("stop",))
        got = mpipe.recv()
        alone[name] = got["gbps"]
        if name == "disk":
            disk_alone, retries_alone = got["disk_write_gbps"], got["retries"]
    for _ in range(args.rounds):
        one("none")
        for name in order:
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
    if disk_tmp:
        shutil.rmtree(disk_tmp, ignore_errors=True)

    base = {k: statistics.median(steps["none"][k]) for k in ("decode", "prefill")}
    rows = []
    for name in ["none"] + order:
        d = statistics.median(steps[name]["decode"])
        p = statistics.median(steps[name]["prefill"])
        m = movers.get(name)
        rows.append({"condition": name, "decode_ms": d, "decode_pct": 100 * (d / base["decode"] - 1),
                     "prefill_ms": p, "prefill_pct": 100 * (p / base["prefill"] - 1),
                     "move_gbps": statistics.median([x["gbps"] for x in m]) if m else None,
                     "paths": sorted({q for x in m for q in x["paths"]}) if m else [],
                     "alone_gbps": alone.get(name),
                     "disk_write_gbps": statistics.median([x["disk_write_gbps"] for x in m])
                     if name == "disk" else None,
                     "disk_write_alone_gbps": disk_alone if name == "disk" else None,
                     # saves sent again, refused: beside the steps (every round) and alone
                     "disk_retries": sum(x["retries"] for x in m) if name == "disk" else None,
                     "disk_retries_alone": retries_alone if name == "disk" else None})
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
    for r in rows:
        if r.get("disk_write_gbps") is not None:
            al = r["disk_write_alone_gbps"]
            print(f"disk: the disk level wrote {r['disk_write_gbps']:.2f} GB/s beside the steps"
                  + (f" ({al:.2f} GB/s alone)" if al is not None else "")
                  + f"; target: decode within 5% (here {r['decode_pct']:+.1f}%)")
            print(f"disk: saves refused and sent again: {r['disk_retries']} beside the steps"
                  + (f", {r['disk_retries_alone']} alone" if r["disk_retries_alone"] is not None
                     else ""))


# --- the chunks table -------------------------------------------------------

def decode_worker(conn):
    """Decode steps back to back while told to, each timed with CUDA events
    and stamped with time.monotonic() at its end."""
    import torch
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    up = [torch.randn(HIDDEN, FFN, device=dev, dtype=dt) * 0.01 for _ in range(LAYERS)]
    down = [torch.randn(FFN, HIDDEN, device=dev, dtype=dt) * 0.01 for _ in range(LAYERS)]
    xd = torch.randn(32, HIDDEN, device=dev, dtype=dt)

    def decode():
        x = xd
        for l in range(LAYERS):
            x = torch.relu(x @ up[l]) @ down[l]
        return x

    for _ in range(10):
        decode()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        steps = []
        while not conn.poll():
            s.record()
            decode()
            e.record()
            e.synchronize()
            steps.append((time.monotonic(), s.elapsed_time(e)))
        conn.recv()  # the stop
        conn.send(steps)


def chunk_mover(conn, layouts):
    """Makes its cache in each layout named; then, for each daemon it is
    sent to, imports them and moves what it is told.  The tier-* layouts
    are the cache of the same name without the prefix, moved through a
    kvdockd cache instead (loads of blocks saved first)."""
    import torch
    import kvdock
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(1)
    caches = {}
    for lay in sorted({la[len("tier-"):] if la.startswith("tier-") else la for la in layouts}):
        if lay == "layers":  # each layer's K and V an allocation of its own
            k = [torch.randint(0, 255, (SLOTS, ROW), dtype=torch.uint8, device=dev)
                 for _ in range(LAYERS)]
            v = [torch.randint(0, 255, (SLOTS, ROW), dtype=torch.uint8, device=dev)
                 for _ in range(LAYERS)]
        else:  # views into one allocation, layers evenly spaced
            whole = torch.randint(0, 255, (LAYERS, 2, SLOTS, ROW), dtype=torch.uint8, device=dev)
            k = [whole[l, 0] for l in range(LAYERS)]
            v = [whole[l, 1] for l in range(LAYERS)]
        caches[lay] = (k, v)
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        with kvdock.Client(msg[1], name="chunk-mover") as cli:
            pools = {lay: cli.import_pool(f"kv-{lay}", k, v) for lay, (k, v) in caches.items()}
            host = cli.create_pool("chunk-host", LAYERS, SLOTS, ROW, kind="host")
            # a round trip through the host pool, small and large pages
            bad = []
            for lay, gpu in pools.items():
                k, v = caches[lay]
                for page in (8, 1024):
                    perm = torch.randperm(SLOTS // page, generator=g)
                    a = (perm[:4, None] * page + torch.arange(page)[None, :]).reshape(-1)
                    b = (perm[4:8, None] * page + torch.arange(page)[None, :]).reshape(-1)
                    cli.transfer(gpu, host, a, a, path="copy_engine")
                    cli.transfer(host, gpu, a, b, path="copy_engine")
                    torch.cuda.synchronize()
                    for t in k + v:
                        if not torch.equal(t[a.to(dev)], t[b.to(dev)]):
                            bad.append(f"{lay}/{page}")
                            break
            conn.send(bad)
            tiers = {}  # (layout, page): the pool of that page size, its cache, chains saved

            def tier(lay, page, rows):
                if (lay, page) not in tiers:
                    k, v = caches[lay]
                    tp = cli.import_pool(f"tier-{lay}-{page}", k, v, page_size=page)
                    tc = cli.create_cache(f"tier-{lay}-{page}", num_layers=LAYERS,
                                          tokens_per_block=page, token_bytes=ROW,
                                          budget_bytes=TIER_BUDGET, dtype="u8")
                    chains = []
                    # at most half the budget: the cache keeps them all
                    per_chain = rows * ROW * 2 * LAYERS
                    for _ in range(max(1, min(TIER_CHAINS, TIER_BUDGET // (2 * per_chain)))):
                        pages = torch.randperm(SLOTS // page, generator=g)[:rows // page].tolist()
                        keys = [os.urandom(32) for _ in pages]
                        if tc.save(tp, keys, blocks=pages).stored != len(keys):
                            raise SystemExit(f"tier {lay}/{page}: the cache refused blocks")
                        chains.append(keys)
                    tiers[(lay, page)] = (tp, tc, chains)
                return tiers[(lay, page)]

            while True:
                msg = conn.recv()
                if msg[0] == "done":
                    break
                _, lay, chunk, d2h = msg
                page = chunk // ROW
                rows = max(REQ_SLOTS, 2 * page)
                if lay.startswith("tier-"):  # loads of saved chains into random pages
                    tp, tc, chains = tier(lay[len("tier-"):], page, rows)
                else:
                    gpu = pools[lay]
                    src, dst = (gpu, host) if d2h else (host, gpu)
                futs, moved, paths, t0, n = [], 0, set(), None, 0
                while not conn.poll():
                    while len(futs) < INFLIGHT:
                        if lay.startswith("tier-"):
                            pages = torch.randperm(SLOTS // page, generator=g)[:rows // page]
                            futs.append(tc.load_async(tp, chains[n % len(chains)],
                                                      blocks=pages.tolist()))
                            n += 1
                            continue
                        # random pages of the cache, the host pool's slots in order
                        pages = torch.randperm(SLOTS // page, generator=g)[:rows // page]
                        idx = (pages[:, None] * page + torch.arange(page)[None, :]).reshape(-1)
                        hidx = torch.arange(rows) + (n * rows) % SLOTS
                        n += 1
                        s_idx, d_idx = (idx, hidx) if d2h else (hidx, idx)
                        futs.append(cli.transfer_async(src, dst, s_idx, d_idx,
                                                       path="copy_engine"))
                    r = futs.pop(0).result()
                    if t0 is None:  # timed from the first completion on
                        t0 = time.monotonic()
                    else:
                        moved += r.bytes
                    paths.add(r.path)
                for f in futs:
                    moved += f.result().bytes
                t1 = time.monotonic()
                conn.recv()  # the stop
                conn.send({"gbps": moved / (t1 - t0) / 1e9, "t0": t0, "t1": t1,
                           "paths": sorted(str(p) for p in paths)})
        conn.send("disconnected")


def parse_size(text):
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if t[-1:] in "KMG" else t) * mult


def chunk_table(args):
    chunks = [parse_size(c) for c in args.chunks.split(",")]
    dirs = args.dirs.split(",")
    layouts = args.layouts.split(",")
    for c in chunks:
        if c % ROW or (SLOTS * ROW) % c:
            raise SystemExit(f"chunk {c}: not a whole number of {ROW}-byte rows dividing a layer")
    configs = args.daemon_args or [""]
    bench_ce = str(Path(args.build) / "tests" / "bench" / "bench_ce")
    ctx = mp.get_context("spawn")
    cpipe, cchild = ctx.Pipe()
    comp = ctx.Process(target=decode_worker, args=(cchild,))
    comp.start()
    mpipe, mchild = ctx.Pipe()
    mover = ctx.Process(target=chunk_mover, args=(mchild, layouts))
    mover.start()
    assert cpipe.recv() == "ready" and mpipe.recv() == "ready"
    secs = args.seconds

    def beside(fn):
        """fn() run while the decode worker steps; its steps inside fn's window."""
        cpipe.send(("loop",))
        time.sleep(0.5)
        out = fn()
        cpipe.send(("stop",))
        steps = cpipe.recv()
        inside = [ms for t, ms in steps if out["t0"] <= t <= out["t1"]]
        return out, (statistics.median(inside) if inside else None)

    def control():
        cpipe.send(("loop",))
        time.sleep(secs)
        cpipe.send(("stop",))
        return statistics.median([ms for _, ms in cpipe.recv()])

    def yardstick(chunk, d, extra=()):
        cmd = ["timeout", "-s", "KILL", "60", bench_ce, "--chunk", str(chunk), "--dir", d,
               "--seconds", str(secs)] + list(extra)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"bench_ce failed ({p.returncode}): {p.stderr.strip()}")
        return json.loads(p.stdout)

    # the yardstick and the decode controls, per chunk and direction
    ys, ctl = {}, []
    probes, variants = [], []
    for c in chunks:
        for d in dirs:
            ctl.append(control())
            y_alone = yardstick(c, d)
            y_bes, y_dec = beside(lambda: yardstick(c, d))
            ys[(c, d)] = {"alone": y_alone["gbps"], "beside": y_bes["gbps"], "decode_ms": y_dec,
                          "issue_frac": y_alone["issue_frac"]}
            for va in args.yard_variant or []:
                extra = va.split()
                v_alone = yardstick(c, d, extra)
                v_bes, v_dec = beside(lambda: yardstick(c, d, extra))
                variants.append({"args": va, "chunk": c, "dir": d, "alone": v_alone["gbps"],
                                 "beside": v_bes["gbps"], "decode_ms": v_dec})
            if c == 16 << 10 and args.probes:
                probes.append(yardstick(c, d, ["--gated", "--total", str(16384 * c)]))
                probes.append(yardstick(c, d, ["--host-random"]))
                probes.append(yardstick(c, d, ["--pthread"]))
                probes.append(yardstick(c, d, ["--threads", "2"]))
                probes.append(yardstick(c, d, ["--registered"]))
                probes.append(yardstick(c, d, ["--registered", "--gated", "--total",
                                               str(16384 * c)]))
    base = statistics.median(ctl)
    print(f"yardstick (bench_ce): GB/s alone and beside the decode step "
          f"({base:.3f} ms alone), the step's slowdown beside it, the share of time in the "
          f"issuing calls alone")
    for (c, d), v in ys.items():
        dp = f"{100 * (v['decode_ms'] / base - 1):+.1f}%" if v["decode_ms"] else "-"
        print(f"  {c >> 10:>5}K {d}  {v['alone']:6.1f} {v['beside']:6.1f} {dp:>7} "
              f"issue {v['issue_frac']:.2f}", flush=True)
    for v in variants:
        dp = f"{100 * (v['decode_ms'] / base - 1):+.1f}%" if v["decode_ms"] else "-"
        print(f"  {v['chunk'] >> 10:>5}K {v['dir']}  {v['alone']:6.1f} {v['beside']:6.1f} "
              f"{dp:>7}  bench_ce {v['args']}", flush=True)
    for pr in probes:
        print("probe", json.dumps(pr), flush=True)

    result = {"decode_ms_control": base, "controls": ctl, "yardstick": [
        dict(chunk=c, dir=d, **v) for (c, d), v in ys.items()], "probes": probes, "variants": variants, "configs": []}
    tmp = tempfile.mkdtemp(prefix="kvdock-chunks-")
    for ci, cfg in enumerate(configs):
        words = cfg.split()
        env = dict(os.environ, **dict(w[4:].split("=", 1) for w in words if w.startswith("env:")))
        only = dict(w.split("=", 1) for w in words if w.split("=", 1)[0] in
                    ("chunks", "dirs", "layouts"))
        dargs = [w for w in words if not w.startswith("env:") and
                 w.split("=", 1)[0] not in ("chunks", "dirs", "layouts")]
        c_chunks = [parse_size(c) for c in only["chunks"].split(",")] if "chunks" in only \
            else chunks
        c_dirs = only["dirs"].split(",") if "dirs" in only else dirs
        c_layouts = only["layouts"].split(",") if "layouts" in only else layouts
        sock = os.path.join(tmp, f"kvdockd-{ci}.sock")
        log_path = os.path.join(tmp, f"kvdockd-{ci}.log")
        log = open(log_path, "w")
        daemon = subprocess.Popen(
            [str(Path(args.build) / "daemon" / "kvdockd"), "--backend", "cuda", "--socket", sock,
             "--log-level", "warn"] + dargs, stdout=log, stderr=subprocess.STDOUT, env=env)
        for _ in range(400):
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(sock):
            raise SystemExit(f"kvdockd ({cfg!r}) did not start")
        mpipe.send(("connect", sock))
        bad = mpipe.recv()
        rows = []

        def move(lay, c, d):
            mpipe.send(("run", lay, c, d == "d2h"))
            time.sleep(secs)
            mpipe.send(("stop",))
            return mpipe.recv()

        for c in c_chunks:
            for d in c_dirs:
                for lay in c_layouts:
                    if lay.startswith("tier-") and d != "h2d":
                        continue  # the tier's rows are its loads
                    alone = move(lay, c, d)
                    bes, dec = beside(lambda: move(lay, c, d))
                    again = move(lay, c, d)  # alone once more: an order effect shows
                    y = ys[(c, d)]
                    rows.append({
                        "layout": lay, "dir": d, "chunk": c, "paths": bes["paths"],
                        "yardstick_alone": y["alone"], "daemon_alone": alone["gbps"],
                        "daemon_alone_again": again["gbps"],
                        "alone_frac": alone["gbps"] / y["alone"],
                        "yardstick_beside": y["beside"], "daemon_beside": bes["gbps"],
                        "beside_frac": bes["gbps"] / y["beside"],
                        "decode_pct": 100 * (dec / base - 1) if dec else None,
                        "yardstick_decode_pct": 100 * (y["decode_ms"] / base - 1)
                        if y["decode_ms"] else None})
        mpipe.send(("done",))
        assert mpipe.recv() == "disconnected"
        daemon.terminate()
        daemon.wait()
        log.close()
        said = Path(log_path).read_text(errors="replace").strip()
        if said:
            print(f"kvdockd ({cfg or 'defaults'}) said:\n{said[-2000:]}")
        result["configs"].append({"daemon_args": cfg, "verify_failed": bad, "rows": rows})
        print_chunk_rows(cfg, bad, base, rows)
        Path(args.out, "interference.json").write_text(json.dumps(result, indent=1))
    cpipe.send(("quit",))
    mpipe.send(("quit",))
    comp.join()
    mover.join()
    shutil.rmtree(tmp, ignore_errors=True)
    return result


def print_chunk_rows(cfg, bad, base, rows):
    print(f"\nchunks table, kvdockd {cfg or '(defaults)'}: decode step {base:.3f} ms alone; "
          f"GB/s; daemon as a fraction of the yardstick (bench_ce) alone and beside the step"
          + (f"; ROUND TRIP WRONG: {bad}" if bad else "; round trip checked"))
    print(f"{'layout':11} {'dir':4} {'chunk':>6} {'yard':>6} {'kvd':>6} {'alone':>6} "
          f"{'yard':>6} {'kvd':>6} {'beside':>7} {'decode':>7} {'(yard)':>7} {'again':>6}")
    for r in rows:
        c = r["chunk"]
        cs = f"{c >> 20}M" if c >= 1 << 20 else f"{c >> 10}K"
        dp = f"{r['decode_pct']:+.1f}%" if r["decode_pct"] is not None else "-"
        yp = f"{r['yardstick_decode_pct']:+.1f}%" if r["yardstick_decode_pct"] is not None else "-"
        print(f"{r['layout']:11} {r['dir']:4} {cs:>6} {r['yardstick_alone']:6.1f} "
              f"{r['daemon_alone']:6.1f} {r['alone_frac']:6.2f} {r['yardstick_beside']:6.1f} "
              f"{r['daemon_beside']:6.1f} {r['beside_frac']:7.2f} {dp:>7} {yp:>7} "
              f"{r['daemon_alone_again']:6.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build folder (daemon/, client/, kernels/)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=150)
    ap.add_argument("--prefill-steps", type=int, default=40)
    ap.add_argument("--mps", action="store_true", help="run the conditions under MPS too")
    ap.add_argument("--disk-dir", help="conditions: a directory on a local drive; the daemon "
                    "gets --cache-dir there and the condition 'disk' runs (a spill at full "
                    "rate beside the decode step)")
    ap.add_argument("--conditions", help="conditions: only these (comma-separated, from "
                    + ", ".join(ORDER + DISK_ORDER) + "), each against the control")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--table", choices=("conditions", "chunks"), default="conditions",
                    help="the conditions (default) or the chunks table")
    ap.add_argument("--chunks", default="16K,32K,64K,2M", help="chunks table: chunk sizes")
    ap.add_argument("--dirs", default="d2h,h2d", help="chunks table: directions")
    ap.add_argument("--layouts", default="layers,one",
                    help="chunks table: the worker cache's layouts (layers, one; tier-layers, "
                    "tier-one: the same caches' loads through a kvdockd cache, host to device "
                    "only)")
    ap.add_argument("--seconds", type=float, default=1.5, help="chunks table: seconds a figure")
    ap.add_argument("--daemon-args", action="append",
                    help="chunks table: a daemon configuration (repeatable)")
    ap.add_argument("--yard-variant", action="append",
                    help="chunks table: bench_ce with these arguments too (repeatable, e.g. "
                    "\"--imported --allocs 64\"), alone and beside the step, each chunk and "
                    "direction")
    ap.add_argument("--probes", action="store_true",
                    help="chunks table, at 16 KiB: bench_ce gated (16,384 descriptors), with "
                    "the host side scattered, from a thread not the main one, from 2 threads")
    args = ap.parse_args()
    os.environ["KVDOCK_LIB"] = str(Path(args.build) / "client" / "libkvdock.so")
    sys.path.insert(0, str(REPO / "client" / "python"))
    os.environ["PYTHONPATH"] = str(REPO / "client" / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    if args.table == "chunks":
        Path(args.out, "interference.json").write_text(json.dumps(chunk_table(args), indent=1))
        return
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

#!/usr/bin/env python3
"""Round 10 experiment: what do_bench's L2 flush costs the copy after it.  do_bench clears L2 by
writing a 256 MB buffer (zero_), which leaves L2 full of dirty lines that the timed copy must
write back; reading the buffer instead leaves clean lines.  Per-layer MHA at 16,384 random rows
(library), torch's copy_ of the same bytes and an empty kernel, timed as do_bench times (events
around one call after each flush), median of 200 calls, three turns each:

    EXP_LIB=<libkvdock_kernels.so> python3 tests/bench/experiments/flush_kind.py

Run from the repository root on the GPU machine."""
import sys, os, statistics
sys.path.insert(0, "tests/bench")
import bench_kernels as B, torch
import rows
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
m = rows.mha_bench_rows(B, kvd, dev)
f, x, y = m.f, m.x, m.y
cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device=dev)
sink = torch.empty((), dtype=torch.int64, device=dev)
flushes = {"write (do_bench)": lambda: cache.zero_(), "read": lambda: torch.sum(cache, dim=0, dtype=torch.int64, out=sink)}
def timed(fn, flush, n=200):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for _ in range(10): flush(); fn()
    for s, e in ev:
        flush(); s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3
fns = {"lib per-layer MHA L=16384": f, "torch copy_ same bytes": lambda: y.copy_(x), "empty kernel": lambda: torch.cuda._sleep(0)}
res = {(k, fk): [] for k in fns for fk in flushes}
for _ in range(3):
    for k, fn in fns.items():
        for fk, fl in flushes.items():
            res[(k, fk)].append(timed(fn, fl))
for (k, fk), v in res.items():
    print(f"{k:28s} flush {fk:16s} {statistics.median(v):8.2f} us  " + " ".join(f"{t:.2f}" for t in v))

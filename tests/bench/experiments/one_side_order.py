#!/usr/bin/env python3
"""Round 12 experiment: could any order of the rows bring the two random-row transfers under 80%
of the ceiling (per-layer MHA 16,384 and MLA 131,072, round 11) up to it?  A kernel can only order
the copies, and an order can gather one side's rows by page, not both: source and destination
slots are independent draws.  So each row is timed with the bench's draw (both sides random) and
with the same pairs sorted by source slot, by destination slot, and with both sides' slots sorted
(each sorted on its own: the slot order of round 10, what no order of these pairs reaches).  The
pools are the seed's bench (2^19 slots); times are do_bench medians (L2 flushed), the median of
EXP_ROUNDS turns, every draw checked first:

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=5 python3 tests/bench/experiments/one_side_order.py

Run from the repository root on the GPU machine."""
import os, sys
sys.path.insert(0, "tests/bench")
import bench_kernels as B
import torch
import rows

ROUNDS = int(os.environ.get("EXP_ROUNDS", "5"))
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
POOL = 1 << 19


def orders(L):
    si = torch.randperm(POOL, device=dev)[:L]; di = torch.randperm(POOL, device=dev)[:L]
    by_src = torch.argsort(si); by_dst = torch.argsort(di)
    return {"random (the bench)": (si, di), "sorted by source": (si[by_src], di[by_src]),
            "sorted by destination": (si[by_dst], di[by_dst]),
            "both sides sorted": (torch.sort(si).values, torch.sort(di).values)}


def run(title, srcs, dsts, L, row):
    fns, keep = {}, []
    for name, (si, di) in orders(L).items():
        a = B.one_layer_transfer(srcs[0], srcs[1] if len(srcs) > 1 else None, dsts[0],
                                 dsts[1] if len(dsts) > 1 else None, si, di, row)
        f = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0))
        for d in dsts:
            d.index_fill_(0, di, 0)
        f(); torch.cuda.synchronize()
        ok = all(torch.equal(d[di], s[si]) for s, d in zip(srcs, dsts))
        print(f"check {title} {name}: {'ok' if ok else 'MISMATCH'}", flush=True)
        assert ok
        fns[name] = f
        keep.append((a, si, di))
    rows.report(title, fns, 2 * len(srcs) * L * row, ROUNDS)


src = [torch.randn(POOL, 8, 128, dtype=torch.bfloat16, device=dev) for _ in range(2)]
dst = [torch.zeros_like(s) for s in src]
run("per-layer MHA L=16384 item2048", src, dst, 16384, 2048)
del src, dst
src = [torch.randn(POOL, 1, 576, dtype=torch.bfloat16, device=dev)]
dst = [torch.zeros_like(src[0])]
run("per-layer MLA L=131072 item1152", src, dst, 131072, 1152)

#!/usr/bin/env python3
"""Round 10 experiment: what the span of the pools costs a random-row copy.  The two
per-layer rows still under 80% of the copy ceiling (MHA, 16,384 rows of 2,048 bytes, K and
V; MLA, 131,072 rows of 1,152 bytes) draw their rows at random from pools of 2^19 slots
(1 GiB per MHA buffer), as bench_seed.py does.  Here the same number of rows is drawn from
pools of every size from exactly the rows copied (a random order over a dense pool) up to
2^20 slots, with the rows in slot order as well; each is timed with the library, with
torch's index_select of the same source rows into a packed buffer (random reads, another
design), and beside torch's copy_ of the same bytes packed (the ceiling's kind of copy).
Every library variant is checked against torch once; do_bench medians (L2 flushed) over
EXP_ROUNDS turns.

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=5 python3 tests/bench/experiments/pool_span.py

Run from the repository root on the GPU machine."""
import os, sys
sys.path.insert(0, "tests/bench")
import bench_kernels as B
import torch
import rows

ROUNDS = int(os.environ.get("EXP_ROUNDS", "5"))
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])


def case(label, L, shape, row, nbufs, pools):
    nbytes = 2 * nbufs * L * row  # read + write
    x = torch.empty(nbufs * L * row // 2, dtype=torch.bfloat16, device=dev); y = torch.empty_like(x)
    fns = {"torch copy_ (packed, same bytes)": lambda: y.copy_(x)}
    keep = []  # tensors the timed closures use
    for P in pools:
        src = [torch.randn(P, *shape, dtype=torch.bfloat16, device=dev) for _ in range(nbufs)]
        dst = [torch.zeros_like(s) for s in src]
        packed = [torch.empty(L, *shape, dtype=torch.bfloat16, device=dev) for _ in range(nbufs)]
        orders = [("random", torch.randperm(P, device=dev)[:L], torch.randperm(P, device=dev)[:L])]
        if P == pools[0]:
            orders.append(("slot order", torch.arange(L, device=dev), torch.arange(L, device=dev)))
        for name, si, di in orders:
            a = B.one_layer_transfer(src[0], src[1] if nbufs == 2 else None, dst[0],
                                     dst[1] if nbufs == 2 else None, si, di, row)
            f = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0))
            for d in dst:
                d.index_fill_(0, di, 0)
            f(); torch.cuda.synchronize()
            ok = all(torch.equal(d[di], s[si]) for s, d in zip(src, dst))
            print(f"check {label} P={P} {name}: {'ok' if ok else 'MISMATCH'}", flush=True)
            assert ok
            fns[f"lib P={P} {name}"] = f
            fns[f"torch index_select P={P} {name}"] = (
                lambda si=si, src=src, packed=packed: [torch.index_select(s, 0, si, out=p) for s, p in zip(src, packed)])
            keep.append((a, si, di))
        keep.append((src, dst, packed))
    rows.report(label, fns, nbytes, ROUNDS)
    del keep, fns, x, y
    torch.cuda.empty_cache()


case("per-layer MHA L=16384 item2048", 16384, (8, 128), 2048, 2, [16384, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20])
case("per-layer MLA L=131072 item1152", 131072, (1, 576), 1152, 1, [131072, 1 << 18, 1 << 19, 1 << 20])

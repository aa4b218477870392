#!/usr/bin/env python3
"""Round 11 experiment: is the per-layer MHA row's loss to the pools' span (round 10, pool_span.py)
a matter of how many 2 MiB pages the copy touches (address translation) or of how the rows lie
within them (DRAM locality)?  16,384 random rows of 2,048 bytes per buffer (K and V), copied by the
library between pools of 2^19 slots (1 GiB per buffer, the seed's bench), with each side's rows
drawn from P random 2 MiB pages (1,024 slots each) of its pools:
- "clustered": a run of 16,384/P neighbouring slots at a random place in each page;
- "spread": 16,384/P random slots of each page;
- "uniform": 16,384 random slots of the whole pool (the bench's draw).
Rows are copied in a random order in every draw.  Times are do_bench medians (L2 flushed), the
median of EXP_ROUNDS turns, every draw checked first:

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=5 python3 tests/bench/experiments/pages_touched.py

Run from the repository root on the GPU machine."""
import os, sys
sys.path.insert(0, "tests/bench")
import bench_kernels as B
import torch
import rows

ROUNDS = int(os.environ.get("EXP_ROUNDS", "5"))
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
POOL, L, ROW, PAGE = 1 << 19, 16384, 2048, 1024  # slots, rows, bytes per row per buffer, slots per 2 MiB


def draw(P, how):
    if how == "uniform":
        return torch.randperm(POOL, device=dev)[:L]
    pages = torch.randperm(POOL // PAGE, device=dev)[:P]
    per = L // P
    if how == "clustered":
        start = torch.randint(0, PAGE - per + 1, (P,), device=dev)
        slots = pages[:, None] * PAGE + start[:, None] + torch.arange(per, device=dev)[None, :]
    else:
        slots = pages[:, None] * PAGE + torch.argsort(torch.rand(P, PAGE, device=dev), dim=1)[:, :per]
    slots = slots.reshape(-1)
    return slots[torch.randperm(L, device=dev)]


src = [torch.randn(POOL, 8, 128, dtype=torch.bfloat16, device=dev) for _ in range(2)]
dst = [torch.zeros_like(s) for s in src]
for t in src + dst:  # pages are counted from the pool's start: say so if it is not a page boundary
    if t.data_ptr() % (2 << 20):
        print(f"warning: a pool starts {t.data_ptr() % (2 << 20)} bytes past a 2 MiB boundary", flush=True)
fns, keep = {}, []
for P, how in [(16, "clustered")] + [(P, h) for P in (32, 64, 128, 256, 512) for h in ("clustered", "spread")] + [(0, "uniform")]:
    si, di = draw(P, how), draw(P, how)
    a = B.one_layer_transfer(src[0], src[1], dst[0], dst[1], si, di, ROW)
    f = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0))
    for d in dst:
        d.index_fill_(0, di, 0)
    f(); torch.cuda.synchronize()
    ok = all(torch.equal(d[di], s[si]) for s, d in zip(src, dst))
    name = f"{how} P={P}" if P else how
    print(f"check {name}: {'ok' if ok else 'MISMATCH'}", flush=True)
    assert ok
    fns[name] = f
    keep.append((a, si, di))
rows.report("per-layer MHA L=16384 item2048 over 2^19-slot pools", fns, 2 * 2 * L * ROW, ROUNDS)

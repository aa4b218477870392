#!/usr/bin/env python3
"""Round 10 experiment: two large per-layer rows once each for a profiler: per-layer MHA at
16,384 random rows of 2,048 bytes (K and V) and torch's copy_ of the same bytes, the same MHA rows
in slot order, per-layer MLA at 131,072 random rows of 1,152 bytes and torch's copy_ of its bytes;
three launches of each.  Under ncu (kernel-only durations, DRAM bytes):

    EXP_LIB=<libkvdock_kernels.so> ncu --clock-control none --cache-control all --csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 tests/bench/experiments/ncu_large.py

Run from the repository root on the GPU machine."""
import sys, os
sys.path.insert(0, "tests/bench")
import bench_kernels as B, torch
import rows
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
m = rows.mha_bench_rows(B, kvd, dev)
P2, L, row, sk, sv, dk, dv, f, x, y = m.P2, m.L, m.row, m.sk, m.sv, m.dk, m.dv, m.f, m.x, m.y
for _ in range(3):
    f(); y.copy_(x)
ci = torch.arange(L, device=dev)
fc = kvd.bind("kvd_cuda_kv_transfer", B.one_layer_transfer(sk, sv, dk, dv, ci, ci, row), B.Launch(None, 0, 0))
for _ in range(3):
    fc()
ms = torch.randn(P2, 1, 576, dtype=torch.bfloat16, device=dev); md = torch.zeros_like(ms)
L = 131072
si = torch.randperm(P2, device=dev)[:L]; di = torch.randperm(P2, device=dev)[:L]
g = kvd.bind("kvd_cuda_kv_transfer", B.one_layer_transfer(ms, None, md, None, si, di, 1152), B.Launch(None, 0, 0))
x2 = torch.empty(L * 1152 // 2, dtype=torch.bfloat16, device=dev); y2 = torch.empty_like(x2)
for _ in range(3):
    g(); y2.copy_(x2)
torch.cuda.synchronize()
print("ncu_one done")

#!/usr/bin/env python3
"""Round 10 experiment: the small cases (store N=1, 32, 512; per-layer MHA at 64 rows; per-layer
MLA at 64 and 1,024 rows; the page-table gather at bs=1 and 64), the seed's kernel and the
library's, once each to load and then five launches each, for a profiler's kernel-only
durations (do_bench's turns of these cases fall in two modes 12-17% apart; a kernel's own
duration under ncu does not):

    EXP_LIB=<libkvdock_kernels.so> ncu --clock-control none --cache-control all --csv \\
        --kernel-name regex:"_store_kv|_kv_transfer|_gather|copy_row|gather_once|gather_kernel" \\
        --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \\
        python3 tests/bench/experiments/ncu_small.py

Run from the repository root with the seed at .peer."""
import sys, os
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B, torch
from small_cases import small_cases
from tokenspeed_kernel.ops.kvcache import triton as K
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
# (label, the seed's call, the library's call) per case
cases = [(c.label, c.seed, kvd.bind(c.fname, c.args, B.Launch(None, 0, 0))) for c in small_cases(B, K, dev)]
for name, seed, mine in cases:  # compile and load everything first
    seed(); mine()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("measured")  # ncu profiles from here (--nvtx-include)
for name, seed, mine in cases:
    for _ in range(5):
        seed()
    for _ in range(5):
        mine()
    torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
print("ncu_small done:", [c[0] for c in cases])

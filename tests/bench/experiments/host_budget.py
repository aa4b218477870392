#!/usr/bin/env python3
"""Round 6 experiment: all-layer host transfers (MLA and MHA, 1,024 slots, h2d and
d2h) with and without a budget of 8 thread blocks, through several builds of the
library in turns, each result checked first.

    HOST_BUDGETS=8,0 python3 tests/bench/experiments/host_budget.py NAME=path/libkvdock_kernels.so ...

HOST_BUDGETS lists the max_blocks values (default 8 and 0), HOST_ROUNDS the turns.

Run from the repository root on the GPU machine; results in tests/bench/results."""
import sys, os, statistics
sys.path.insert(0, "tests/bench")
import bench_kernels as B
import torch
from triton.testing import do_bench
dev = "cuda"; torch.manual_seed(1)
libs = {name: B.Kvd(path) for name, path in (x.split("=") for x in sys.argv[1:])}
ROUNDS = int(os.environ.get("HOST_ROUNDS", "3"))
BUDGETS = [int(x) for x in os.environ.get("HOST_BUDGETS", "8,0").split(",")]  # max_blocks values
SL = 1 << 15
def t(fn): return do_bench(fn, warmup=5, rep=60, return_mode="median") * 1e3
def host_layers(n, shape):
    out = []
    for _ in range(n):
        h = torch.empty(SL, *shape, dtype=torch.bfloat16, pin_memory=True)
        h.copy_(torch.randn(SL, *shape, dtype=torch.bfloat16, device=dev)); out.append(h)
    return out
def dev_layers(n, shape): return [torch.zeros(SL, *shape, dtype=torch.bfloat16, device=dev) for _ in range(n)]
def ptrs(ts): return torch.tensor([x.data_ptr() for x in ts], dtype=torch.uint64, device=dev)
res = {}
for label, NL, shape, item, nb in [("mla", 61, (1, 576), 1152, 1), ("mha", 32, (8, 128), 2048, 2)]:
    for kind in ["h2d", "d2h"]:
        src = [host_layers(NL, shape) if kind == "h2d" else dev_layers(NL, shape) for _ in range(nb)]
        if kind == "d2h":
            for b in src:
                for x in b: x.normal_()
        dst = [dev_layers(NL, shape) if kind == "h2d" else host_layers(NL, shape) for _ in range(nb)]
        ps = [ptrs(b) for b in src]; pd = [ptrs(b) for b in dst]
        L = 1024
        si = torch.randperm(SL, device=dev)[:L]; di = torch.randperm(SL, device=dev)[:L]
        a = B.TransferArgs()
        a.src = B.KvSide(None, None, ps[0].data_ptr(), ps[1].data_ptr() if nb == 2 else None, 0, item, SL)
        a.dst = B.KvSide(None, None, pd[0].data_ptr(), pd[1].data_ptr() if nb == 2 else None, 0, item, SL)
        a.num_layers, a.src_idx, a.dst_idx = NL, si.data_ptr(), di.data_ptr()
        a.idx_dtype, a.count, a.row_bytes, a.oob_count = B.KVD_DTYPE_I64, L, item, None
        nbytes = L * NL * item * nb
        for mb in BUDGETS:
            for name, kvd in libs.items():
                f = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, mb, 0))
                for b in dst:
                    for x in b: x.index_fill_(0, di.to(x.device), 0)
                f(); torch.cuda.synchronize()
                ok = all(torch.equal(dst[b][l][di.to(dst[b][l].device)].cpu(), src[b][l][si.to(src[b][l].device)].cpu())
                         for b in range(nb) for l in (0, NL // 2, NL - 1))
                print(f"check {label} {kind} mb={mb} {name}: {'ok' if ok else 'MISMATCH'}", flush=True)
                res[(label, kind, mb, name)] = (f, nbytes, [])
        for r in range(ROUNDS):
            for key, (f, nbytes, v) in res.items():
                if key[0] == label and key[1] == kind:
                    v.append(t(f))
        for key, (f, nbytes, v) in res.items():
            if key[0] == label and key[1] == kind:
                m = statistics.median(v)
                print(f"{label} {kind} L={L} layers{NL} item{item} max_blocks={key[2]} {key[3]:8s} {m:9.2f} us {nbytes / m / 1e3:6.1f} GB/s  runs " + " ".join(f"{x:.1f}" for x in v), flush=True)
        del src, dst, ps, pd
        torch.cuda.empty_cache()

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
from tokenspeed_kernel.ops.kvcache import triton as K
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
def lib(fn, a): return kvd.bind(fn, a, B.Launch(None, 0, 0))
H, D, P = 8, 128, 1 << 20
row = H * D * 2
kpool = torch.randn(P, H, D, dtype=torch.bfloat16, device=dev); vpool = torch.randn_like(kpool)
cases = []
for N in (1, 32, 512):
    ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev); vs = torch.randn_like(ks)
    loc = torch.randperm(P, device=dev)[:N]
    a = B.StoreArgs(ks.data_ptr(), vs.data_ptr(), row, row, kpool.data_ptr(), vpool.data_ptr(), row, row, P,
                    loc.data_ptr(), B.KVD_DTYPE_I64, N, row, None)
    cases.append((f"store N={N}", lambda ks=ks, vs=vs, loc=loc: K.store_kv_cache(ks, vs, kpool, vpool, loc),
                  lib("kvd_cuda_kv_store", a), (ks, vs, loc, a)))
P2 = 1 << 19
sk = torch.randn(P2, H, D, dtype=torch.bfloat16, device=dev); sv = torch.randn_like(sk)
dk = torch.zeros_like(sk); dv = torch.zeros_like(sk)
si = torch.randperm(P2, device=dev)[:64]; di = torch.randperm(P2, device=dev)[:64]
ta = B.one_layer_transfer(sk, sv, dk, dv, si, di, row)
cases.append(("per-layer L=64", lambda: K.transfer_kv_per_layer(sk, dk, sv, dv, si, di, row),
              lib("kvd_cuda_kv_transfer", ta), ta))
ms = torch.randn(P2, 1, 576, dtype=torch.bfloat16, device=dev); md = torch.zeros_like(ms)
for L in (64, 1024):
    msi = torch.randperm(P2, device=dev)[:L]; mdi = torch.randperm(P2, device=dev)[:L]
    ma = B.one_layer_transfer(ms, None, md, None, msi, mdi, 1152)
    cases.append((f"mla L={L}", lambda msi=msi, mdi=mdi: K.transfer_kv_per_layer_mla(ms, md, msi, mdi, 1152),
                  lib("kvd_cuda_kv_transfer", ma), (msi, mdi, ma)))
req_to_page = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)
for bs, maxp in ((1, 256), (64, 2048)):
    rpi = torch.randperm(1024, device=dev)[:bs]
    seq = torch.randint(1, maxp * 16, (bs,), dtype=torch.int32, device=dev)
    out = torch.full((bs, maxp), -1, dtype=torch.int32, device=dev)
    ga = B.GatherArgs(req_to_page.data_ptr(), B.KVD_DTYPE_I32, 1024, 8192, req_to_page.stride(0) * 4,
                      rpi.data_ptr(), B.KVD_DTYPE_I64, seq.data_ptr(), B.KVD_DTYPE_I32,
                      out.data_ptr(), out.stride(0) * 4, bs, maxp, 16, 0, None)
    cases.append((f"gather bs={bs}", lambda rpi=rpi, seq=seq, out=out, bs=bs, maxp=maxp: K.gather_page_table_with_padding(
        req_to_page, rpi, seq, out, bs=bs, max_num_pages=maxp, page_size=16, dummy_slot=0),
                  lib("kvd_cuda_page_table_gather", ga), (rpi, seq, out, ga)))
for name, seed, mine, _ in cases:  # compile and load everything first
    seed(); mine()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("measured")  # ncu profiles from here (--nvtx-include)
for name, seed, mine, _ in cases:
    for _ in range(5):
        seed()
    for _ in range(5):
        mine()
    torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
print("ncu_small done:", [c[0] for c in cases])

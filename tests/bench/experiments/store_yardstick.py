#!/usr/bin/env python3
"""Round 16: what a scatter of a store's rows reaches on this card, beside the seed and the library.

The store rows of bench_seed.py (8 heads x 128, bf16: 2,048-byte K and V rows, slots drawn at random
from pools of 2^20) at N = 8,192 and 65,536 tokens, timed with do_bench (L2 flushed) in EXP_TURNS
interleaved turns, median of the turns' medians:
  seed          the seed's store_kv_cache (N=8,192 only: it fails at 65,536)
  kvdock        the library's store
  index_copy    torch's own scatter of the same rows, one index_copy_ over one pool of 2 x 2^20 rows
                holding K and V (one launch, the same bytes and the same random slots)
  copy          torch's contiguous copy of the same bytes (no index: the copy ceiling at this size)
Bytes are read plus written, as bench_seed.py counts them; % is of the 4.25 TB/s device copy.  Every
variant's result is checked against torch first.

    EXP_LIB=<libkvdock_kernels.so> [EXP_TURNS=5] python3 tests/bench/experiments/store_yardstick.py

Run from the repository root with the seed at .peer."""
import os, statistics, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from tokenspeed_kernel.ops.kvcache import triton as K

TURNS = int(os.environ.get("EXP_TURNS", "5"))
CEILING = 4.25e12  # bytes/s, device copy counting read and write (the H200 figure)
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
H, D, P = 8, 128, 1 << 20
row = H * D * 2
pool = torch.randn(2 * P, H, D, dtype=torch.bfloat16, device=dev)  # K rows 0..P-1, V rows P..2P-1
kpool, vpool = pool[:P], pool[P:]

for N in (8192, 65536):
    ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev); vs = torch.randn_like(ks)
    loc = torch.randperm(P, device=dev)[:N]
    both = torch.cat([ks, vs]); loc2 = torch.cat([loc, loc + P])
    flat_src = both.clone(); flat_dst = torch.empty_like(both)
    args = B.StoreArgs(ks.data_ptr(), vs.data_ptr(), row, row, kpool.data_ptr(), vpool.data_ptr(), row, row, P,
                       loc.data_ptr(), B.KVD_DTYPE_I64, N, row, None)
    calls = {"kvdock": kvd.bind("kvd_cuda_kv_store", args, B.Launch(torch.cuda.current_stream().cuda_stream, 0, 0)),
             "index_copy": lambda: pool.index_copy_(0, loc2, both),
             "copy": lambda: flat_dst.copy_(flat_src)}
    if N <= 8192:
        calls = {"seed": lambda: K.store_kv_cache(ks, vs, kpool, vpool, loc), **calls}
    for name, fn in calls.items():
        if name == "copy":
            continue
        pool[loc2] = 0; torch.cuda.synchronize()
        fn(); torch.cuda.synchronize()
        assert torch.equal(kpool[loc], ks) and torch.equal(vpool[loc], vs), f"N={N} {name}: wrong rows"
    times = {name: [] for name in calls}
    for _ in range(TURNS):
        for name, fn in calls.items():
            times[name].append(B.us(fn))
    nbytes = 2 * 2 * N * row  # K and V rows, read and written
    for name, xs in times.items():
        t = statistics.median(xs)
        print(f"store N={N:6d} {name:11s} {t:8.2f} us  [{min(xs):.2f}-{max(xs):.2f}]  "
              f"{nbytes / t / 1e3:7.1f} GB/s  {100 * nbytes / t * 1e6 / CEILING:5.1f}% of the ceiling", flush=True)

#!/usr/bin/env python3
"""Round 10 experiment: the page-table gather at bs=1 (256 pages) and bs=64 (2,048 pages), by the
seed and by each library build in EXP_LIBS (name=path,...), each checked against torch first, then
six launches each, the seed first and the builds in the order given, for ncu:

    EXP_LIBS=main=<lib>,gb=<lib> ncu --clock-control none --cache-control all --csv \\
        --kernel-name regex:"_gather_page|gather_once" --metrics gpu__time_duration.sum \\
        python3 tests/bench/experiments/ncu_gather.py

Run from the repository root with the seed at .peer."""
# (name=path,...), 6 launches each in that order (seed first), each build checked first; for ncu
import sys, os
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B, torch
from tokenspeed_kernel.ops.kvcache import triton as K
dev = "cuda"; torch.manual_seed(0)
libs = [(n, B.Kvd(p)) for n, p in (x.split("=") for x in os.environ["EXP_LIBS"].split(","))]
req_to_page = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)
cases = []
for bs, maxp in ((1, 256), (64, 2048)):
    rpi = torch.randperm(1024, device=dev)[:bs]
    seq = torch.randint(1, maxp * 16, (bs,), dtype=torch.int32, device=dev)
    out = torch.full((bs, maxp), -1, dtype=torch.int32, device=dev)
    col = torch.arange(maxp, device=dev)
    ref = torch.where(col[None, :] < ((seq + 15) // 16)[:, None], req_to_page[rpi, :maxp], 0)
    ga = B.GatherArgs(req_to_page.data_ptr(), B.KVD_DTYPE_I32, 1024, 8192, req_to_page.stride(0) * 4,
                      rpi.data_ptr(), B.KVD_DTYPE_I64, seq.data_ptr(), B.KVD_DTYPE_I32,
                      out.data_ptr(), out.stride(0) * 4, bs, maxp, 16, 0, None)
    fns = [("seed", lambda rpi=rpi, seq=seq, out=out, bs=bs, maxp=maxp: K.gather_page_table_with_padding(
        req_to_page, rpi, seq, out, bs=bs, max_num_pages=maxp, page_size=16, dummy_slot=0))]
    fns += [(n, k.bind("kvd_cuda_page_table_gather", ga, B.Launch(None, 0, 0))) for n, k in libs]
    for n, f in fns:
        out.fill_(-1); f(); torch.cuda.synchronize()
        assert torch.equal(out, ref), (n, bs)
    cases.append((bs, fns, out))
print("checked", flush=True)
for n in ["seed"] + [n for n, _ in libs]:
    for bs, fns, out in cases:
        f = dict(fns)[n]
        for _ in range(6):
            f()
        torch.cuda.synchronize()
        print(f"ran {n} bs={bs}", flush=True)

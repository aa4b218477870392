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
    g = B.GatherCase(req_to_page, bs, maxp)
    fns = [("seed", g.seed(K))]
    fns += [(n, k.bind("kvd_cuda_page_table_gather", g.args(), B.Launch(None, 0, 0))) for n, k in libs]
    for n, f in fns:
        g.out.fill_(-1); f(); torch.cuda.synchronize()
        assert torch.equal(g.out, g.ref), (n, bs)
    cases.append((bs, fns, g))
print("checked", flush=True)
for n in ["seed"] + [n for n, _ in libs]:
    for bs, fns, g in cases:
        f = dict(fns)[n]
        for _ in range(6):
            f()
        torch.cuda.synchronize()
        print(f"ran {n} bs={bs}", flush=True)

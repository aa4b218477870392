#!/usr/bin/env python3
"""Round 11 experiment: the page-table gather in steps from the seed's kernel to the library's
(gather_steps.cu), for Nsight Compute's kernel-only durations.  At bs=1 (max_pages 256) and bs=64
(2,048), each variant is checked against torch first, then launched 6 times per case, in the
order printed ("ran ..."):

    nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC tests/bench/experiments/gather_steps.cu -o libgsteps.so
    EXP_STEPS=libgsteps.so EXP_LIB=<libkvdock_kernels.so> ncu --clock-control none --cache-control all \\
        --metrics gpu__time_duration.sum --csv python3 tests/bench/experiments/gather_steps.py > r.csv
    python3 tests/bench/experiments/ncu_csv.py r.csv

Run from the repository root with the seed at .peer."""
import ctypes, os, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B, torch
from tokenspeed_kernel.ops.kvcache import triton as K
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
m = ctypes.CDLL(os.environ["EXP_STEPS"])
VP, LL, I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
m.exp_gather_step.argtypes = [I, I, I, VP, LL, LL, LL, VP, VP, VP, LL, I, I, I, I, VP]
ROWS, COLS = 1024, 8192
table = torch.randint(0, 1 << 20, (ROWS, COLS), dtype=torch.int32, device=dev)
oob = torch.zeros((), dtype=torch.int64, device=dev)
STEPS = [("min1x128", 0, 1, 128), ("full1x128", 1, 1, 128), ("full4x256", 1, 4, 256), ("full4x128", 1, 4, 128)]
cases = []
for bs, maxp in ((1, 256), (64, 2048)):
    g = B.GatherCase(table, bs, maxp)
    fns = [("seed", g.seed(K)), ("lib", kvd.bind("kvd_cuda_page_table_gather", g.args(), B.Launch(None, 0, 0)))]
    for name, kind, vec, thr in STEPS:
        fns.append((name, lambda kind=kind, vec=vec, thr=thr, g=g:
                    m.exp_gather_step(kind, vec, thr, table.data_ptr(), ROWS, COLS, table.stride(0), g.rpi.data_ptr(),
                                      g.seq.data_ptr(), g.out.data_ptr(), g.out.stride(0), g.bs, g.maxp, 4, 0,
                                      oob.data_ptr())))
    for n, f in fns:
        g.out.fill_(-1); f(); torch.cuda.synchronize()
        assert torch.equal(g.out, g.ref), (n, bs)
    cases.append((bs, dict(fns)))
print("checked", flush=True)
for n in ["seed", "lib"] + [s[0] for s in STEPS]:
    for bs, fns in cases:
        for _ in range(6):
            fns[n]()
        torch.cuda.synchronize()
        print(f"ran {n} bs={bs}", flush=True)

#!/usr/bin/env python3
"""Round 16: which part of the host's launch path moves a small case under triton's do_bench.

With the host's pace out (graph_pace.py) the library is level with the seed on the small cases,
yet on some machines do_bench puts it 0.4-0.7 us behind (round 16 call 5: store N=1 4.06 against
4.70 us), and the seed's own cubin launched through ctypes trailed the same way (round 14).  This
times, under do_bench as bench_kernels.py does (L2 flushed, median), in EXP_TURNS turns whose order
rotates, the same call made five ways:
  seed        the seed through Triton's launcher
  lib         the library through ctypes.CDLL (the GIL released around the call), as the bench does
  lib_gil     the same entry point through ctypes.PyDLL (the GIL held)
  lib_graph   one library launch captured in a CUDA graph, replayed (torch's CUDAGraph.replay)
  seed_graph  the seed's launch so
and the host's own time per call of each (perf_counter over 2,000 calls, no sync between them).

    EXP_LIB=<libkvdock_kernels.so> [EXP_TURNS=6] python3 tests/bench/experiments/dobench_path.py

Run from the repository root with the seed at .peer."""
import ctypes, os, statistics, sys, time
sys.path.insert(0, "tests/bench"); sys.path.insert(0, "tests/bench/experiments"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from small_cases import small_cases
from tokenspeed_kernel.ops.kvcache import triton as K

TURNS = int(os.environ.get("EXP_TURNS", "6"))
dev = "cuda"; torch.manual_seed(0)
kvd = B.Kvd(os.environ["EXP_LIB"])
held = ctypes.PyDLL(os.environ["EXP_LIB"])


def gil_held(sc):
    fn = getattr(held, sc.fname)
    fn.argtypes = [ctypes.POINTER(B.ENTRY_ARGS[sc.fname]), ctypes.POINTER(B.Launch)]
    fn.restype = ctypes.c_int
    launch = B.Launch(torch.cuda.current_stream().cuda_stream or None, 0, 0)
    pa, pl = ctypes.byref(sc.args), ctypes.byref(launch)

    def call():
        st = fn(pa, pl)
        assert st == 0, f"{sc.fname}: status {st}"
    call.keep = (sc.args, launch)
    return call


def graphed(make):
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        make()()
    torch.cuda.synchronize()
    return g.replay


def host_us(fn, n=2000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return t


for sc in small_cases(B, K, dev):
    if sc.label not in ("store N=1", "store N=32", "mla L=64", "gather bs=1"):
        continue
    lib = kvd.bind(sc.fname, sc.args, B.Launch(torch.cuda.current_stream().cuda_stream or None, 0, 0))
    ways = {"seed": sc.seed, "lib": lib, "lib_gil": gil_held(sc),
            "lib_graph": graphed(lambda: kvd.bind(sc.fname, sc.args,
                                                  B.Launch(torch.cuda.current_stream().cuda_stream, 0, 0))),
            "seed_graph": graphed(lambda: sc.seed)}
    for name, fn in ways.items():
        sc.clear(); torch.cuda.synchronize()
        fn(); torch.cuda.synchronize()
        assert sc.right(), f"{sc.label} {name}: wrong result"
    times = {name: [] for name in ways}
    names = list(ways)
    for k in range(TURNS):
        for name in names[k % len(names):] + names[:k % len(names)]:
            times[name].append(B.us(ways[name]))
    for name in names:
        xs = times[name]
        print(f"{sc.label:12s} {name:10s} do_bench {statistics.median(xs):6.2f} us [{min(xs):.2f}-{max(xs):.2f}]"
              f"  host {host_us(ways[name]):6.2f} us a call", flush=True)

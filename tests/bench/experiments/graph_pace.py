#!/usr/bin/env python3
"""Round 15 experiment (written in round 14, not yet run on a GPU): the small cases timed with the
host's pace taken out.

Round 14 found the seed's lead on the small cases under do_bench to depend on the machine: up to
0.54 us on some, none on others. The library's times stayed the same on every machine, and the
seed's own cubin launched from ctypes did not have the lead. What the GPU runs cannot explain
that; how fast the host issues the launches may. Here each variant is captured in a CUDA graph
of EXP_GP_LAUNCHES pairs of nodes, each pair an L2 flush (zeroing 256 MiB, as do_bench does) and
then the variant's launch, so the GPU runs them back to back with no host in between. Timing
events are recorded inside the graph on both sides of every launch (event-record nodes, torch's
Event(external=True)), as do_bench records them on the stream; a replay's figure is the median
of its launches. Each round replays every variant's graph once, in an order rotated every
round; the table gives the lowest round, the median of the lowest third and the median of all
rounds. Where torch cannot record events inside a graph, a graph of the flushes alone is
replayed first and subtracted: (variant's graph - flush graph) / EXP_GP_LAUNCHES, which a
0.1% change in the flushes' time moves by about 0.07 us. EXP_GP_FLUSH_MIB sets the flush
(default 256, do_bench's).

Cases: store N=1, 32, 512 (8 heads x 128, bf16); per-layer MHA at 64 rows; per-layer MLA at 64
and 1,024 rows; the page-table gather at bs=1 and 64: the seed's kernel and the library's
(EXP_LIB; EXP_LIB2 adds a second build). Every variant is checked against torch first.

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=12 python3 tests/bench/experiments/graph_pace.py

Run from the repository root with the seed at .peer."""
import os, statistics, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from small_cases import modes, small_cases
from tokenspeed_kernel.ops.kvcache import triton as K

ROUNDS = int(os.environ.get("EXP_ROUNDS", "12"))
LAUNCHES = int(os.environ.get("EXP_GP_LAUNCHES", "50"))
dev = "cuda"; torch.manual_seed(0)
builds = [("lib", B.Kvd(os.environ["EXP_LIB"]))] + (
    [("lib2", B.Kvd(os.environ["EXP_LIB2"]))] if os.environ.get("EXP_LIB2") else [])


def maker(sc, lib):
    """A maker of case sc's call by lib (None: the seed's), made inside a capture: the library
    launches on the stream current when it is made (the capture stream), the seed on torch's
    current stream by itself."""
    if lib is None:
        return lambda: sc.seed
    return lambda: lib.bind(sc.fname, sc.args, B.Launch(torch.cuda.current_stream().cuda_stream, 0, 0))


# (label, {variant: maker}, clear, right): clear() then one call, and right() must hold
cases = [(sc.label, {"seed": maker(sc, None), **{name: maker(sc, lib) for name, lib in builds}}, sc.clear, sc.right)
         for sc in small_cases(B, K, dev)]

# check every variant once, outside any capture (this also compiles the seed's kernels)
for label, makers, clear, right in cases:
    for name, make in makers.items():
        clear(); torch.cuda.synchronize()
        make()(); torch.cuda.synchronize()
        good = right()
        print(f"check {label} {name}: {'ok' if good else 'MISMATCH'}", flush=True)
        assert good

flush = torch.empty(int(os.environ.get("EXP_GP_FLUSH_MIB", "256")) * 1024 * 1024 // 4, dtype=torch.int, device=dev)
try:  # event-record nodes in the graph (cudaEventRecordExternal): a timestamp around every launch
    torch.cuda.Event(enable_timing=True, external=True)
    EVENTS = True
except TypeError:  # this torch cannot record timing events inside a graph: the flush graph is subtracted
    EVENTS = False


def capture(make):
    """A graph of LAUNCHES (flush, launch) pairs, with a timing event on each side of every launch
    when EVENTS; make None: the flushes alone."""
    graph = torch.cuda.CUDAGraph()
    marks = [(torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True, external=True))
             for _ in range(LAUNCHES if EVENTS and make else 0)]
    # relaxed: the library's host code runs as it does outside a capture (its lazy set-up ran
    # in the checks above)
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        fn = make() if make else None
        for k in range(LAUNCHES):
            flush.zero_()
            if fn:
                if marks:
                    marks[k][0].record()
                fn()
                if marks:
                    marks[k][1].record()
    return graph, marks


def replay(captured):
    """us per launch in one replay: the median over its launches with EVENTS, else the whole
    replay's time."""
    graph, marks = captured
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); graph.replay(); end.record()
    torch.cuda.synchronize()
    if marks:
        return statistics.median(a.elapsed_time(b) * 1e3 for a, b in marks)
    return start.elapsed_time(end) * 1e3


flush_graph = capture(None)
graphs = {label: {name: capture(make) for name, make in makers.items()} for label, makers, _, _ in cases}
for label, by in graphs.items():  # one replay each to warm up
    for captured in by.values():
        replay(captured)
per = {label: {name: [] for name in by} for label, by in graphs.items()}
for r in range(ROUNDS):
    for label, by in graphs.items():
        order = list(by.items())
        order = order[r % len(order):] + order[:r % len(order)]
        base = 0.0 if EVENTS else replay(flush_graph)
        for name, captured in order:
            t = replay(captured)
            per[label][name].append(t if EVENTS else (t - base) / LAUNCHES)
    print(f"round {r + 1}/{ROUNDS}", flush=True)

how = ("the median launch of each replay, timed by events inside the graph" if EVENTS else
       "each replay less the flush graph's, over its launches")
print(f"\nus per launch over {ROUNDS} rounds of {LAUNCHES} (flush, launch) pairs ({how}):"
      " lowest / median of the lowest third / median")
for label, by in per.items():
    for name, xs in by.items():
        print(f"{label:15s} {name:5s} {modes(xs)}   " + " ".join(f"{v:.2f}" for v in xs), flush=True)

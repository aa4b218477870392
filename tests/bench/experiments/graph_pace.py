#!/usr/bin/env python3
"""Round 15 experiment: the small cases timed with the host's pace taken out.

Round 14 found the seed's lead on the small cases under do_bench to depend on the machine: up to
0.54 us on some, none on others. The library's times stayed the same on every machine, and the
seed's own cubin launched from ctypes did not have the lead. What the GPU runs cannot explain
that; how fast the host issues the launches may. Here each variant is timed in CUDA graphs of
EXP_GP_LAUNCHES (flush, launch) pairs, timing events inside the graph (small_cases.GraphPace says
how), so the GPU runs the launches back to back with no host in between. Each round replays
every variant's graph once, in an order rotated every round; the table gives the lowest round,
the median of the lowest third and the median of all rounds. EXP_GP_FLUSH_MIB sets the flush
(default 256, do_bench's). EXP_GP_DUP=<n> captures every variant n times over (name#k: group k's
graphs made in turn, in an order rotated by k): how far apart the same launch lies in separate
graphs; it also prints, for each variant, its copies' differences from the seed's copy of the same
group (the lower modes, pair by pair; round 15 made each group in one order, the seed first), and
EXP_GP_CONTROL=1 adds seedB, the seed's call captured again after the builds',
whose differences are what two graphs of one launch give. EXP_GP_CASES=<regex> keeps the cases
whose label it matches (for example 'gather').

Cases: store N=1, 32, 512 (8 heads x 128, bf16); per-layer MHA at 64 rows; per-layer MLA at 64
and 1,024 rows; the page-table gather at bs=1 and 64: the seed's kernel and the library's
(EXP_LIB; EXP_LIB2 to EXP_LIB4 add builds). Every variant is checked against torch first, and
every graph after its first replay.

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=12 python3 tests/bench/experiments/graph_pace.py

Run from the repository root with the seed at .peer. Round 15's results:
tests/bench/results/2026-12-03-h200-round15.md."""
import os, re, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from small_cases import GraphPace, copy_groups, modes, paired, small_cases
from tokenspeed_kernel.ops.kvcache import triton as K

ROUNDS = int(os.environ.get("EXP_ROUNDS", "12"))
LAUNCHES = int(os.environ.get("EXP_GP_LAUNCHES", "50"))
dev = "cuda"; torch.manual_seed(0)
builds = [("lib", B.Kvd(os.environ["EXP_LIB"]))] + [
    (f"lib{k}", B.Kvd(os.environ[f"EXP_LIB{k}"])) for k in (2, 3, 4) if os.environ.get(f"EXP_LIB{k}")]


def maker(sc, lib):
    """A maker of case sc's call by lib (None: the seed's), made inside a capture: the library
    launches on the stream current when it is made (the capture stream), the seed on torch's
    current stream by itself."""
    if lib is None:
        return lambda: sc.seed
    return lambda: lib.bind(sc.fname, sc.args, B.Launch(torch.cuda.current_stream().cuda_stream, 0, 0))


# (label, {variant: maker}, clear, right): clear() then one call, and right() must hold
control = {"seedB": None} if os.environ.get("EXP_GP_CONTROL") else {}
cases = [(sc.label, {"seed": maker(sc, None), **{name: maker(sc, lib) for name, lib in builds + list(control.items())}},
          sc.clear, sc.right) for sc in small_cases(B, K, dev)
         if re.search(os.environ.get("EXP_GP_CASES", ""), sc.label)]
DUP = int(os.environ.get("EXP_GP_DUP", "1"))

# check every variant once, outside any capture (this also compiles the seed's kernels)
for label, makers, clear, right in cases:
    for name, make in makers.items():
        clear(); torch.cuda.synchronize()
        make()(); torch.cuda.synchronize()
        good = right()
        print(f"check {label} {name}: {'ok' if good else 'MISMATCH'}", flush=True)
        assert good

pace = GraphPace(LAUNCHES, int(os.environ.get("EXP_GP_FLUSH_MIB", "256")), dev)
per = pace.rounds({label: copy_groups(makers, DUP) for label, makers, _, _ in cases}, ROUNDS,
                  {label: (clear, right) for label, _, clear, right in cases}, lambda m: print(m, flush=True))
print(f"\nus per launch over {ROUNDS} rounds of {LAUNCHES} (flush, launch) pairs ({pace.how}):"
      " lowest / median of the lowest third / median")
for label, by in per.items():
    for name, xs in by.items():
        print(f"{label:15s} {name:7s} {modes(xs)}   " + " ".join(f"{v:.2f}" for v in xs), flush=True)
if DUP > 1:
    paired(per, list(cases[0][1]), DUP, lambda m: print(m, flush=True))

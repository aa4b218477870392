#!/usr/bin/env python3
"""Rounds 7 and 8: what of a small case's time is the launch path's, the parameter
block's, the kernel's.  Times, in turns (EXP_ROUNDS rounds, do_bench, L2 flushed), empty
kernels launched by torch, by Triton, and by launch_path.cu through the runtime and
through the driver (a build with the static runtime, as libkvdock_kernels.so has, and
one with the shared runtime, as torch has); then store N=1, 32 and 512 by the seed, by
the library, by the seed-shaped kernel of launch_path.cu on each path, by three variants
of it (the library's parameter block, its checks, its grid) and with its six parameters
packed, spread one per 64-byte line, spread with blockDim read, and packed
with 200 unread bytes after them (round 12); per-layer MHA at 64
rows by the seed, the library and two plain CUDA shapes; per-layer MLA at 64 and 1,024
rows and the page-table gather at bs=1 and 64 by the seed and the library.  EXP_LIB2
to EXP_LIB4 add builds of the library; EXP_LP_LEAN=1 keeps only runtime launches; EXP_JSON
writes every turn (for pool_turns.py --lp), EXP_STAMPS when each turn ran (to read beside a
clock log); EXP_LP_ROTATE=1 starts round r of each case at its r-th variant, so that no variant
always runs first (round 14).  Each case is checked once first.

    EXP_LP_STATIC=liblp_static.so EXP_LP_SHARED=liblp_shared.so EXP_LIB=<libkvdock_kernels.so> \
        EXP_ROUNDS=11 python3 tests/bench/experiments/launch_path.py

Run from the repository root with the seed at .peer; build lines in launch_path.cu."""
import ctypes, os, statistics, sys, time
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch, triton
from small_cases import small_cases
from triton.testing import do_bench
from tokenspeed_kernel.ops.kvcache import triton as K

ROUNDS = int(os.environ.get("EXP_ROUNDS", "11"))
dev = "cuda"; torch.manual_seed(0)
def t(fn): return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

@triton.jit
def triton_empty():
    pass

libs = {}
VP, LL = ctypes.c_void_p, ctypes.c_longlong
for tag, env in (("static", "EXP_LP_STATIC"), ("shared", "EXP_LP_SHARED")):
    if not os.environ.get(env):
        continue  # that build not asked for
    m = ctypes.CDLL(os.environ[env])
    for f in ("lp_empty_rt", "lp_empty_drv"):
        getattr(m, f).argtypes = [VP]
    for f in ("lp_store_rt", "lp_store_drv", "lp_store_rt256"):
        getattr(m, f).argtypes = [VP] * 6 + [LL, LL]
    assert m.lp_init() == 0, f"lp_init failed ({tag})"
    m.lp_store_variant.argtypes = [ctypes.c_int] + [VP] * 6 + [LL, LL]
    m.lp_store_lines_run.argtypes = [ctypes.c_int] + [VP] * 6 + [LL, LL]
    m.lp_pair_run.argtypes = [ctypes.c_int] + [VP] * 7 + [LL, LL]
    libs[tag] = m
# the library build under test ("lib") and up to three variant builds ("lib2".."lib4")
builds = [("lib", B.Kvd(os.environ["EXP_LIB"]))] + [
    (f"lib{k}", B.Kvd(os.environ[f"EXP_LIB{k}"])) for k in (2, 3, 4) if os.environ.get(f"EXP_LIB{k}")]

def with_builds(c, fn, args):
    """Case c with every library build's fn(args) added to its callables."""
    for name, lib in builds:
        c[name] = lib.bind(fn, args, B.Launch(None, 0, 0))
    return c

cases = {}
def ok(rc):
    assert rc == 0, rc

def check_each(label, c, clear, right):
    """Run every callable of case c once after clear(); right() must hold after each."""
    for name, fn in c.items():
        clear()
        fn(); torch.cuda.synchronize()
        good = right()
        print(f"check {label} {name}: {'ok' if good else 'MISMATCH'}", flush=True)
        assert good
cases["empty"] = {
    "torch": lambda: torch.cuda._sleep(0),
    "triton": lambda: triton_empty[(1,)](),
}
for tag, m in libs.items():
    cases["empty"][f"rt_{tag}"] = lambda m=m: ok(m.lp_empty_rt(None))
    if not os.environ.get("EXP_LP_LEAN"):
        cases["empty"][f"drv_{tag}"] = lambda m=m: ok(m.lp_empty_drv(None))

# the small cases: the seed and every library build, plus launch_path.cu's shapes where built
for sc in small_cases(B, K, dev):
    c = with_builds({"seed": sc.seed}, sc.fname, sc.args)
    if sc.label.startswith("store"):
        ptrs = (sc.ks.data_ptr(), sc.vs.data_ptr(), sc.kpool.data_ptr(), sc.vpool.data_ptr(), sc.loc.data_ptr())
        for tag, m in libs.items():
            for path in ("rt", "drv") + (("rt256",) if tag == "static" else ()):
                if os.environ.get("EXP_LP_LEAN") and path != "rt":
                    continue  # the runtime path only
                f = getattr(m, f"lp_store_{path}")
                c[f"{path}_{tag}"] = lambda f=f, ptrs=ptrs, sc=sc: ok(f(None, *ptrs, sc.N, sc.row))
        for w, name in enumerate(("big", "checks", "libgrid") if "static" in libs else ()):
            c[name] = lambda w=w, ptrs=ptrs, sc=sc: ok(libs["static"].lp_store_variant(w, None, *ptrs, sc.N, sc.row))
        for w, name in enumerate(("packed", "spread", "spread_ntid", "packed_pad") if "static" in libs else ()):
            c[name] = lambda w=w, ptrs=ptrs, sc=sc: ok(libs["static"].lp_store_lines_run(w, None, *ptrs, sc.N, sc.row))
    if sc.label == "per-layer L=64" and "static" in libs:
        ptrs = (sc.sk.data_ptr(), sc.sv.data_ptr(), sc.dk.data_ptr(), sc.dv.data_ptr(), sc.si.data_ptr(),
                sc.di.data_ptr())
        for w, name in enumerate(("pair_seed", "pair_split")):
            c[name] = lambda w=w, ptrs=ptrs, sc=sc: ok(libs["static"].lp_pair_run(w, None, *ptrs, 64, sc.row))
    check_each(sc.label, c, sc.clear, sc.right)
    cases[sc.label] = c

res = {k: {n: [] for n in v} for k, v in cases.items()}
stamps = []  # (case, variant, wall-clock start, end, us) of every turn, for EXP_STAMPS
ROTATE = bool(os.environ.get("EXP_LP_ROTATE"))  # round r starts each case at its r-th variant (mod count)
for r in range(ROUNDS):
    for k, v in cases.items():
        order = list(v.items())
        if ROTATE:
            order = order[r % len(order):] + order[:r % len(order)]
        for n, fn in order:
            t0 = time.time()
            res[k][n].append(t(fn))
            stamps.append((k, n, t0, time.time(), res[k][n][-1]))
    print(f"round {r + 1}/{ROUNDS} done", flush=True)

if os.environ.get("EXP_JSON"):  # every turn, for pooling over processes
    import json
    with open(os.environ["EXP_JSON"], "w") as f:
        json.dump(res, f)
if os.environ.get("EXP_STAMPS"):  # when each turn ran, to read beside a clock log
    import json
    with open(os.environ["EXP_STAMPS"], "w") as f:
        json.dump(stamps, f)
print(f"\nmedian us over {ROUNDS} rounds (min, and how many rounds within 0.1 us of the min)")
for k, v in res.items():
    for n, xs in v.items():
        lo = min(xs)
        near = sum(x <= lo + 0.1 for x in xs)
        print(f"{k:12s} {n:12s} {statistics.median(xs):6.2f}  (min {lo:5.2f}: {near}/{len(xs)})  "
              + " ".join(f"{x:.2f}" for x in xs), flush=True)

#!/usr/bin/env python3
"""Round 16 experiment (written in round 15; run in round 16, calls 1 and 4): the block-per-row kernels of a
store and of a per-layer MLA transfer in the shapes of row_variants.cu (its header lists them and what
the calls found), against the seed and the library, with the host's pace taken out.

Cases (small_cases.py): store N=1 and 32 (s_lib, s_weak, s_nc, s_cold, s_sel, s_l2), per-layer MLA at
64 and 1,024 rows (t_lib, t_src, t_src128, t_pred, t_seed, t_cold, t_ool, t_pred_oob); EXP_RP_VARIANTS=a,b,... times
only those (the seed, the library and seedB always).  Each variant is loaded from row_variants.cu as a module
of its own and launched through module_path.cu's driver launch, with the library's parameter block
for the kernel (56 bytes for a transfer, 72 for a store).  Every variant is checked against torch
first (the output cleared), and every graph after its first replay.  Then EXP_ROUNDS rounds of
small_cases.GraphPace, each variant captured EXP_RP_DUP times over (default 8) in copy groups
whose order rotates, with seedB (the seed again) as the control, and the pairs against the seed's
copy of each group.

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=8 python3 tests/bench/experiments/row_path.py

Run from the repository root with the seed at .peer, where nvcc is on the PATH (it builds
module_path.cu and row_variants.cu into EXP_RP_DIR, default /tmp/rowpath)."""
import ctypes, os, subprocess, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from small_cases import GraphPace, copy_groups, modes, paired, small_cases
from tokenspeed_kernel.ops.kvcache import triton as K

ROUNDS = int(os.environ.get("EXP_ROUNDS", "8"))
DUP = int(os.environ.get("EXP_RP_DUP", "8"))
WORK = os.environ.get("EXP_RP_DIR", "/tmp/rowpath")
dev = "cuda"; torch.manual_seed(0)
STREAM = [None]  # where the driver launches go: None (legacy) but inside a graph capture


class RowView(ctypes.Structure):
    _fields_ = [("dst_idx", ctypes.c_void_p), ("src_idx", ctypes.c_void_p), ("src", ctypes.c_void_p),
                ("dst", ctypes.c_void_p), ("src_stride", ctypes.c_uint32), ("dst_stride", ctypes.c_uint32),
                ("src_slots", ctypes.c_uint32), ("dst_slots", ctypes.c_uint32)]


class OneLayer(ctypes.Structure):
    _fields_ = [("view", RowView), ("oob", ctypes.c_void_p)]


class Store(ctypes.Structure):
    _fields_ = [("dst_idx", ctypes.c_void_p), ("src", ctypes.c_void_p * 2), ("src_stride", ctypes.c_uint32 * 2),
                ("dst_slots", ctypes.c_uint32), ("dst_stride", ctypes.c_uint32 * 2), ("unused", ctypes.c_uint32),
                ("dst", ctypes.c_void_p * 2), ("oob", ctypes.c_void_p)]


class StoreL2(ctypes.Structure):
    _fields_ = [("dst_idx", ctypes.c_void_p), ("src", ctypes.c_void_p * 2), ("dst", ctypes.c_void_p * 2),
                ("dst_slots", ctypes.c_uint32), ("unused", ctypes.c_uint32), ("src_stride", ctypes.c_uint32 * 2),
                ("dst_stride", ctypes.c_uint32 * 2), ("oob", ctypes.c_void_p)]


assert ctypes.sizeof(OneLayer) == 56 and ctypes.sizeof(Store) == 72 and Store.dst.offset == 48
assert ctypes.sizeof(StoreL2) == 72 and StoreL2.src_stride.offset == 48

os.makedirs(WORK, exist_ok=True)
subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
                "tests/bench/experiments/module_path.cu", "-o", f"{WORK}/libmodpath.so"], check=True)
subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "tests/bench/experiments/row_variants.cu",
                "-o", f"{WORK}/row_variants.cubin"], check=True)
mp = ctypes.CDLL(f"{WORK}/libmodpath.so")
mp.mp_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]
mp.mp_launch.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
assert mp.mp_init() == 0, "mp_init failed"
image = open(f"{WORK}/row_variants.cubin", "rb").read()
# name: (threads a block, or None for one a vector of the row)
TRANSFERS = {"t_lib": None, "t_src": None, "t_src128": 128, "t_pred": None, "t_seed": 128, "t_cold": None,
             "t_ool": None, "t_pred_oob": None}
STORES = {"s_lib": Store, "s_weak": Store, "s_nc": Store, "s_cold": Store, "s_sel": Store, "s_l2": StoreL2}
PICK = os.environ.get("EXP_RP_VARIANTS")  # comma-separated names to time (default: all)
if PICK:
    TRANSFERS = {k: v for k, v in TRANSFERS.items() if k in PICK.split(",")}
    STORES = {k: v for k, v in STORES.items() if k in PICK.split(",")}
slot = {}
for k, name in enumerate(list(TRANSFERS) + list(STORES)):
    rc = mp.mp_load(k, image, name.encode())
    assert rc == 0, f"mp_load {name}: CUresult {rc}"
    slot[name] = k

kvd = B.Kvd(os.environ["EXP_LIB"])


def launcher(name, gx, gy, threads, block):
    def call():
        rc = mp.mp_launch(slot[name], gx, gy, threads, ctypes.addressof(block), STREAM[0])
        assert rc == 0, f"{name}: CUresult {rc}"
    return call


def variants(sc):
    """{name: make} for case sc: the seed, the library, the module's variants, seedB; make() runs
    inside a capture (or outside, with STREAM None) and returns the call."""
    def on_stream(fn):
        def make():
            STREAM[0] = torch.cuda.current_stream().cuda_stream
            return fn
        return make

    out = {"seed": lambda: sc.seed,
           "lib": lambda: kvd.bind(sc.fname, sc.args, B.Launch(torch.cuda.current_stream().cuda_stream, 0, 0))}
    if sc.label.startswith("store"):
        vec = sc.row // 16
        src = (ctypes.c_void_p * 2)(sc.ks.data_ptr(), sc.vs.data_ptr())
        src_stride = (ctypes.c_uint32 * 2)(sc.ks.stride(0) * 2 // 16, sc.vs.stride(0) * 2 // 16)
        dst = (ctypes.c_void_p * 2)(sc.kpool.data_ptr(), sc.vpool.data_ptr())
        dst_stride = (ctypes.c_uint32 * 2)(vec, vec)
        blocks = {Store: Store(sc.loc.data_ptr(), src, src_stride, sc.kpool.shape[0], dst_stride, 0, dst, None),
                  StoreL2: StoreL2(sc.loc.data_ptr(), src, dst, sc.kpool.shape[0], 0, src_stride, dst_stride, None)}
        for name, layout in STORES.items():
            out[name] = on_stream(launcher(name, sc.N, 2, vec, blocks[layout]))
    else:
        vec = 1152 // 16
        blk = OneLayer(RowView(sc.di.data_ptr(), sc.si.data_ptr(), sc.src.data_ptr(), sc.dst.data_ptr(), vec, vec,
                               sc.src.shape[0], sc.dst.shape[0]), None)
        for name, threads in TRANSFERS.items():
            out[name] = on_stream(launcher(name, sc.si.numel(), 1, threads or vec, blk))
    out["seedB"] = out["seed"]
    return out


cases = [(sc, variants(sc)) for sc in small_cases(B, K, dev) if sc.label in ("store N=1", "store N=32", "mla L=64",
                                                                           "mla L=1024")]
for sc, makers in cases:
    for name, make in makers.items():
        sc.clear(); torch.cuda.synchronize()
        make()(); torch.cuda.synchronize()  # outside a capture: torch's current stream
        good = sc.right()
        print(f"check {sc.label} {name}: {'ok' if good else 'MISMATCH'}", flush=True)
        assert good

pace = GraphPace()
per = pace.rounds({sc.label: copy_groups(makers, DUP) for sc, makers in cases}, ROUNDS,
                  {sc.label: (sc.clear, sc.right) for sc, _ in cases}, lambda m: print(m, flush=True))
STREAM[0] = None
print(f"\nus per launch over {ROUNDS} rounds of {pace.launches} (flush, launch) pairs ({pace.how}):"
      " lowest / median of the lowest third / median")
for label, by in per.items():
    for name, xs in by.items():
        print(f"{label:12s} {name:11s} {modes(xs)}", flush=True)
paired(per, list(cases[0][1]) + [n for n in cases[-1][1] if n not in cases[0][1]], DUP,
       lambda m: print(m, flush=True))

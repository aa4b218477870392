#!/usr/bin/env python3
"""Round 14 experiment: the page-table gather's one-pass kernel (gather_even<int, 4, int64, int32>,
the bench's bs=1 and bs=64 cases) run four ways, against the seed:
- lib: the library's entry point (the kernel in the runtime's fat binary, launched with <<<>>>);
- mod: the same kernel source compiled to PTX here, assembled with ptxas for sm_90 and loaded as a
  module of its own (cuModuleLoadData), launched with cuLaunchKernel (module_path.cu);
- mod_req: mod with the kernel's .maxntid made .reqntid (the block size required, as Triton's PTX
  has it);
- mod_req_a: mod_req assembled for sm_90a (Triton's target).
EXP_MP_SEED=1 adds the seed's own kernel as Triton compiled it, through the same driver launch:
- seed_mod: its cubin as is; seed_ptxas: its PTX assembled by the local ptxas for sm_90a.
EXP_MP_EX=1 adds mod_ex and seed_modex: mod and seed_mod launched with cuLaunchKernelEx (no
attributes), as Triton's launcher launches.
EXP_MP_VARIANTS=1 adds gather_variants.cu's seventeen shapes between gather_even and the seed's kernel
(v_even ... v_pred; v_live and v_live16, round 17's: the library's gather_pred, its page shift
read or compiled in; v_seed_l1, v_live_l1x, v_live_p64: one element a thread on 48-, 56- and
64-byte blocks), loaded as one module of their own (EXP_MP_PICK=a,b,... times only those
ways, the seed and lib always); with EXP_MP_LONE=1 too, v_even and
v_seedlike also each alone in a module (lone_even, lone_seedlike).
Every way is checked against torch first (output poisoned).  Then, by default, EXP_ROUNDS rounds
of do_bench turns (L2 flushed) with the lowest turn, the median of the lowest third and the median
of all (EXP_MP_PARTIAL=<path>: every turn so far written there as JSON after each round); with
EXP_MP_GRAPH=1, rounds of graph replays instead (small_cases.GraphPace: 50 (flush, launch) pairs
in a CUDA graph, no host between launches), and EXP_MP_DUP=<n> captures each way n times over
(name#k, the copies' graphs made in turn: how far apart the same launch in separate graphs
lies); with EXP_NCU=1, six launches of each instead, the seed first, for ncu:

    EXP_LIB=<libkvdock_kernels.so> EXP_ROUNDS=16 python3 tests/bench/experiments/module_path.py
    EXP_LIB=<libkvdock_kernels.so> EXP_NCU=1 ncu --clock-control none --cache-control all \\
        --kernel-name regex:"_gather_page|gather_even" --metrics gpu__time_duration.sum --csv \\
        python3 tests/bench/experiments/module_path.py > r.csv

Run from the repository root with the seed at .peer, where nvcc and ptxas are on the PATH (it
builds module_path.cu and the PTX into EXP_MP_DIR, default /tmp/modpath).  Round 14's results:
tests/bench/results/2026-12-03-h200-round14.md; round 15's (graph replays):
tests/bench/results/2026-12-03-h200-round15.md."""
import ctypes, os, re, subprocess, sys
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from small_cases import GraphPace, modes
from triton.testing import do_bench
from tokenspeed_kernel.ops.kvcache import triton as K

ROUNDS = int(os.environ.get("EXP_ROUNDS", "12"))
WORK = os.environ.get("EXP_MP_DIR", "/tmp/modpath")
THREADS, VEC = 256, 4  # gather_even's block and vector (KVD_GATHER_EVEN_THREADS, int32 x 4)
dev = "cuda"; torch.manual_seed(0)
STREAM = [None]  # the stream the driver launches go to: None (legacy) but inside a graph capture


def sh(*cmd):
    subprocess.run(cmd, check=True)


def build():
    """libmodpath.so, and the three cubins with the entry's name."""
    os.makedirs(WORK, exist_ok=True)
    lib = f"{WORK}/libmodpath.so"
    sh("nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "tests/bench/experiments/module_path.cu",
       "-o", lib)
    ptx = f"{WORK}/gather.ptx"
    sh("nvcc", "-ptx", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", "-DNDEBUG", "-Ikernels/include",
       "-Ikernels/src", "kernels/src/cuda/gather.cu", "-o", ptx)
    text = open(ptx).read()
    m = re.search(r"\.entry\s+(\S*gather_evenIiLi4EliE\S*)\(", text)
    assert m, "gather_even<int, 4, int64, int32> not found in the PTX"
    name = m.group(1)
    # the entry's directives lie between its parameter list and its body
    head_end = text.index("{", m.end())
    head = text[m.start():head_end]
    assert f".maxntid {THREADS}, 1, 1" in head, head
    req = text[:m.start()] + head.replace(".maxntid", ".reqntid") + text[head_end:]
    req_a = re.sub(r"^\.target sm_90$", ".target sm_90a", req, count=1, flags=re.M)
    assert req_a != req, "no .target sm_90 line"
    cubins = {}
    for tag, src, arch in (("mod", text, "sm_90"), ("mod_req", req, "sm_90"), ("mod_req_a", req_a, "sm_90a")):
        p = f"{WORK}/{tag}.ptx"
        open(p, "w").write(src)
        sh("ptxas", "-O3", f"-arch={arch}", p, "-o", f"{WORK}/{tag}.cubin")
        cubins[tag] = open(f"{WORK}/{tag}.cubin", "rb").read()
    return lib, name, cubins


class GatherEven(ctypes.Structure):
    """gather.cu's GatherEven, field for field (80 bytes)."""
    _fields_ = [("req", ctypes.c_void_p), ("seq", ctypes.c_void_p), ("table", ctypes.c_void_p),
                ("table_rows", ctypes.c_uint64), ("table_stride", ctypes.c_uint32), ("cols", ctypes.c_uint32),
                ("max_pages", ctypes.c_uint32), ("page_shift", ctypes.c_uint32), ("out", ctypes.c_void_p),
                ("out_stride", ctypes.c_int64), ("dummy", ctypes.c_int64), ("oob", ctypes.c_void_p)]


assert ctypes.sizeof(GatherEven) == 80 and GatherEven.out.offset == 48


class GatherL1(ctypes.Structure):
    """gather_variants.cu's GatherL1 (48 bytes: the parameter bank's first line)."""
    _fields_ = [("req", ctypes.c_void_p), ("seq", ctypes.c_void_p), ("table", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("table_stride", ctypes.c_uint32), ("out_stride", ctypes.c_uint32),
                ("cols_shift", ctypes.c_uint32), ("max_pages", ctypes.c_uint32)]


class GatherL1Pad(ctypes.Structure):
    _fields_ = [("a", GatherL1), ("pad", ctypes.c_char * 32)]


class GatherL1X(ctypes.Structure):
    _fields_ = [("a", GatherL1), ("table_rows", ctypes.c_uint32), ("dummy", ctypes.c_int32)]


class GatherP64(ctypes.Structure):
    _fields_ = [("a", GatherL1X), ("oob", ctypes.c_void_p)]


assert [ctypes.sizeof(t) for t in (GatherL1, GatherL1Pad, GatherL1X, GatherP64)] == [48, 80, 56, 64]

def seed_kernels(g):
    """The seed's gather for case g as Triton compiled it, run through module_path.cu instead of
    Triton's launcher: its cubin as is (seed_mod) and its PTX assembled by the local ptxas
    (seed_ptxas), with the parameters Triton passes (the pointers and strides in the Python
    signature's order, then null scratch pointers).  {} when the compiled kernel is not what this
    expects (the reason printed)."""
    import triton
    grid = (g.bs, triton.cdiv(g.maxp, 128))
    ck = K._gather_page_table_with_padding_kernel[grid](g.table, g.rpi, g.seq, g.out, g.table.stride(0),
                                                         g.out.stride(0), g.maxp, 16, 0, BLOCK_COLS=128, num_warps=4)
    ptx, cubin = ck.asm.get("ptx"), ck.asm.get("cubin")
    m = re.search(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx or "")
    if not m or not cubin or getattr(ck.metadata, "shared", 0):
        print(f"seed module: skipped (asm keys {sorted(ck.asm)}, shared {getattr(ck.metadata, 'shared', '?')})")
        return {}
    name, types = m.group(1), re.findall(r"\.param\s+\.([usb](?:32|64))", m.group(2))
    print(f"seed module: {name}, params {types}, block {ck.metadata.num_warps * 32}", flush=True)
    want = [g.table.data_ptr(), g.rpi.data_ptr(), g.seq.data_ptr(), g.out.data_ptr(), g.table.stride(0),
            g.out.stride(0)]
    if len(types) < len(want) or any(t[1:] != "64" for t in types[:4]) or any(t[1:] != "64" for t in types[6:]):
        print("seed module: skipped (parameters not as expected)")
        return {}
    vals = [(ctypes.c_uint64 if t[1:] == "64" else ctypes.c_int32)(want[i] if i < len(want) else 0)
            for i, t in enumerate(types)]
    args = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    p = f"{WORK}/seed.ptx"
    open(p, "w").write(ptx)
    sh("ptxas", "-O3", "-arch=sm_90a", p, "-o", f"{WORK}/seed.cubin")
    out = {}
    for tag, image in (("seed_mod", cubin), ("seed_ptxas", open(f"{WORK}/seed.cubin", "rb").read())):
        k = len(slots) + len(more_slots)
        rc = mp.mp_load(k, image, name.encode())
        assert rc == 0, f"mp_load {tag}: CUresult {rc}"
        more_slots.append(k)
        out[tag] = lambda k=k, args=args, vals=vals: mp.mp_launch_args(
            k, grid[0], grid[1], ck.metadata.num_warps * 32, ctypes.addressof(args), STREAM[0])
        if os.environ.get("EXP_MP_EX") and tag == "seed_mod":
            out["seed_modex"] = lambda k=k, args=args, vals=vals: mp.mp_launch_ex(
                k, grid[0], grid[1], ck.metadata.num_warps * 32, None, ctypes.addressof(args), STREAM[0])
    return out


libpath, entry, cubins = build()
mp = ctypes.CDLL(libpath)
mp.mp_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]
mp.mp_launch.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
mp.mp_launch_args.argtypes = mp.mp_launch.argtypes
mp.mp_launch_ex.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p]
assert mp.mp_init() == 0, "mp_init failed"
slots, more_slots = {}, []  # more_slots: those loaded after the three mods
for k, (tag, image) in enumerate(cubins.items()):
    rc = mp.mp_load(k, image, entry.encode())
    assert rc == 0, f"mp_load {tag}: CUresult {rc}"
    slots[tag] = k
variants = {}  # tag: (slot, (bs, max_pages) -> (gx, gy, block))
if os.environ.get("EXP_MP_VARIANTS"):
    cdiv = lambda a, b: (a + b - 1) // b
    sh("nvcc", "-cubin", "-O3", "-arch=sm_90", "tests/bench/experiments/gather_variants.cu", "-o", f"{WORK}/variants.cubin")
    image = open(f"{WORK}/variants.cubin", "rb").read()
    even = lambda bs, m: (cdiv(m // 4, 256), bs, 256)
    for tag, shape, kind in (("v_even", even, "even"), ("v_even_nooob", even, "even"),
                             ("v_even_x", lambda bs, m: (bs, cdiv(m // 4, 256), 256), "even"),
                             ("v_even64", lambda bs, m: (cdiv(m // 4, 64), bs, 64), "even"),
                             ("v_narrow", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_seedlike", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_l1", even, "l1"), ("v_l1_pad", even, "l1pad"), ("v_l1_late", even, "l1x"),
                             ("v_l1_bound", even, "l1x"),
                             ("v_pred_seed", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_pred", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_live", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_live16", lambda bs, m: (bs, cdiv(m, 128), 128), "even"),
                             ("v_seed_l1", lambda bs, m: (bs, cdiv(m, 128), 128), "l1"),
                             ("v_live_l1x", lambda bs, m: (bs, cdiv(m, 128), 128), "l1x"),
                             ("v_live_p64", lambda bs, m: (bs, cdiv(m, 128), 128), "p64")):
        k = len(slots) + len(more_slots)
        rc = mp.mp_load(k, image, tag.encode())
        assert rc == 0, f"mp_load {tag}: CUresult {rc}"
        more_slots.append(k)
        variants[tag] = (k, shape, kind)
if os.environ.get("EXP_MP_LONE"):  # v_even and v_seedlike again, each alone in a module of its own
    for lone, (tag, shape) in enumerate((("v_even", even), ("v_seedlike", lambda bs, m: (bs, cdiv(m, 128), 128))), 1):
        sh("nvcc", "-cubin", "-O3", "-arch=sm_90", f"-DLONE={lone}", "tests/bench/experiments/gather_variants.cu",
           "-o", f"{WORK}/lone{lone}.cubin")
        k = len(slots) + len(more_slots)
        rc = mp.mp_load(k, open(f"{WORK}/lone{lone}.cubin", "rb").read(), tag.encode())
        assert rc == 0, f"mp_load lone {tag}: CUresult {rc}"
        more_slots.append(k)
        variants["lone_" + tag[2:]] = (k, shape, "even")
kvd = B.Kvd(os.environ["EXP_LIB"])
req_to_page = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)

cases = []
for bs, maxp in ((1, 256), (64, 2048)):
    g = B.GatherCase(req_to_page, bs, maxp)
    p = GatherEven(g.rpi.data_ptr(), g.seq.data_ptr(), req_to_page.data_ptr(), req_to_page.shape[0],
                   req_to_page.stride(0) * 4, min(req_to_page.shape[1], maxp), maxp, 4, g.out.data_ptr(),
                   g.out.stride(0) * 4, 0, None)
    gx = (maxp // VEC + THREADS - 1) // THREADS
    args = g.args()
    fns = {"seed": g.seed(K), "lib": kvd.bind("kvd_cuda_page_table_gather", args, B.Launch(None, 0, 0))}
    # in a capture the library is bound anew to the capture stream (the others read STREAM[0])
    relib = lambda args=args: kvd.bind("kvd_cuda_page_table_gather", args, B.Launch(STREAM[0], 0, 0))
    for tag, k in slots.items():
        fns[tag] = lambda k=k, p=p, gx=gx, bs=bs: mp.mp_launch(k, gx, bs, THREADS, ctypes.addressof(p), STREAM[0])
    if os.environ.get("EXP_MP_EX"):  # mod through cuLaunchKernelEx
        fns["mod_ex"] = lambda k=slots["mod"], p=p, gx=gx, bs=bs: mp.mp_launch_ex(k, gx, bs, THREADS,
                                                                                ctypes.addressof(p), None, STREAM[0])
    if os.environ.get("EXP_MP_SEED"):
        fns.update(seed_kernels(g))
    l1 = GatherL1(g.rpi.data_ptr(), g.seq.data_ptr(), req_to_page.data_ptr(), g.out.data_ptr(),
                  req_to_page.stride(0) * 4, g.out.stride(0) * 4, min(req_to_page.shape[1], maxp) | 4 << 27, maxp)
    blocks = {"even": p, "l1": l1, "l1pad": GatherL1Pad(l1), "l1x": GatherL1X(l1, req_to_page.shape[0], 0),
              "p64": GatherP64(GatherL1X(l1, req_to_page.shape[0], 0), None)}
    for tag, (k, shape, kind) in variants.items():
        gx, gy, bx = shape(bs, maxp)
        fns[tag] = lambda k=k, q=blocks[kind], gx=gx, gy=gy, bx=bx: mp.mp_launch(k, gx, gy, bx, ctypes.addressof(q),
                                                                                 STREAM[0])
    if os.environ.get("EXP_MP_PICK"):  # comma-separated ways to keep (the seed and lib always)
        fns = {n: f for n, f in fns.items() if n in ("seed", "lib") or n in os.environ["EXP_MP_PICK"].split(",")}
    for name, fn in fns.items():
        g.out.fill_(-1); fn(); torch.cuda.synchronize()
        ok = torch.equal(g.out, g.ref)
        print(f"check gather bs={bs} {name}: {'ok' if ok else 'MISMATCH'}", flush=True)
        assert ok
    cases.append((f"gather bs={bs}", fns, relib, g))

if os.environ.get("EXP_NCU"):
    for label, fns, _, _ in cases:
        for name, fn in fns.items():
            for _ in range(6):
                fn()
            torch.cuda.synchronize()
            print(f"ran {label} {name}", flush=True)
    sys.exit(0)

if os.environ.get("EXP_MP_GRAPH"):
    def maker(name, fn, relib):
        """name's call made inside a capture: on the capture stream."""
        def make():
            STREAM[0] = torch.cuda.current_stream().cuda_stream
            return relib() if name == "lib" else fn
        return make
    pace = GraphPace()
    dup = int(os.environ.get("EXP_MP_DUP", "1"))
    per = pace.rounds({label: {(name if dup == 1 else f"{name}#{k}"): maker(name, fn, relib)
                               for k in range(dup) for name, fn in fns.items()} for label, fns, relib, _ in cases},
                      ROUNDS, {label: (lambda g=g: g.out.fill_(-1), lambda g=g: torch.equal(g.out, g.ref))
                               for label, _, _, g in cases}, lambda m: print(m, flush=True))
    STREAM[0] = None
    print(f"\nus per launch over {ROUNDS} rounds of {pace.launches} (flush, launch) pairs ({pace.how}):"
          " lowest / median of the lowest third / median")
    for label, by in per.items():
        for name, xs in by.items():
            print(f"{label:13s} {name:13s} {modes(xs)}   " + " ".join(f"{v:.2f}" for v in xs), flush=True)
    sys.exit(0)

turns = {label: {name: [] for name in fns} for label, fns, _, _ in cases}
for r in range(ROUNDS):
    for label, fns, _, _ in cases:
        for name, fn in fns.items():
            turns[label][name].append(do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3)
    print(f"round {r + 1}/{ROUNDS}", flush=True)
    if os.environ.get("EXP_MP_PARTIAL"):  # every turn so far, for a run that may be cut short
        import json
        with open(os.environ["EXP_MP_PARTIAL"], "w") as f:
            json.dump(turns, f)
print(f"\nus over {ROUNDS} rounds: lowest turn / median of the lowest third / median")
for label, by in turns.items():
    for name, xs in by.items():
        print(f"{label:13s} {name:13s} {modes(xs)}   " + " ".join(f"{v:.2f}" for v in xs), flush=True)

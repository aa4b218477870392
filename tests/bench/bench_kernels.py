#!/usr/bin/env python3
"""kvdock kernels side by side with the seed's Triton kernels.

Runs every case of the peer harness (bench_seed.py: same shapes, the very
same tensors handed to both), plus the copy ceilings and a few rows the seed
has no counterpart for.  Before a case is timed, kvdock's result is checked
against torch's with torch.equal (fp8 as uint8), on a destination whose
target rows were cleared first, and the whole destination is compared where
that is cheap, so a stray write shows too.  Timing: triton.testing.do_bench
(warmup 25 ms, rep 200 ms, median; L2 flushed between runs), as the peer
harness does.  Bytes are counted as bench_seed.py counts them: read plus
written device bytes for device-to-device cases, bytes crossing PCIe for
host cases.

Usage (from the repository root, on the GPU machine):
    python3 tests/bench/bench_kernels.py [--lib build-gpu/kernels/libkvdock_kernels.so]
        [--peer .peer] [--only REGEX] [--repeat N]
The peer folder (bench_seed.py and tokenspeed_kernel/) is a copy of
shared/peer placed at <repo>/.peer.  Rows go to $OUT/kvdock_vs_seed.json
(OUT defaults to /tmp) and a markdown table is printed at the end.

--repeat N times the seed and kvdock N times each per row and reports the
median of the N medians (their spread goes to the JSON and the printed
row): the median of one do_bench call of a ~5 us kernel lands in one of
two modes about 0.6 us apart, the empty kernel's too, whichever kernel is
timed, so with N > 1 each row also gives the lowest of the N medians of
each side and their ratio ("lower"): the two kernels compared within one
mode.

Needs torch and triton only (no numpy).
"""
import argparse
import ctypes
import json
import math
import os
import re
import statistics
import sys
import time
import traceback
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------
# kernels.h, exactly: field order and types.  int32_t -> c_int32, int64_t ->
# c_int64, every pointer -> c_void_p, float -> c_float.

KVD_DTYPE_U8, KVD_DTYPE_I32, KVD_DTYPE_I64, KVD_DTYPE_F32 = 0, 1, 2, 3
KVD_DTYPE_F16, KVD_DTYPE_BF16, KVD_DTYPE_E4M3, KVD_DTYPE_E5M2 = 4, 5, 6, 7
KVD_LAUNCH_COPY_ENGINE = 1 << 0
KVD_SCALE_NONE, KVD_SCALE_HOST, KVD_SCALE_DEVICE, KVD_SCALE_PER_HEAD = 0, 1, 2, 3
KVD_KERNELS_ABI_VERSION = 1


class Launch(ctypes.Structure):
    _fields_ = [
        ("stream", c_void_p),
        ("max_blocks", c_uint32),
        ("flags", c_uint32),
    ]


class StoreArgs(ctypes.Structure):
    _fields_ = [
        ("k_src", c_void_p),
        ("v_src", c_void_p),
        ("k_src_stride", c_int64),
        ("v_src_stride", c_int64),
        ("k_dst", c_void_p),
        ("v_dst", c_void_p),
        ("k_dst_stride", c_int64),
        ("v_dst_stride", c_int64),
        ("num_slots", c_int64),
        ("loc", c_void_p),
        ("loc_dtype", c_int32),
        ("num_tokens", c_int64),
        ("row_bytes", c_int64),
        ("oob_count", c_void_p),
    ]


class Fp8SetArgs(ctypes.Structure):
    _fields_ = [
        ("k_src", c_void_p),
        ("v_src", c_void_p),
        ("src_dtype", c_int32),
        ("k_src_token_stride", c_int64),
        ("k_src_head_stride", c_int64),
        ("v_src_token_stride", c_int64),
        ("v_src_head_stride", c_int64),
        ("k_cache", c_void_p),
        ("v_cache", c_void_p),
        ("cache_dtype", c_int32),
        ("page_size", c_int64),
        ("k_page_stride", c_int64),
        ("k_slot_stride", c_int64),
        ("k_head_stride", c_int64),
        ("v_page_stride", c_int64),
        ("v_slot_stride", c_int64),
        ("v_head_stride", c_int64),
        ("num_slots", c_int64),
        ("num_heads", c_int64),
        ("head_dim", c_int64),
        ("loc", c_void_p),
        ("loc_dtype", c_int32),
        ("num_tokens", c_int64),
        ("scale_mode", c_int32),
        ("k_scale", c_float),
        ("v_scale", c_float),
        ("k_scale_ptr", c_void_p),
        ("v_scale_ptr", c_void_p),
        ("oob_count", c_void_p),
    ]


class GatherArgs(ctypes.Structure):
    _fields_ = [
        ("req_to_page", c_void_p),
        ("table_dtype", c_int32),
        ("table_rows", c_int64),
        ("table_cols", c_int64),
        ("table_stride", c_int64),
        ("req_pool_indices", c_void_p),
        ("req_dtype", c_int32),
        ("seq_lens", c_void_p),
        ("seq_lens_dtype", c_int32),
        ("out", c_void_p),
        ("out_stride", c_int64),
        ("bs", c_int64),
        ("max_num_pages", c_int64),
        ("page_size", c_int64),
        ("dummy_slot", c_int64),
        ("oob_count", c_void_p),
    ]


class KvSide(ctypes.Structure):
    _fields_ = [
        ("k", c_void_p),
        ("v", c_void_p),
        ("k_layers", c_void_p),
        ("v_layers", c_void_p),
        ("layer_stride", c_int64),
        ("slot_stride", c_int64),
        ("num_slots", c_int64),
    ]


class TransferArgs(ctypes.Structure):
    _fields_ = [
        ("src", KvSide),
        ("dst", KvSide),
        ("num_layers", c_int64),
        ("src_idx", c_void_p),
        ("dst_idx", c_void_p),
        ("idx_dtype", c_int32),
        ("count", c_int64),
        ("row_bytes", c_int64),
        ("oob_count", c_void_p),
    ]


def one_layer_transfer(src_k, src_v, dst_k, dst_v, si, di, row_bytes):
    """TransferArgs of a one-layer copy between slot tensors (src_v and dst_v None for MLA),
    int64 indices si -> di, rows row_bytes apart, no out-of-range counter."""
    a = TransferArgs()
    a.src = KvSide(src_k.data_ptr(), src_v.data_ptr() if src_v is not None else None, None, None, 0,
                   row_bytes, src_k.shape[0])
    a.dst = KvSide(dst_k.data_ptr(), dst_v.data_ptr() if dst_v is not None else None, None, None, 0,
                   row_bytes, dst_k.shape[0])
    a.num_layers, a.src_idx, a.dst_idx = 1, si.data_ptr(), di.data_ptr()
    a.idx_dtype, a.count, a.row_bytes, a.oob_count = KVD_DTYPE_I64, si.numel(), row_bytes, None
    return a


class GatherCase:
    """The seed bench's page-table gather at (bs, max_pages) over req_to_page (int32 rows of page
    numbers): bs random rows (int64 indices), random lengths in [1, max_pages * 16), page size 16,
    dummy 0.  out starts poisoned (-1); ref is what the gather must write there."""

    def __init__(self, req_to_page, bs, maxp):
        import torch
        dev = req_to_page.device
        self.table, self.bs, self.maxp = req_to_page, bs, maxp
        self.rpi = torch.randperm(req_to_page.shape[0], device=dev)[:bs]
        self.seq = torch.randint(1, maxp * 16, (bs,), dtype=torch.int32, device=dev)
        self.out = torch.full((bs, maxp), -1, dtype=torch.int32, device=dev)
        col = torch.arange(maxp, device=dev)
        self.ref = torch.where(col[None, :] < ((self.seq + 15) // 16)[:, None], req_to_page[self.rpi, :maxp], 0)

    def args(self, oob_ptr=None):
        """The library's arguments for this case."""
        t = self.table
        return GatherArgs(t.data_ptr(), KVD_DTYPE_I32, t.shape[0], t.shape[1], t.stride(0) * 4,
                          self.rpi.data_ptr(), KVD_DTYPE_I64, self.seq.data_ptr(), KVD_DTYPE_I32,
                          self.out.data_ptr(), self.out.stride(0) * 4, self.bs, self.maxp, 16, 0, oob_ptr)

    def seed(self, K):
        """The seed's gather (K: its kvcache triton module) on this case."""
        return lambda: K.gather_page_table_with_padding(self.table, self.rpi, self.seq, self.out, bs=self.bs,
                                                         max_num_pages=self.maxp, page_size=16, dummy_slot=0)


# sizeof / offsetof from the C compiler on x86-64 (LP64), kernels.h ABI 1.
_LAYOUT = {
    Launch: (16, {}),
    StoreArgs: (112, {"oob_count": 104}),
    Fp8SetArgs: (224, {"k_scale": 188, "oob_count": 216}),
    GatherArgs: (128, {"oob_count": 120}),
    KvSide: (56, {}),
    TransferArgs: (168, {"dst": 56, "oob_count": 160}),
}


def check_layout():
    for cls, (size, offs) in _LAYOUT.items():
        assert ctypes.sizeof(cls) == size, f"{cls.__name__}: ctypes size {ctypes.sizeof(cls)} != C {size}"
        for f, off in offs.items():
            got = getattr(cls, f).offset
            assert got == off, f"{cls.__name__}.{f}: ctypes offset {got} != C {off}"


# Each entry point's argument structure (its second argument is a Launch).
ENTRY_ARGS = {"kvd_cuda_kv_store": StoreArgs, "kvd_cuda_fp8_set": Fp8SetArgs,
              "kvd_cuda_page_table_gather": GatherArgs, "kvd_cuda_kv_transfer": TransferArgs}


class KvdError(Exception):
    def __init__(self, what, name, detail):
        super().__init__(f"{what}: KVD_{name}: {detail}")
        self.name, self.detail = name, detail


class Kvd:
    """The library through ctypes; every status is checked."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(str(path))
        lib.kvd_err_name.argtypes = [c_int]
        lib.kvd_err_name.restype = c_char_p
        lib.kvd_last_error_detail.argtypes = []
        lib.kvd_last_error_detail.restype = c_char_p
        lib.kvd_kernels_abi_version.argtypes = []
        lib.kvd_kernels_abi_version.restype = c_int
        lib.kvd_cuda_probe.argtypes = [c_char_p, c_size_t]
        lib.kvd_cuda_probe.restype = c_int
        for name, cls in ENTRY_ARGS.items():
            fn = getattr(lib, name)
            fn.argtypes = [POINTER(cls), POINTER(Launch)]
            fn.restype = c_int
        abi = lib.kvd_kernels_abi_version()
        if abi != KVD_KERNELS_ABI_VERSION:
            raise SystemExit(f"{path}: ABI {abi}, this script speaks {KVD_KERNELS_ABI_VERSION}")
        why = ctypes.create_string_buffer(256)
        st = lib.kvd_cuda_probe(why, 256)
        if st != 0:
            raise SystemExit(f"kvd_cuda_probe: KVD_{self.err_name(st)}: {why.value.decode()}")

    def err_name(self, st):
        return (self.lib.kvd_err_name(st) or b"?").decode()

    def detail(self):
        return (self.lib.kvd_last_error_detail() or b"").decode()

    def bind(self, fname, args, launch):
        """A no-argument callable running one op with prebuilt arguments
        (ctypes work kept out of the timed call)."""
        fn = getattr(self.lib, fname)
        pa, pl = byref(args), (byref(launch) if launch is not None else None)
        keep = (args, launch)

        def call():
            st = fn(pa, pl)
            if st != 0:
                raise KvdError(fname, self.err_name(st), self.detail())
            return keep

        return call


# --------------------------------------------------------------------------
# Rows

ROWS = []
CEIL = {}  # kind -> GB/s


def us(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


REPEAT = 1  # --repeat
ROW_BUDGET_S = 4.0  # --row-seconds: repeats stop once a row has taken this long
T0 = time.time()


def us_rep(fn):
    """Median over REPEAT calls of us(fn) (within ROW_BUDGET_S), and every
    call's value."""
    v, t0 = [], time.time()
    while len(v) < REPEAT and (not v or time.time() - t0 < ROW_BUDGET_S):
        v.append(us(fn))
    return statistics.median(v), v


def fmt_us(v):
    return f"{v:10.2f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>10s}"


def print_row(r):
    seed = fmt_us(r.get("seed_us")) if "seed_error" not in r else f"{'FAILED':>10s}"
    kvd = fmt_us(r.get("kvdock_us")) if "kvdock_error" not in r else f"{'ERROR':>10s}"
    ratio = f"{r['ratio']:7.2f}x" if r.get("ratio") else f"{'-':>8s}"
    gbps = f"{r['kvdock_gbps']:8.1f}" if r.get("kvdock_gbps") else f"{'-':>8s}"
    share = f"{100 * r['ceiling_share']:6.1f}%" if r.get("ceiling_share") else f"{'-':>7s}"
    line = f"{r['op']:30s} {r['case']:44s} seed {seed}us  kvdock {kvd}us  {ratio}  {gbps}GB/s  {share} of {r.get('kind', '?')}"
    for k in ("seed", "kvdock"):
        if len(r.get(f"{k}_us_all", [])) > 1:
            line += f"  [{k} {min(r[k + '_us_all']):.2f}-{max(r[k + '_us_all']):.2f}]"
    if r.get("lower_ratio"):
        line += f"  lower {r['lower_ratio']:.2f}x"
    line += f"  (t={time.time() - T0:.0f}s)"
    for k in ("seed_error", "kvdock_error", "note"):
        if r.get(k):
            line += f"\n    {k}: {r[k]}"
    print(line, flush=True)


def mismatch(r, why):
    r["mismatch"] = why
    print(f"\n!!!!!!!! MISMATCH {r['op']} {r['case']}: {why} !!!!!!!!\n", flush=True)


def run_case(op, case, kind, nbytes, seed_fn, kvd_fn, check=None, prep=None, note=None, seed_us=None,
             checked_fn=None):
    """Time the seed once; then prep() (clear the rows kvdock will write),
    one kvdock call (checked_fn: the same call with an oob counter, or
    kvd_fn), check() (None when right, else why not); then time kvd_fn and
    the seed in turns, REPEAT times each (within ROW_BUDGET_S), so that
    both see the same states of the card (one do_bench call's median moves
    by about 0.5 us from call to call on small cases).  seed_us given:
    reuse that seed time instead of timing the seed again."""
    import torch
    r = dict(op=op, case=case, kind=kind, bytes=nbytes)
    if note:
        r["note"] = note
    if seed_us is not None:
        r["seed_us"] = seed_us
    elif seed_fn is not None:
        try:
            r["seed_us_all"] = [us(seed_fn)]
        except Exception as e:  # the seed's own failure is data
            r["seed_error"] = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            try:
                torch.cuda.synchronize()
            except Exception as e2:
                r["seed_error"] += f" (then: {e2})"
    try:
        if prep:
            prep()
            torch.cuda.synchronize()
        (checked_fn or kvd_fn)()
        torch.cuda.synchronize()
        if check:
            why = check()
            if why:
                mismatch(r, why)
        seed_more = "seed_us_all" in r
        r["kvdock_us_all"] = [us(kvd_fn)]
        t0 = time.time()
        while len(r["kvdock_us_all"]) < REPEAT and time.time() - t0 < ROW_BUDGET_S:
            if seed_more:
                r["seed_us_all"].append(us(seed_fn))
            r["kvdock_us_all"].append(us(kvd_fn))
    except KvdError as e:
        r["kvdock_error"] = f"KVD_{e.name}: {e.detail}"
    except Exception as e:
        r["kvdock_error"] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc()
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    for who in ("seed", "kvdock"):
        if r.get(f"{who}_us_all") and f"{who}_error" not in r:
            r[f"{who}_us"] = statistics.median(r[f"{who}_us_all"])
    s, k = r.get("seed_us"), r.get("kvdock_us")
    if s and k:
        r["ratio"] = s / k
        if len(r.get("seed_us_all", [])) > 1 and len(r["kvdock_us_all"]) > 1:
            r["seed_lower_us"], r["kvdock_lower_us"] = min(r["seed_us_all"]), min(r["kvdock_us_all"])
            r["lower_ratio"] = r["seed_lower_us"] / r["kvdock_lower_us"]
    if s:
        r["seed_gbps"] = nbytes / s / 1e3
    if k:
        r["kvdock_gbps"] = nbytes / k / 1e3
        if CEIL.get(kind):
            r["ceiling_share"] = r["kvdock_gbps"] / CEIL[kind]
        if kind == "d2d":
            c = size_ceiling(nbytes)
            r["size_ceiling_us"] = c
            r["size_ceiling_share"] = c / k
            r["note"] = (r.get("note", "") + "; " if r.get("note") else "") + \
                f"copy of the same bytes: {c:.2f} us ({100 * c / k:.1f}% of it)"
    ROWS.append(r)
    print_row(r)
    return r


_SIZE_CEIL = {}


def size_ceiling(nbytes):
    """Time of a plain device copy (torch copy_) moving the same bytes
    (nbytes read + written), the floor for a case of that size: launch,
    ramp-up and tail included."""
    import torch
    if nbytes not in _SIZE_CEIL:
        n = max(1, nbytes // 2)
        a = torch.empty(n, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        _SIZE_CEIL[nbytes] = us(lambda: b.copy_(a))
    return _SIZE_CEIL[nbytes]


def ceiling(kind, case, nbytes, fn, what="torch copy_"):
    t, ts = us_rep(fn)
    CEIL[kind] = nbytes / t / 1e3
    r = dict(op=f"ceiling_{kind}", case=case, kind=kind, bytes=nbytes, torch_us=t, torch_gbps=CEIL[kind],
             note=f"{what} {t:.2f} us = {CEIL[kind]:.1f} GB/s")
    if len(ts) > 1:
        r["torch_us_all"] = ts
    ROWS.append(r)
    print_row(r)


def eq(a, b):
    """torch.equal on one device (the first tensor's), same shape and dtype."""
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b.to(a.device))


def finite_or_none(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite_or_none(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite_or_none(x) for x in v]
    return v


# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=str(REPO / "build/kernels/libkvdock_kernels.so"),
                    help="libkvdock_kernels.so (default: build/kernels/ under the repo root)")
    ap.add_argument("--peer", default=str(REPO / ".peer"),
                    help="folder with bench_seed.py and tokenspeed_kernel/ (default: <repo>/.peer)")
    ap.add_argument("--only", default=None,
                    help="regex: run only rows whose 'op case' matches (variants such as '... copy_engine' and '... contiguous' are rows of their own)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each row's seed and kvdock this many times, in turns (within "
                         "--row-seconds); report the medians (default 1)")
    ap.add_argument("--row-seconds", type=float, default=4.0,
                    help="stop repeating a row once it has taken this long (default %(default)s)")
    opt = ap.parse_args()
    global REPEAT, ROW_BUDGET_S
    REPEAT = max(1, opt.repeat)
    ROW_BUDGET_S = opt.row_seconds

    check_layout()
    peer = Path(opt.peer)
    if not (peer / "tokenspeed_kernel").is_dir():
        raise SystemExit(f"no seed at {peer}: copy shared/peer to <repo>/.peer (or pass --peer)")
    lib_path = Path(opt.lib)
    if not lib_path.is_absolute() and not lib_path.exists():
        lib_path = REPO / lib_path
    if not lib_path.exists():
        raise SystemExit(f"no library at {lib_path}: build kvdock_kernels_shared first (or pass --lib)")
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch
    import triton
    sys.path.insert(0, str(peer))
    from tokenspeed_kernel.ops.kvcache import triton as K

    kvd = Kvd(lib_path)
    dev = "cuda"
    torch.manual_seed(0)
    print(f"kvdock bench: {torch.cuda.get_device_name()} torch {torch.__version__} (CUDA {torch.version.cuda}) "
          f"triton {triton.__version__}; lib {lib_path}; seed {peer}", flush=True)
    only = re.compile(opt.only) if opt.only else None

    def want(op, case):
        return only is None or bool(only.search(f"{op} {case}"))

    def launch(max_blocks=0, flags=0):
        return Launch(torch.cuda.current_stream().cuda_stream or None, max_blocks, flags)

    def oob_tensor():
        return torch.zeros(1, dtype=torch.int64, device=dev)

    def oob_zero(t):
        v = int(t.item())
        return None if v == 0 else f"oob_count = {v}, expected 0"

    t_start = time.time()

    # ---- ceilings ---------------------------------------------------------
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_()
    y = torch.empty_like(x)
    ceiling("d2d", "1GiB torch copy_", 2 << 30, lambda: y.copy_(x))
    h = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    ceiling("h2d", "1GiB pinned torch copy_", 1 << 30, lambda: x.copy_(h, non_blocking=True))
    ceiling("d2h", "1GiB pinned torch copy_", 1 << 30, lambda: h.copy_(x, non_blocking=True))
    x = y = h = None  # release
    # The smallest kernel that reads and writes memory: launch and event
    # overhead after an L2 flush, the floor of every small case.
    t1 = torch.ones(1, device=dev)
    t2 = torch.empty_like(t1)
    ceiling("floor", "one-element torch copy_", 8, lambda: t2.copy_(t1))
    # The launch alone: a kernel that touches no memory (torch's spin kernel
    # for 0 cycles).  Under this method every kernel costs at least this.
    ceiling("floor_empty", "empty kernel (torch.cuda._sleep(0))", 0, lambda: torch.cuda._sleep(0),
            what="empty kernel")

    H, D = 8, 128
    P = 1 << 20
    row = H * D * 2

    # ---- store_kv_cache ---------------------------------------------------
    kpool = torch.randn(P, H, D, dtype=torch.bfloat16, device=dev)
    vpool = torch.randn_like(kpool)
    for N in [1, 32, 512, 8192, 65536]:
        ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev)
        vs = torch.randn_like(ks)
        loc = torch.randperm(P, device=dev)[:N]
        case = f"N={N} H8 D128 bf16"
        if not want("store_kv_cache", case):
            continue
        oob = oob_tensor()

        def mk(oob_ptr):
            return StoreArgs(ks.data_ptr(), vs.data_ptr(), ks.stride(0) * 2, vs.stride(0) * 2,
                             kpool.data_ptr(), vpool.data_ptr(), kpool.stride(0) * 2, vpool.stride(0) * 2,
                             P, loc.data_ptr(), KVD_DTYPE_I64, N, row, oob_ptr)

        exp = {}

        def prep():
            kpool[loc] = 0
            vpool[loc] = 0
            torch.cuda.synchronize()
            exp["k"], exp["v"] = kpool.clone(), vpool.clone()
            exp["k"][loc] = ks
            exp["v"][loc] = vs

        checked = kvd.bind("kvd_cuda_kv_store", mk(oob.data_ptr()), launch())

        def check():
            if not eq(kpool[loc], ks) or not eq(vpool[loc], vs):
                return "pool[loc] != source rows"
            if not eq(kpool, exp["k"]) or not eq(vpool, exp["v"]):
                return "rows outside loc changed"
            return oob_zero(oob)

        timed = kvd.bind("kvd_cuda_kv_store", mk(None), launch())
        run_case("store_kv_cache", case, "d2d", 2 * 2 * N * H * D * 2,
                 lambda: K.store_kv_cache(ks, vs, kpool, vpool, loc), timed,
                 check=check, prep=prep, checked_fn=checked)
        exp.clear()
    kpool = vpool = None  # release

    # ---- fused_fp8_set_kv_buffer ------------------------------------------
    page = 16
    kc = torch.zeros(P // page, page, H, D, dtype=torch.float8_e4m3fn, device=dev)
    vc = torch.zeros_like(kc)
    for N in [1, 32, 512, 8192, 65536]:
        ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev)
        vs = torch.randn_like(ks)
        loc = torch.randperm(P, device=dev)[:N]
        ksc = torch.tensor(0.5, device=dev)
        vsc = torch.tensor(0.25, device=dev)
        case = f"N={N} page16 scaled"
        if not want("fused_fp8_set_kv_buffer", case):
            continue
        ref_k = (ks.float() / 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
        ref_v = (vs.float() / 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
        kflat, vflat = kc.view(torch.uint8).view(-1, H, D), vc.view(torch.uint8).view(-1, H, D)
        oob = oob_tensor()

        def mk(mode, oob_ptr):
            return Fp8SetArgs(
                ks.data_ptr(), vs.data_ptr(), KVD_DTYPE_BF16,
                ks.stride(0) * 2, ks.stride(1) * 2, vs.stride(0) * 2, vs.stride(1) * 2,
                kc.data_ptr(), vc.data_ptr(), KVD_DTYPE_E4M3, page,
                kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
                P, H, D, loc.data_ptr(), KVD_DTYPE_I64, N, mode,
                0.5 if mode == KVD_SCALE_HOST else 1.0, 0.25 if mode == KVD_SCALE_HOST else 1.0,
                ksc.data_ptr() if mode == KVD_SCALE_DEVICE else None,
                vsc.data_ptr() if mode == KVD_SCALE_DEVICE else None, oob_ptr)

        exp = {}

        def prep():
            kflat[loc] = 0
            vflat[loc] = 0
            torch.cuda.synchronize()
            exp["k"], exp["v"] = kflat.clone(), vflat.clone()
            exp["k"][loc] = ref_k
            exp["v"][loc] = ref_v

        def check():
            if not eq(kflat[loc], ref_k) or not eq(vflat[loc], ref_v):
                return "cache[loc] != fp8(src / scale)"
            if not eq(kflat, exp["k"]) or not eq(vflat, exp["v"]):
                return "bytes outside loc changed"
            return oob_zero(oob)

        nbytes = N * H * D * (2 + 1) * 2
        seed_row = None
        for mode, suffix in [(KVD_SCALE_DEVICE, ""), (KVD_SCALE_HOST, " host-scale")]:
            checked = kvd.bind("kvd_cuda_fp8_set", mk(mode, oob.data_ptr()), launch())
            timed = kvd.bind("kvd_cuda_fp8_set", mk(mode, None), launch())
            oob.zero_()
            seed_row = run_case(
                "fused_fp8_set_kv_buffer", case + suffix, "d2d", nbytes,
                lambda: K.fused_fp8_set_kv_buffer(ks, vs, kc, vc, loc, ksc, vsc, page_size=page), timed,
                check=check, prep=prep, checked_fn=checked,
                seed_us=seed_row.get("seed_us", float("nan")) if seed_row and suffix else None,
                note="kvdock: KVD_SCALE_DEVICE with the seed's scale tensors" if not suffix
                else "kvdock: KVD_SCALE_HOST 0.5/0.25; seed time from the row above")
            exp.clear()
    kc = vc = None  # release

    # ---- gather_page_table ------------------------------------------------
    for bs, maxp in [(1, 256), (64, 2048), (512, 8192)]:
        req_to_page = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)
        g = GatherCase(req_to_page, bs, maxp)
        case = f"bs={bs} max_pages={maxp}"
        if not want("gather_page_table", case):
            continue
        oob = oob_tensor()
        checked = kvd.bind("kvd_cuda_page_table_gather", g.args(oob.data_ptr()), launch())
        timed = kvd.bind("kvd_cuda_page_table_gather", g.args(), launch())
        run_case("gather_page_table", case, "d2d", bs * maxp * 4 * 2, g.seed(K), timed,
                 check=lambda g=g, oob=oob: "out != torch reference" if not eq(g.out, g.ref) else oob_zero(oob),
                 prep=lambda g=g: g.out.fill_(-1), checked_fn=checked)

    # ---- per-layer transfers ----------------------------------------------
    P2 = 1 << 19

    def xfer_args(src_k, src_v, dst_k, dst_v, si, di, item, oob_ptr, nslots_src, nslots_dst,
                  stride_src, stride_dst, layers=1, tables=False):
        a = TransferArgs()
        if tables:
            a.src = KvSide(None, None, src_k, src_v, 0, stride_src, nslots_src)
            a.dst = KvSide(None, None, dst_k, dst_v, 0, stride_dst, nslots_dst)
        else:
            a.src = KvSide(src_k, src_v, None, None, 0, stride_src, nslots_src)
            a.dst = KvSide(dst_k, dst_v, None, None, 0, stride_dst, nslots_dst)
        a.num_layers, a.src_idx, a.dst_idx = layers, si, di
        a.idx_dtype, a.count, a.row_bytes, a.oob_count = KVD_DTYPE_I64, 0, item, oob_ptr
        return a

    src_k = torch.randn(P2, H, D, dtype=torch.bfloat16, device=dev)
    src_v = torch.randn_like(src_k)
    dst_k = torch.empty_like(src_k)
    dst_v = torch.empty_like(src_k)
    for L in [64, 1024, 16384, 131072]:
        si = torch.randperm(P2, device=dev)[:L]
        di = torch.randperm(P2, device=dev)[:L]
        case = f"L={L} item2048"
        if not want("transfer_kv_per_layer", case):
            continue
        oob = oob_tensor()

        def mk(oob_ptr):
            a = xfer_args(src_k.data_ptr(), src_v.data_ptr(), dst_k.data_ptr(), dst_v.data_ptr(),
                          si.data_ptr(), di.data_ptr(), row, oob_ptr, P2, P2, src_k.stride(0) * 2,
                          dst_k.stride(0) * 2)
            a.count = L
            return a

        exp = {}

        def prep():
            dst_k[di] = 0
            dst_v[di] = 0
            torch.cuda.synchronize()
            exp["k"], exp["v"] = dst_k.clone(), dst_v.clone()
            exp["k"][di] = src_k[si]
            exp["v"][di] = src_v[si]

        def check():
            if not eq(dst_k, exp["k"]) or not eq(dst_v, exp["v"]):
                return "dst != dst with dst[di] = src[si]"
            return oob_zero(oob)

        checked = kvd.bind("kvd_cuda_kv_transfer", mk(oob.data_ptr()), launch())
        timed = kvd.bind("kvd_cuda_kv_transfer", mk(None), launch())
        run_case("transfer_kv_per_layer", case, "d2d", 2 * 2 * L * H * D * 2,
                 lambda: K.transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, si, di, H * D * 2), timed,
                 check=check, prep=prep, checked_fn=checked)
        exp.clear()
        if L >= 16384 and want("transfer_kv_per_layer", case + " contiguous"):
            # the same rows in slot order: what random slots cost in DRAM locality
            ci = torch.arange(L, device=dev)
            ac = mk(None)
            ac.src_idx, ac.dst_idx = ci.data_ptr(), ci.data_ptr()
            run_case("transfer_kv_per_layer", case + " contiguous", "d2d", 2 * 2 * L * H * D * 2, None,
                     kvd.bind("kvd_cuda_kv_transfer", ac, launch()),
                     check=lambda: None if eq(dst_k[:L], src_k[:L]) and eq(dst_v[:L], src_v[:L])
                     else "dst[:L] != src[:L]",
                     note="kvdock only: slots 0..L-1 on both sides")
    src_k = src_v = dst_k = dst_v = None  # release

    src = torch.randn(P2, 1, 576, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    for L in [64, 1024, 16384, 131072]:
        si = torch.randperm(P2, device=dev)[:L]
        di = torch.randperm(P2, device=dev)[:L]
        case = f"L={L} item1152"
        if not want("transfer_kv_per_layer_mla", case):
            continue
        oob = oob_tensor()

        def mk(oob_ptr):
            a = xfer_args(src.data_ptr(), None, dst.data_ptr(), None, si.data_ptr(), di.data_ptr(), 1152,
                          oob_ptr, P2, P2, src.stride(0) * 2, dst.stride(0) * 2)
            a.count = L
            return a

        exp = {}

        def prep():
            dst[di] = 0
            torch.cuda.synchronize()
            exp["d"] = dst.clone()
            exp["d"][di] = src[si]

        checked = kvd.bind("kvd_cuda_kv_transfer", mk(oob.data_ptr()), launch())
        timed = kvd.bind("kvd_cuda_kv_transfer", mk(None), launch())
        run_case("transfer_kv_per_layer_mla", case, "d2d", 2 * L * 1152,
                 lambda: K.transfer_kv_per_layer_mla(src, dst, si, di, 1152), timed,
                 check=lambda: ("dst != dst with dst[di] = src[si]" if not eq(dst, exp["d"]) else oob_zero(oob)),
                 prep=prep, checked_fn=checked)
        exp.clear()
        if L >= 16384 and want("transfer_kv_per_layer_mla", case + " contiguous"):
            # the same rows in slot order: what random slots cost in DRAM locality
            ci = torch.arange(L, device=dev)
            ac = mk(None)
            ac.src_idx, ac.dst_idx = ci.data_ptr(), ci.data_ptr()
            run_case("transfer_kv_per_layer_mla", case + " contiguous", "d2d", 2 * L * 1152, None,
                     kvd.bind("kvd_cuda_kv_transfer", ac, launch()),
                     check=lambda: None if eq(dst[:L], src[:L]) else "dst[:L] != src[:L]",
                     note="kvdock only: slots 0..L-1 on both sides")
    src = dst = None  # release

    # ---- all-layer transfers ----------------------------------------------
    def layers(n, slots, shape, host=False):
        if host:  # pinned, filled from the GPU, not drawn on the CPU (4 G numbers a kind)
            out = []
            for _ in range(n):
                t = torch.empty(slots, *shape, dtype=torch.bfloat16, pin_memory=True)
                t.copy_(torch.randn(slots, *shape, dtype=torch.bfloat16, device=dev))
                out.append(t)
            return out
        return [torch.randn(slots, *shape, dtype=torch.bfloat16, device=dev) for _ in range(n)]

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64, device=dev)

    def host_ptrs(ts):  # host-readable tables for the copy-engine path
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64).pin_memory()

    def on(t, like):
        return t.to(like.device)

    expected = []  # per buffer kind: {layer: expected whole layer}

    def all_layer_check(srcs, dsts, si, di, oob):
        """Every layer: dst[l][di] == src[l][si]; layers 0 and last: nothing
        else changed (expected copies made by all_layer_prep)."""
        for bufs_s, bufs_d, exp in zip(srcs, dsts, expected):
            for l in range(len(bufs_s)):
                got = bufs_d[l][on(di, bufs_d[l])]
                want_ = bufs_s[l][on(si, bufs_s[l])]
                if not (eq(got, want_) if got.is_cuda else eq(want_, got)):
                    return f"layer {l}: dst[di] != src[si]"
            for l, e in exp.items():
                if not eq(bufs_d[l], e):
                    return f"layer {l}: rows outside di changed"
        return oob_zero(oob)

    def all_layer_prep(srcs, dsts, si, di):
        expected.clear()
        for bufs_s, bufs_d in zip(srcs, dsts):
            for l in range(len(bufs_d)):
                bufs_d[l][on(di, bufs_d[l])] = 0
            torch.cuda.synchronize()
            exp = {}
            for l in sorted({0, len(bufs_d) - 1}):
                e = bufs_d[l].clone()
                e[on(di, e)] = on(bufs_s[l][on(si, bufs_s[l])], e)
                exp[l] = e
            expected.append(exp)

    NL, SL = 32, 1 << 16
    for kind in ["d2d", "d2h", "h2d"]:
        if only is not None and not any(want("transfer_kv_all_layer", f"{kind} L={L} layers32 item2048")
                                        for L in [64, 1024, 16384]):
            continue
        sk = layers(NL, SL, (H, D), host=(kind == "h2d"))
        sv = layers(NL, SL, (H, D), host=(kind == "h2d"))
        dk = layers(NL, SL, (H, D), host=(kind == "d2h"))
        dv = layers(NL, SL, (H, D), host=(kind == "d2h"))
        psk, psv, pdk, pdv = ptrs(sk), ptrs(sv), ptrs(dk), ptrs(dv)
        hsk, hsv, hdk, hdv = host_ptrs(sk), host_ptrs(sv), host_ptrs(dk), host_ptrs(dv)
        for L in [64, 1024, 16384]:
            si = torch.randperm(SL, device=dev)[:L]
            di = torch.randperm(SL, device=dev)[:L]
            case = f"{kind} L={L} layers32 item2048"
            if not want("transfer_kv_all_layer", case):
                continue
            nbytes = 2 * 2 * L * NL * H * D * 2 if kind == "d2d" else 2 * L * NL * H * D * 2
            oob = oob_tensor()
            si_h, di_h = si.cpu().pin_memory(), di.cpu().pin_memory()
            oob_h = torch.zeros(1, dtype=torch.int64).pin_memory()

            def mk(oob_ptr, host_meta=False):
                t = (hsk, hsv, hdk, hdv) if host_meta else (psk, psv, pdk, pdv)
                ix = (si_h, di_h) if host_meta else (si, di)
                a = xfer_args(t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), t[3].data_ptr(),
                              ix[0].data_ptr(), ix[1].data_ptr(), row, oob_ptr, SL, SL, row, row,
                              layers=NL, tables=True)
                a.count = L
                return a

            variants = [("", 0, 0, False)]
            if kind != "d2d":
                variants += [(" max_blocks=8", 8, 0, False)]
                if L <= 1024:  # per-row copy-engine batches are slow: keep the run short
                    variants += [(" copy_engine", 0, KVD_LAUNCH_COPY_ENGINE, True)]
            seed_us = None
            for suffix, mb, fl, host_meta in variants:
                if suffix and not want("transfer_kv_all_layer", case + suffix):
                    continue
                o = oob_h if host_meta else oob
                o.zero_()
                checked = kvd.bind("kvd_cuda_kv_transfer", mk(o.data_ptr(), host_meta), launch(mb, fl))
                timed = kvd.bind("kvd_cuda_kv_transfer", mk(None, host_meta), launch(mb, fl))
                r = run_case(
                    "transfer_kv_all_layer", case + suffix, kind, nbytes,
                    lambda: K.transfer_kv_all_layer(psk, pdk, psv, pdv, si, di, H * D * 2, NL), timed,
                    check=lambda o=o: all_layer_check((sk, sv), (dk, dv), si, di, o),
                    prep=lambda: all_layer_prep((sk, sv), (dk, dv), si, di), checked_fn=checked,
                    seed_us=seed_us,
                    note=None if not suffix else
                    ("host-readable tables and indices (pinned); " if host_meta else "") + "seed time from the first row")
                if not suffix:
                    seed_us = r.get("seed_us", float("nan"))
                expected.clear()
        sk = sv = dk = dv = psk = psv = pdk = pdv = hsk = hsv = hdk = hdv = None  # release

    NL = 61
    for kind in ["d2d", "d2h", "h2d"]:
        if only is not None and not any(want("transfer_kv_all_layer_mla", f"{kind} L={L} layers61 item1152")
                                        for L in [64, 1024, 16384]):
            continue
        s = layers(NL, SL, (1, 576), host=(kind == "h2d"))
        d = layers(NL, SL, (1, 576), host=(kind == "d2h"))
        ps, pd = ptrs(s), ptrs(d)
        hs, hd = host_ptrs(s), host_ptrs(d)
        for L in [64, 1024, 16384]:
            si = torch.randperm(SL, device=dev)[:L]
            di = torch.randperm(SL, device=dev)[:L]
            case = f"{kind} L={L} layers61 item1152"
            if not want("transfer_kv_all_layer_mla", case):
                continue
            nbytes = (2 if kind == "d2d" else 1) * L * NL * 1152
            oob = oob_tensor()
            si_h, di_h = si.cpu().pin_memory(), di.cpu().pin_memory()
            oob_h = torch.zeros(1, dtype=torch.int64).pin_memory()

            def mk(oob_ptr, host_meta=False):
                t = (hs, hd) if host_meta else (ps, pd)
                ix = (si_h, di_h) if host_meta else (si, di)
                a = xfer_args(t[0].data_ptr(), None, t[1].data_ptr(), None, ix[0].data_ptr(), ix[1].data_ptr(),
                              1152, oob_ptr, SL, SL, 1152, 1152, layers=NL, tables=True)
                a.count = L
                return a

            variants = [("", 0, 0, False)]
            if kind != "d2d":
                variants += [(" max_blocks=8", 8, 0, False)]
                if L <= 1024:  # per-row copy-engine batches are slow: keep the run short
                    variants += [(" copy_engine", 0, KVD_LAUNCH_COPY_ENGINE, True)]
            seed_us = None
            for suffix, mb, fl, host_meta in variants:
                if suffix and not want("transfer_kv_all_layer_mla", case + suffix):
                    continue
                o = oob_h if host_meta else oob
                o.zero_()
                checked = kvd.bind("kvd_cuda_kv_transfer", mk(o.data_ptr(), host_meta), launch(mb, fl))
                timed = kvd.bind("kvd_cuda_kv_transfer", mk(None, host_meta), launch(mb, fl))
                note = None
                if kind == "h2d" and not suffix:
                    note = "not in bench_seed.py (it has d2d and d2h for MLA); the seed is timed here too"
                elif suffix:
                    note = ("host-readable tables and indices (pinned); " if host_meta else "") + \
                        "seed time from the first row"
                r = run_case(
                    "transfer_kv_all_layer_mla", case + suffix, kind, nbytes,
                    lambda: K.transfer_kv_all_layer_mla(ps, pd, si, di, 1152, NL), timed,
                    check=lambda o=o: all_layer_check((s,), (d,), si, di, o),
                    prep=lambda: all_layer_prep((s,), (d,), si, di), checked_fn=checked,
                    seed_us=seed_us, note=note)
                if not suffix:
                    seed_us = r.get("seed_us", float("nan"))
                expected.clear()
        s = d = ps = pd = hs = hd = None  # release

    # ---- output -----------------------------------------------------------
    path = out_dir / "kvdock_vs_seed.json"
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, torch_cuda=torch.version.cuda,
                triton=triton.__version__, lib=str(lib_path), seconds=round(time.time() - t_start, 1),
                ceilings_gbps=CEIL)
    with open(path, "w") as f:
        json.dump(finite_or_none(dict(meta=meta, rows=ROWS)), f, indent=1, default=str)

    def cell(v, f):
        return f.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"

    lower = any(r.get("lower_ratio") for r in ROWS)  # --repeat: the lower modes' columns too
    print("\n| op | case | seed us | kvdock us | seed/kvdock | kvdock GB/s | of ceiling |"
          + (" lower: seed us | kvdock us | seed/kvdock |" if lower else ""))
    print("|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if lower else ""))
    for r in ROWS:
        if r["op"].startswith("ceiling_"):
            print(f"| {r['op']} | {r['case']} | - | - | - | {r['torch_gbps']:.1f} (torch, {r['torch_us']:.2f} us) "
                  f"| 100% |" + (" - | - | - |" if lower else ""))
            continue
        seed = "FAILED" if "seed_error" in r else cell(r.get("seed_us"), "{:.2f}")
        k = ("ERROR " + r["kvdock_error"].split(":")[0]) if "kvdock_error" in r else cell(r.get("kvdock_us"), "{:.2f}")
        if r.get("mismatch"):
            k += " **MISMATCH**"
        print(f"| {r['op']} | {r['case']} | {seed} | {k} | {cell(r.get('ratio'), '{:.2f}x')} | "
              f"{cell(r.get('kvdock_gbps'), '{:.1f}')} | "
              f"{cell(100 * r['ceiling_share'] if r.get('ceiling_share') else None, '{:.1f}%')} ({r['kind']}) |"
              + (f" {cell(r.get('seed_lower_us'), '{:.2f}')} | {cell(r.get('kvdock_lower_us'), '{:.2f}')} | "
                 f"{cell(r.get('lower_ratio'), '{:.2f}x')} |" if lower else ""))
    bad = [r for r in ROWS if r.get("mismatch") or "kvdock_error" in r]
    print(f"\n{len(ROWS)} rows in {time.time() - t_start:.0f} s -> {path}; "
          f"{len([r for r in ROWS if r.get('mismatch')])} mismatches, "
          f"{len([r for r in ROWS if 'kvdock_error' in r])} kvdock errors", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Round 8 experiment: bulk-copy (TMA) row copies against the library's register copies on the
three large device-to-device rows still below 80% of the copy ceiling: per-layer MHA at 16,384
random rows of 2,048 bytes (K and V), per-layer MLA at 131,072 random rows of 1,152 bytes, and
all-layer MLA at 1,024 random slots x 61 layers (layer tables).  For each: torch's copy_ of the
same bytes (the ceiling the target is read against), for the per-layer rows torch's own indexed
copies of the same rows (index_select: random reads into a packed buffer; index_copy_: random
writes from it), the library, and with EXP_BULK d2d_bulk.cu over a sweep of (rows per warp,
warps per block, blocks per SM).  Every variant is checked once against
torch (destination rows zeroed first); times are do_bench medians (L2 flushed), EXP_ROUNDS
turns, the median of the turns reported.

    EXP_BULK=libd2d_bulk.so EXP_LIB=<libkvdock_kernels.so> python3 tests/bench/experiments/d2d_bulk.py

EXP_LIB2 to EXP_LIB4 time more builds of the library beside EXP_LIB; without EXP_BULK no bulk kernel runs.

Run from the repository root; build line in d2d_bulk.cu."""
import ctypes, os, sys
sys.path.insert(0, "tests/bench")
import bench_kernels as B
import torch
import rows

ROUNDS = int(os.environ.get("EXP_ROUNDS", "3"))
dev = "cuda"; torch.manual_seed(0)
VP, LL, I = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int
bulk = None
if os.environ.get("EXP_BULK"):  # without it: torch and the library only
    bulk = ctypes.CDLL(os.environ["EXP_BULK"])
    bulk.bulk_run.argtypes = [VP] * 7 + [LL, LL, VP, VP, LL, I, LL, LL, I, I, I]
# EXP_LIB, and EXP_LIB2 to EXP_LIB4 for more builds timed beside it ("lib", "lib2", ...)
kvds = [("lib", B.Kvd(os.environ["EXP_LIB"]))] + [
    (f"lib{k}", B.Kvd(os.environ[f"EXP_LIB{k}"])) for k in (2, 3, 4) if os.environ.get(f"EXP_LIB{k}")]


def lib_fns(name, args):
    return {n: k.bind(name, args, B.Launch(None, 0, 0)) for n, k in kvds}
SWEEP = [(32, 1, 3), (32, 1, 2), (16, 1, 6), (16, 2, 3), (8, 2, 6), (8, 4, 3), (32, 2, 3), (16, 4, 3), (32, 1, 6),
         (8, 1, 12), (16, 1, 12), (4, 4, 8)]


def run_case(name, nbytes, torch_bytes, lib_fns, bulk_fn, clear, right, indexed=None):
    """indexed: torch's own random-row copies of the same rows (index_select into a packed
    buffer: random reads; index_copy_ from it: random writes), timed as references."""
    x = torch.empty(torch_bytes // 2, dtype=torch.bfloat16, device=dev); y = torch.empty_like(x)
    fns = {"torch copy_": lambda: y.copy_(x), **(indexed or {}), **lib_fns}
    for rw, wb, bps in (SWEEP if bulk else ()):
        fns[f"bulk R={rw} w={wb} b/SM={bps}"] = (lambda rw=rw, wb=wb, bps=bps: bulk_fn(rw, wb, bps))
    good = {}
    for k, fn in fns.items():
        if k.startswith("torch"):
            good[k] = fn
            continue
        clear(); torch.cuda.synchronize()
        try:
            fn(); torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"{name} {k}: skipped ({e})", flush=True)
            continue
        ok = right()
        print(f"check {name} {k}: {'ok' if ok else 'MISMATCH'}", flush=True)
        if ok:
            good[k] = fn
    rows.report(name, good, nbytes, ROUNDS)


def check_bulk(rc):
    if rc != 0:
        raise RuntimeError("does not fit" if rc == -1 else f"CUDA error {rc}")


# per-layer MHA, 16,384 random rows of 2,048 bytes
P2, H, D, L = 1 << 19, 8, 128, 16384
row = H * D * 2
sk = torch.randn(P2, H, D, dtype=torch.bfloat16, device=dev); sv = torch.randn_like(sk)
dk = torch.zeros_like(sk); dv = torch.zeros_like(sk)
si = torch.randperm(P2, device=dev)[:L]; di = torch.randperm(P2, device=dev)[:L]
ta = B.one_layer_transfer(sk, sv, dk, dv, si, di, row)
pk = torch.empty(L, H, D, dtype=torch.bfloat16, device=dev); pv = torch.empty_like(pk)
run_case("per-layer MHA L=16384 item2048", 2 * 2 * L * row, 2 * L * row,
         lib_fns("kvd_cuda_kv_transfer", ta),
         lambda rw, wb, bps: check_bulk(bulk.bulk_run(None, sk.data_ptr(), sv.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                                      None, None, row, row, si.data_ptr(), di.data_ptr(), L, 2, 1,
                                                      row, rw, wb, bps)),
         lambda: (dk.index_fill_(0, di, 0), dv.index_fill_(0, di, 0)),
         lambda: torch.equal(dk[di], sk[si]) and torch.equal(dv[di], sv[si]),
         indexed={"torch index_select": lambda: (torch.index_select(sk, 0, si, out=pk), torch.index_select(sv, 0, si, out=pv)),
                  "torch index_copy_": lambda: (dk.index_copy_(0, di, pk), dv.index_copy_(0, di, pv))})
sk = sv = dk = dv = pk = pv = None

# per-layer MLA, 131,072 random rows of 1,152 bytes
L, row = 131072, 1152
ms = torch.randn(P2, 1, 576, dtype=torch.bfloat16, device=dev); md = torch.zeros_like(ms)
si = torch.randperm(P2, device=dev)[:L]; di = torch.randperm(P2, device=dev)[:L]
ma = B.one_layer_transfer(ms, None, md, None, si, di, row)
mp = torch.empty(L, 1, 576, dtype=torch.bfloat16, device=dev)
run_case("per-layer MLA L=131072 item1152", 2 * L * row, L * row,
         lib_fns("kvd_cuda_kv_transfer", ma),
         lambda rw, wb, bps: check_bulk(bulk.bulk_run(None, ms.data_ptr(), None, md.data_ptr(), None, None, None,
                                                      row, row, si.data_ptr(), di.data_ptr(), L, 1, 1, row, rw, wb,
                                                      bps)),
         lambda: md.index_fill_(0, di, 0),
         lambda: torch.equal(md[di], ms[si]),
         indexed={"torch index_select": lambda: torch.index_select(ms, 0, si, out=mp),
                  "torch index_copy_": lambda: md.index_copy_(0, di, mp)})
ms = md = mp = None

# all-layer MLA, 1,024 random slots x 61 layers, layer tables
NL, SL, L = 61, 1 << 16, 1024
src = [torch.randn(SL, 1, 576, dtype=torch.bfloat16, device=dev) for _ in range(NL)]
dst = [torch.zeros_like(s) for s in src]
ps = torch.tensor([s.data_ptr() for s in src], dtype=torch.uint64, device=dev)
pd = torch.tensor([d.data_ptr() for d in dst], dtype=torch.uint64, device=dev)
si = torch.randperm(SL, device=dev)[:L]; di = torch.randperm(SL, device=dev)[:L]
aa = B.TransferArgs()
aa.src = B.KvSide(None, None, ps.data_ptr(), None, 0, row, SL)
aa.dst = B.KvSide(None, None, pd.data_ptr(), None, 0, row, SL)
aa.num_layers, aa.src_idx, aa.dst_idx = NL, si.data_ptr(), di.data_ptr()
aa.idx_dtype, aa.count, aa.row_bytes, aa.oob_count = B.KVD_DTYPE_I64, L, row, None
run_case("all-layer MLA L=1024 layers61 item1152", 2 * NL * L * row, NL * L * row,
         lib_fns("kvd_cuda_kv_transfer", aa),
         lambda rw, wb, bps: check_bulk(bulk.bulk_run(None, None, None, None, None, ps.data_ptr(), pd.data_ptr(),
                                                      row, row, si.data_ptr(), di.data_ptr(), L, 1, NL, row, rw, wb,
                                                      bps)),
         lambda: [d.index_fill_(0, di, 0) for d in dst],
         lambda: all(torch.equal(d[di], s[si]) for s, d in zip(src, dst)))

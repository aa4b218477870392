#!/usr/bin/env python3
"""Round 6 experiment: small-case kernel shapes against the seed and two builds of the
library, timed in turns (do_bench, L2 flushed), each result checked first.

    nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC tests/bench/experiments/small_shapes.cu \
        -o /tmp/libsmall.so
    EXP_SMALL=/tmp/libsmall.so EXP_LIB=<a libkvdock_kernels.so> EXP_LIB2=<another> \
        EXP_ROUNDS=11 python3 tests/bench/experiments/small_shapes.py

Run from the repository root with the seed at .peer.  The shapes of the kernels in
small_shapes.cu are described there; results are in tests/bench/results (round 6)."""
import ctypes, statistics, sys, os
sys.path.insert(0, "tests/bench"); sys.path.insert(0, ".peer")
import bench_kernels as B
import torch
from triton.testing import do_bench
from tokenspeed_kernel.ops.kvcache import triton as K
dev = "cuda"; torch.manual_seed(0)
ROUNDS = int(os.environ.get("EXP_ROUNDS", "9"))
LIB = os.environ["EXP_LIB"]
LIB2 = os.environ["EXP_LIB2"]
def t(fn): return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
kvd = B.Kvd(LIB)
kvd2 = B.Kvd(LIB2)
m = ctypes.CDLL(os.environ["EXP_SMALL"])
VP = ctypes.c_void_p; LL = ctypes.c_longlong; I = ctypes.c_int
m.exp_small.argtypes = [I, I, I] + [VP] * 6 + [I, LL, LL, LL, VP, I]
m.exp_min.argtypes = [I] + [VP] * 6 + [I, LL]
m.exp_gather.argtypes = [I, I, VP, LL, LL, LL, VP, VP, VP, LL, I, I, I, I, VP]
H, D, P = 8, 128, 1 << 20; row = H * D * 2
oob = torch.zeros(1, dtype=torch.int64, device=dev)
cases = {}
def check(name, case, fn, prep, ok):
    prep(); fn(); torch.cuda.synchronize()
    r = ok()
    print(f"check {case} {name}: {'ok' if r else 'MISMATCH'}", flush=True)
    assert oob.item() == 0

kpool = torch.randn(P, H, D, dtype=torch.bfloat16, device=dev); vpool = torch.randn_like(kpool)
for N in [1, 32, 512]:
    ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev); vs = torch.randn_like(ks)
    loc = torch.randperm(P, device=dev)[:N]
    a = B.StoreArgs(ks.data_ptr(), vs.data_ptr(), row, row, kpool.data_ptr(), vpool.data_ptr(), row, row, P, loc.data_ptr(), B.KVD_DTYPE_I64, N, row, None)
    lib = kvd.bind("kvd_cuda_kv_store", a, B.Launch(None, 0, 0)); lib2 = kvd2.bind("kvd_cuda_kv_store", a, B.Launch(None, 0, 0))
    def sm(pairblock, thr, ks=ks, vs=vs, loc=loc, N=N):
        def f():
            assert m.exp_small(1, 2, pairblock, ks.data_ptr(), vs.data_ptr(), kpool.data_ptr(), vpool.data_ptr(), None, loc.data_ptr(), N, row, N, P, oob.data_ptr(), thr) == 0
        return f
    def mn(ks=ks, vs=vs, loc=loc, N=N):
        assert m.exp_min(0, ks.data_ptr(), vs.data_ptr(), kpool.data_ptr(), vpool.data_ptr(), None, loc.data_ptr(), N, row) == 0
    v = {"seed": (lambda ks=ks, vs=vs, loc=loc: K.store_kv_cache(ks, vs, kpool, vpool, loc)), "lib": lib, "pairs": lib2, "min": mn,
         "pair128": sm(1, 128), "split128": sm(0, 128)}
    c = f"store N={N}"
    for name, f in v.items():
        check(name, c, f, lambda loc=loc: (kpool.index_fill_(0, loc, 0), vpool.index_fill_(0, loc, 0)),
              lambda loc=loc, ks=ks, vs=vs: torch.equal(kpool[loc], ks) and torch.equal(vpool[loc], vs))
    cases[c] = v
P2 = 1 << 19
sk = torch.randn(P2, H, D, dtype=torch.bfloat16, device=dev); sv = torch.randn_like(sk); dk = torch.empty_like(sk); dv = torch.empty_like(sk)
for Ln in [64]:
    si = torch.randperm(P2, device=dev)[:Ln]; di = torch.randperm(P2, device=dev)[:Ln]
    a = B.TransferArgs()
    a.src = B.KvSide(sk.data_ptr(), sv.data_ptr(), None, None, 0, row, P2)
    a.dst = B.KvSide(dk.data_ptr(), dv.data_ptr(), None, None, 0, row, P2)
    a.num_layers, a.src_idx, a.dst_idx = 1, si.data_ptr(), di.data_ptr()
    a.idx_dtype, a.count, a.row_bytes, a.oob_count = B.KVD_DTYPE_I64, Ln, row, None
    lib = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0)); lib2 = kvd2.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0))
    def sm(pairblock, thr):
        def f():
            assert m.exp_small(0, 2, pairblock, sk.data_ptr(), sv.data_ptr(), dk.data_ptr(), dv.data_ptr(), si.data_ptr(), di.data_ptr(), Ln, row, P2, P2, oob.data_ptr(), thr) == 0
        return f
    def mn():
        assert m.exp_min(1, sk.data_ptr(), sv.data_ptr(), dk.data_ptr(), dv.data_ptr(), si.data_ptr(), di.data_ptr(), Ln, row) == 0
    v = {"seed": lambda: K.transfer_kv_per_layer(sk, dk, sv, dv, si, di, row), "lib": lib, "pairs": lib2, "min": mn,
         "pair128": sm(1, 128), "split128": sm(0, 128)}
    c = f"mha L={Ln}"
    for name, f in v.items():
        check(name, c, f, lambda: (dk.index_fill_(0, di, 0), dv.index_fill_(0, di, 0)),
              lambda: torch.equal(dk[di], sk[si]) and torch.equal(dv[di], sv[si]))
    cases[c] = v
src = torch.randn(P2, 576, dtype=torch.bfloat16, device=dev); dst = torch.empty_like(src)
for Ln in [64, 1024]:
    si = torch.randperm(P2, device=dev)[:Ln]; di = torch.randperm(P2, device=dev)[:Ln]
    a = B.TransferArgs()
    a.src = B.KvSide(src.data_ptr(), None, None, None, 0, 1152, P2)
    a.dst = B.KvSide(dst.data_ptr(), None, None, None, 0, 1152, P2)
    a.num_layers, a.src_idx, a.dst_idx = 1, si.data_ptr(), di.data_ptr()
    a.idx_dtype, a.count, a.row_bytes, a.oob_count = B.KVD_DTYPE_I64, Ln, 1152, None
    lib = kvd.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0)); lib2 = kvd2.bind("kvd_cuda_kv_transfer", a, B.Launch(None, 0, 0))
    def sm(thr, si=si, di=di, Ln=Ln):
        def f():
            assert m.exp_small(0, 1, 0, src.data_ptr(), None, dst.data_ptr(), None, si.data_ptr(), di.data_ptr(), Ln, 1152, P2, P2, oob.data_ptr(), thr) == 0
        return f
    def mn(si=si, di=di, Ln=Ln):
        assert m.exp_min(2, src.data_ptr(), None, dst.data_ptr(), None, si.data_ptr(), di.data_ptr(), Ln, 1152) == 0
    v = {"seed": (lambda si=si, di=di: K.transfer_kv_per_layer_mla(src, dst, si, di, 1152)), "lib": lib, "pairs": lib2, "min": mn,
         "one96": sm(0), "one128": sm(128)}
    c = f"mla L={Ln}"
    for name, f in v.items():
        check(name, c, f, lambda di=di: dst.index_fill_(0, di, 0), lambda si=si, di=di: torch.equal(dst[di], src[si]))
    cases[c] = v
for bs, maxp in [(1, 256), (64, 2048)]:
    rtp = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)
    rpi = torch.randperm(1024, device=dev)[:bs]
    seq = torch.randint(1, maxp * 16, (bs,), dtype=torch.int32, device=dev)
    out = torch.full((bs, maxp), -1, dtype=torch.int32, device=dev)
    npg = (seq + 15) // 16
    col = torch.arange(maxp, device=dev)
    ref = torch.where(col[None, :] < npg[:, None], rtp[rpi, :maxp], 0)
    ga = B.GatherArgs(rtp.data_ptr(), B.KVD_DTYPE_I32, 1024, 8192, rtp.stride(0) * 4, rpi.data_ptr(), B.KVD_DTYPE_I64,
                      seq.data_ptr(), B.KVD_DTYPE_I32, out.data_ptr(), out.stride(0) * 4, bs, maxp, 16, 0, None)
    lib = kvd.bind("kvd_cuda_page_table_gather", ga, B.Launch(None, 0, 0))
    def gm(vec, thr, rtp=rtp, rpi=rpi, seq=seq, out=out, bs=bs, maxp=maxp):
        def f():
            assert m.exp_gather(vec, thr, rtp.data_ptr(), 1024, 8192, rtp.stride(0), rpi.data_ptr(), seq.data_ptr(), out.data_ptr(),
                                out.stride(0), bs, maxp, 16, 0, oob.data_ptr()) == 0
        return f
    v = {"seed": (lambda rtp=rtp, rpi=rpi, seq=seq, out=out, bs=bs, maxp=maxp:
                  K.gather_page_table_with_padding(rtp, rpi, seq, out, bs=bs, max_num_pages=maxp, page_size=16, dummy_slot=0)),
         "lib": lib, "v4t128": gm(4, 128), "v4t64": gm(4, 64), "v1t128": gm(1, 128)}
    c = f"gather bs={bs}"
    for name, f in v.items():
        check(name, c, f, lambda out=out: out.fill_(-1), lambda out=out, ref=ref: torch.equal(out, ref))
    cases[c] = v
cases["floor"] = {"empty": lambda: torch.cuda._sleep(0)}
res = {}
for r in range(ROUNDS):
    for c, vs_ in cases.items():
        for name, f in vs_.items():
            res.setdefault((c, name), []).append(t(f))
    print(f"round {r} done", flush=True)
for (c, name), v in res.items():
    print(f"{c:16s} {name:9s} median {statistics.median(v):6.2f} us  min {min(v):5.2f}  runs " + " ".join(f"{x:.2f}" for x in v), flush=True)

"""The seed bench's small cases, as the launch experiments time them (launch_path, ncu_small,
graph_pace): store N=1, 32 and 512 (8 heads x 128, bf16, into pools of 2^20 slots); per-layer MHA
at 64 rows and per-layer MLA (1,152-byte rows) at 64 and 1,024 rows (pools of 2^19 slots); the
page-table gather at bs=1 and 64 (bench_kernels.GatherCase).  Imported by the scripts beside it
(run from the repository root, this folder is on their path)."""
import types


def small_cases(B, K, dev):
    """The eight cases in that order, each a namespace with label; seed (the seed's call); fname
    and args (the library's entry point and its arguments, to bind); clear() (what a call writes,
    cleared) and right() (the destination checked against torch after one call); and its tensors
    (a store: ks, vs, loc, kpool, vpool, N, row; per-layer MHA: sk, sv, dk, dv, si, di, row)."""
    import torch
    cases = []
    H, D, P = 8, 128, 1 << 20
    row = H * D * 2
    kpool = torch.randn(P, H, D, dtype=torch.bfloat16, device=dev); vpool = torch.randn_like(kpool)
    for N in (1, 32, 512):
        c = types.SimpleNamespace(label=f"store N={N}", N=N, row=row, kpool=kpool, vpool=vpool,
                                  fname="kvd_cuda_kv_store")
        c.ks = torch.randn(N, H, D, dtype=torch.bfloat16, device=dev); c.vs = torch.randn_like(c.ks)
        c.loc = torch.randperm(P, device=dev)[:N]
        c.args = B.StoreArgs(c.ks.data_ptr(), c.vs.data_ptr(), row, row, kpool.data_ptr(), vpool.data_ptr(), row,
                             row, P, c.loc.data_ptr(), B.KVD_DTYPE_I64, N, row, None)
        c.seed = lambda c=c: K.store_kv_cache(c.ks, c.vs, kpool, vpool, c.loc)
        c.clear = lambda c=c: (kpool.index_fill_(0, c.loc, 0), vpool.index_fill_(0, c.loc, 0))
        c.right = lambda c=c: torch.equal(kpool[c.loc], c.ks) and torch.equal(vpool[c.loc], c.vs)
        cases.append(c)

    P2 = 1 << 19
    c = types.SimpleNamespace(label="per-layer L=64", row=row, fname="kvd_cuda_kv_transfer")
    c.sk = torch.randn(P2, H, D, dtype=torch.bfloat16, device=dev); c.sv = torch.randn_like(c.sk)
    c.dk = torch.zeros_like(c.sk); c.dv = torch.zeros_like(c.sk)
    c.si = torch.randperm(P2, device=dev)[:64]; c.di = torch.randperm(P2, device=dev)[:64]
    c.args = B.one_layer_transfer(c.sk, c.sv, c.dk, c.dv, c.si, c.di, row)
    c.seed = lambda c=c: K.transfer_kv_per_layer(c.sk, c.dk, c.sv, c.dv, c.si, c.di, row)
    c.clear = lambda c=c: (c.dk.index_fill_(0, c.di, 0), c.dv.index_fill_(0, c.di, 0))
    c.right = lambda c=c: torch.equal(c.dk[c.di], c.sk[c.si]) and torch.equal(c.dv[c.di], c.sv[c.si])
    cases.append(c)

    ms = torch.randn(P2, 1, 576, dtype=torch.bfloat16, device=dev); md = torch.zeros_like(ms)
    for L in (64, 1024):
        c = types.SimpleNamespace(label=f"mla L={L}", fname="kvd_cuda_kv_transfer")
        c.si = torch.randperm(P2, device=dev)[:L]; c.di = torch.randperm(P2, device=dev)[:L]
        c.args = B.one_layer_transfer(ms, None, md, None, c.si, c.di, 1152)
        c.seed = lambda c=c: K.transfer_kv_per_layer_mla(ms, md, c.si, c.di, 1152)
        c.clear = lambda c=c: md.index_fill_(0, c.di, 0)
        c.right = lambda c=c: torch.equal(md[c.di], ms[c.si])
        cases.append(c)

    req_to_page = torch.randint(0, 1 << 20, (1024, 8192), dtype=torch.int32, device=dev)
    for bs, maxp in ((1, 256), (64, 2048)):
        g = B.GatherCase(req_to_page, bs, maxp)
        cases.append(types.SimpleNamespace(label=f"gather bs={bs}", fname="kvd_cuda_page_table_gather",
                                           args=g.args(), seed=g.seed(K), clear=lambda g=g: g.out.fill_(-1),
                                           right=lambda g=g: torch.equal(g.out, g.ref), g=g))
    return cases


def modes(xs):
    """Turns xs (us) as 'lowest / median of the lowest third / median': a small case's turns fall
    in modes, and the lowest third's median reads the lower one."""
    import statistics
    s = sorted(xs)
    return f"{s[0]:6.2f} / {statistics.median(s[:max(1, len(s) // 3)]):6.2f} / {statistics.median(s):6.2f}"

"""The seed bench's small cases, as the launch experiments time them (launch_path, ncu_small,
graph_pace): store N=1, 32 and 512 (8 heads x 128, bf16, into pools of 2^20 slots); per-layer MHA
at 64 rows and per-layer MLA (1,152-byte rows) at 64 and 1,024 rows (pools of 2^19 slots); the
page-table gather at bs=1 and 64 (bench_kernels.GatherCase); modes(), the lowest / lower-mode /
median line; GraphPace, the timing of calls inside CUDA graphs (graph_pace, module_path).
Imported by the scripts beside it (run from the repository root, this folder is on their path)."""
import types


def small_cases(B, K, dev):
    """The eight cases in that order, each a namespace with label; seed (the seed's call); fname
    and args (the library's entry point and its arguments, to bind); clear() (what a call writes,
    cleared) and right() (the destination checked against torch after one call); and its tensors
    (a store: ks, vs, loc, kpool, vpool, N, row; per-layer MHA: sk, sv, dk, dv, si, di, row; MLA:
    src, dst, si, di)."""
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
        c = types.SimpleNamespace(label=f"mla L={L}", fname="kvd_cuda_kv_transfer", src=ms, dst=md)
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


class GraphPace:
    """Times launches with the host's pace taken out: a maker's call captured in a CUDA graph of
    `launches` pairs of nodes, each an L2 flush (zeroing flush_mib MiB, as do_bench does) and then
    the call, so that the GPU runs them back to back with no host in between.  Timing events are
    recorded inside the graph on both sides of every call (event-record nodes, torch's
    Event(external=True)), as do_bench records them on the stream, and a replay's figure is the
    median of its calls.  Where torch cannot record events inside a graph, a graph of the flushes
    alone is replayed before each round and subtracted: (the call's graph - the flush graph) /
    launches, which a 0.1% change in the flushes' time moves by about 0.07 us.

    make() runs inside the capture and returns the call; whatever takes a stream must launch on
    torch.cuda.current_stream() as it is there (the capture stream)."""

    def __init__(self, launches=50, flush_mib=256, dev="cuda"):
        import torch
        self.torch, self.launches = torch, launches
        self.flush = torch.empty(flush_mib * 1024 * 1024 // 4, dtype=torch.int, device=dev)
        try:
            torch.cuda.Event(enable_timing=True, external=True)
            self.events = True
        except TypeError:
            self.events = False
        self.flush_graph = None if self.events else self.capture(None)
        self.how = ("the median call of each replay, timed by events inside the graph" if self.events else
                    "each replay less the flush graph's, over its calls")

    def capture(self, make):
        """The graph of make's calls (make None: the flushes alone) and its events."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        marks = [(torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True, external=True))
                 for _ in range(self.launches if self.events and make else 0)]
        # relaxed: host code runs as it does outside a capture (lazy set-up must have run before)
        with torch.cuda.graph(graph, capture_error_mode="relaxed"):
            fn = make() if make else None
            for k in range(self.launches):
                self.flush.zero_()
                if fn:
                    if marks:
                        marks[k][0].record()
                    fn()
                    if marks:
                        marks[k][1].record()
        return graph, marks

    def base(self):
        """What a round subtracts before dividing (the flush graph's replay without events), else 0."""
        return 0.0 if self.events else self.replay(self.flush_graph, raw=True)

    def replay(self, captured, base=0.0, raw=False):
        """us per call in one replay of captured: the median over its calls with events, else
        (the whole replay - base) / launches."""
        import statistics
        torch = self.torch
        graph, marks = captured
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); graph.replay(); end.record()
        torch.cuda.synchronize()
        if marks:
            return statistics.median(a.elapsed_time(b) * 1e3 for a, b in marks)
        whole = start.elapsed_time(end) * 1e3
        return whole if raw else (whole - base) / self.launches

    def rounds(self, makers, rounds, checks, say=print):
        """{label: {name: [us per call, a figure per round]}} for makers {label: {name: make}}:
        every graph captured, then replayed once to warm up and to check it, between clear() and
        right() of checks {label: (clear, right)} (an AssertionError names a graph whose calls
        left a wrong result); then each round replays each label's graphs once, in an order
        rotated every round."""
        graphs = {label: {name: self.capture(make) for name, make in by.items()} for label, by in makers.items()}
        for label, by in graphs.items():
            clear, right = checks[label]
            for name, captured in by.items():
                clear(); self.torch.cuda.synchronize()
                self.replay(captured)
                assert right(), f"{label} {name}: wrong after a replay of its graph"
        per = {label: {name: [] for name in by} for label, by in graphs.items()}
        for r in range(rounds):
            for label, by in graphs.items():
                order = list(by.items())
                order = order[r % len(order):] + order[:r % len(order)]
                base = self.base()
                for name, captured in order:
                    per[label][name].append(self.replay(captured, base))
            say(f"round {r + 1}/{rounds}")
        return per


def copy_groups(makers, dup):
    """{name#k: make} for dup > 1 ({name: make} otherwise): group k's copies made in turn, in an
    order rotated by k (in round 15 the copies made later in a group tended to trail: rotating
    spreads that over every variant)."""
    if dup == 1:
        return dict(makers)
    names = list(makers)
    return {f"{name}#{k}": makers[name] for k in range(dup) for name in names[k % len(names):] + names[:k % len(names)]}


def paired(per, names, dup, say=print):
    """For per {label: {name#k: [us per round]}} from GraphPace.rounds over copy_groups: each
    variant's copies less the seed's copy of the same group (their lower modes), as a mean over
    the dup pairs, the range, and how many pairs were ahead and tied."""
    import statistics
    say(f"\nus, each copy's lower mode less that of the seed's copy of its group ({dup} pairs):"
        " mean [lowest, highest]; pairs ahead of the seed")
    lower = lambda xs: statistics.median(sorted(xs)[:max(1, len(xs) // 3)])
    for label, by in per.items():
        for name in names:
            if name == "seed" or f"{name}#0" not in by:
                continue
            d = [lower(by[f"{name}#{k}"]) - lower(by[f"seed#{k}"]) for k in range(dup)]
            say(f"{label:15s} {name:9s} {statistics.mean(d):+6.3f} [{min(d):+.2f}, {max(d):+.2f}]"
                f"  {sum(x < 0 for x in d)}/{dup} ahead, {sum(x == 0 for x in d)} tied")


"""What the random-row experiments share (rounds 8-12): the copy ceiling they read against, do_bench
timing, variants timed in turns and reported, and the bench's per-layer MHA draw of 16,384 rows.
Imported by the scripts beside it (run from the repository root, this folder is on their path)."""
import statistics
import types

CEIL = 4.25e12  # bytes/s: the H200 device-copy ceiling of issue 2 (read + write)


def t(fn):
    """do_bench's median time of fn in us (the L2 flushed before every run)."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def report(title, fns, nbytes, rounds):
    """Time every variant of fns once per round, for rounds rounds (so that variants share the
    machine's moods), then print each one's median turn, its TB/s and share of CEIL for nbytes moved
    (read + write), and every turn."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(t(fn))
    print(f"\n{title}: {nbytes / 1e6:.1f} MB moved (read + write)")
    width = max(map(len, times), default=0)
    for k, xs in times.items():
        us = statistics.median(xs)
        print(f"  {k:{width}s} {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s  {100 * nbytes / us / 1e-6 / CEIL:5.1f}%  "
              + " ".join(f"{v:.2f}" for v in xs), flush=True)
    return times


def mha_bench_rows(B, kvd, dev):
    """The seed bench's per-layer MHA transfer at 16,384 rows: K and V pools of 2^19 slots of
    2,048 bytes, random source and destination slots, bound to the library (f), and x, y for torch's
    copy_ of the same bytes.  Returns a namespace of all of them."""
    import torch
    r = types.SimpleNamespace(P2=1 << 19, L=16384, row=2048)
    r.sk = torch.randn(r.P2, 8, 128, dtype=torch.bfloat16, device=dev); r.sv = torch.randn_like(r.sk)
    r.dk = torch.zeros_like(r.sk); r.dv = torch.zeros_like(r.sk)
    r.si = torch.randperm(r.P2, device=dev)[:r.L]; r.di = torch.randperm(r.P2, device=dev)[:r.L]
    r.args = B.one_layer_transfer(r.sk, r.sv, r.dk, r.dv, r.si, r.di, r.row)
    r.f = kvd.bind("kvd_cuda_kv_transfer", r.args, B.Launch(None, 0, 0))
    r.x = torch.empty(2 * r.L * r.row // 2, dtype=torch.bfloat16, device=dev); r.y = torch.empty_like(r.x)
    return r

#!/usr/bin/env python3
"""The engine proof: a real transformer's prefix reused across worker
processes through kvdockd, with the same logits as a full recompute and a
shorter time to first token.

A Llama-shaped model from HuggingFace transformers, random weights under a
fixed seed (no download), in worker processes beside a kvdockd this script
starts (--backend cuda, its defaults otherwise).  Each worker owns a paged
KV cache (per layer [2, pages, 16, kv_heads, head_dim], vLLM's layout)
joined to a cache of the daemon by kvdock.Connector.

- proof (float32, 1B shape): worker A prefills a prompt of 16,384 tokens,
  copies its KV from the model's cache into its pages and saves them.
  Worker B, another process, gets a prompt sharing the first 15,360
  tokens: lookup finds 15,360, B loads them layer by layer into its own
  pages (each attention layer's cache update waits for its layer) and
  prefills only the last 1,024 tokens.  Its last-token logits against a
  full recompute of its prompt, and 32 greedy tokens each way.  Worker C,
  with another salt, finds nothing.
- ttft (bfloat16, 1B and 8B shapes): B's time to first token with reuse
  (lookup, load, the suffix's forward pass over the loaded prefix, waited
  layer by layer), with the whole load waited for first, and by full
  recompute; warm, median of --runs.
- interference (bfloat16, 1B shape): worker D's decode step (32 sequences
  of 1,024 tokens of context) while worker S saves 16,384-token prompts
  of its own through the daemon, on the copy engines (the default) and on
  kernels, against steps with no save running, alternated.

Usage (GPU machine, repository root, the build carried there):
    python3 tests/bench/bench_engine.py --build .carry/bg [--phases proof,ttft,interference]
Writes $OUT/engine.json (OUT defaults to /tmp) and prints the tables.
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

BS = 16                    # tokens a block (a page)
PROMPT = 16384             # worker A's prompt
SHARED = 15360             # B's prompt shares this many leading tokens
SUFFIX = PROMPT - SHARED   # and then has its own
SALT = b"bench-engine/llama"

SHAPES = {
    "1b": {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "8b": {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}
TARGET = {"1b": 0.4, "8b": 0.2}  # reuse / recompute
CHUNK = 2048               # float32 prefill chunk (tokens)
LOGIT_BOUND = 1e-3         # float32: reuse and recompute differ by summation order only


# ---------------------------------------------------------------------------
# In the workers

def build_model(shape, dtype_name):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=32768, **SHAPES[shape])
    torch.set_grad_enabled(False)  # inference: no activations kept for a backward pass
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)  # the same weights in every process: seeded on the GPU
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    return model.to(dtype).eval(), cfg


def prompt_ids(seed, n):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g).tolist()


def prompt_b():
    return prompt_ids(1, SHARED) + prompt_ids(2, SUFFIX)


def forward(model, ids, cache, keep=1):
    """Logits of the last `keep` positions (the lm head only where needed).

    float32 prompts go in chunks of CHUNK tokens, as engines prefill long
    prompts: SDPA has no flash kernel for float32 and would hold whole
    [heads, tokens, tokens] score matrices (16 GiB a layer at 16,384)."""
    import torch
    x = torch.tensor([ids], device="cuda") if not hasattr(ids, "shape") else ids
    step = CHUNK if next(model.parameters()).dtype == torch.float32 else x.shape[1]
    for at in range(0, x.shape[1], step):
        part = x[:, at:at + step]
        try:
            out = model(input_ids=part, past_key_values=cache, use_cache=True,
                        logits_to_keep=keep)
        except TypeError:  # older transformers
            out = model(input_ids=part, past_key_values=cache, use_cache=True,
                        num_logits_to_keep=keep)
    return out.logits[:, -keep:].float()


def layer_kv(cache, layer):
    """(keys, values) [batch, kv_heads, tokens, head_dim] a DynamicCache holds for layer."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


class Worker:
    """A worker's model, paged KV cache and connector."""

    def __init__(self, socket, shape, dtype_name, name, pages, salt=SALT, budget=0, path=None):
        import torch
        import kvdock
        self.torch = torch
        self.model, cfg = build_model(shape, dtype_name)
        self.L, self.H, self.D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        self.pages = pages
        dt = next(self.model.parameters()).dtype
        self.kv = [torch.zeros(2, pages, BS, self.H, self.D, dtype=dt, device="cuda")
                   for _ in range(self.L)]
        self.cli = kvdock.Client(socket, name=name, timeout=300)
        self.conn = kvdock.Connector(self.cli, f"engine-{shape}-{dtype_name}", block_size=BS,
                                     kv_caches=self.kv, salt=salt, budget_bytes=budget,
                                     pool_name=f"{name}-kv", path=path)

    def cache_to_pages(self, cache, table, tokens):
        """Copy the whole blocks of a DynamicCache's first `tokens` into pages."""
        n = tokens // BS
        idx = self.torch.tensor(table[:n], device="cuda")
        for l in range(self.L):
            k, v = layer_kv(cache, l)
            for i, t in enumerate((k, v)):
                rows = t[0, :, :n * BS].transpose(0, 1).reshape(n, BS, self.H, self.D)
                self.kv[l][i].index_copy_(0, idx, rows)

    def loading_cache(self, load, table, tokens):
        """A DynamicCache holding `tokens` of prefix whose layer l is copied
        from the pages once load's layer l has landed (on the stream)."""
        from transformers import DynamicCache
        torch, w = self.torch, self
        n = tokens // BS
        idx = torch.tensor(table[:n], device="cuda")
        dt = self.kv[0].dtype

        class Loading(DynamicCache):
            def __init__(self):
                super().__init__()
                for l in range(w.L):  # the prefix's length, known to the model at once
                    ph = [torch.empty(1, w.H, tokens, w.D, dtype=dt, device="cuda")
                          for _ in range(2)]
                    super().update(ph[0], ph[1], l)
                self.pending = set(range(w.L))

            def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
                if layer_idx in self.pending:
                    self.pending.discard(layer_idx)
                    load.wait_layer(layer_idx)
                    k, v = layer_kv(self, layer_idx)
                    for i, t in enumerate((k, v)):
                        rows = w.kv[layer_idx][i].index_select(0, idx)  # [n, BS, H, D]
                        t[0].copy_(rows.reshape(n * BS, w.H, w.D).transpose(0, 1))
                return super().update(key_states, value_states, layer_idx, cache_kwargs)

        return Loading()

    def close(self):
        self.conn.close()
        self.cli.close()


def greedy(model, logits, cache, steps):
    import torch
    out, nxt = [], int(logits[0, -1].argmax())
    for _ in range(steps):
        out.append(nxt)
        logits = forward(model, torch.tensor([[nxt]], device="cuda"), cache)
        nxt = int(logits[0, -1].argmax())
    return out


def worker_a(pipe, socket, shape, dtype_name, budget):
    """Prefill worker A's prompt, its KV into pages, saved."""
    from transformers import DynamicCache
    w = Worker(socket, shape, dtype_name, "worker-a", PROMPT // BS + 8, budget=budget)
    ids = prompt_ids(1, SHARED) + prompt_ids(3, SUFFIX)  # shares SHARED tokens with B's
    cache = DynamicCache()
    forward(w.model, ids, cache)
    table = list(range(w.pages - 1, -1, -1))[:PROMPT // BS]  # pages in another order than B's
    w.cache_to_pages(cache, table, PROMPT)
    w.conn.save(ids, table)
    stored = w.conn.wait_for_saves()
    w.close()
    pipe.send({"stored": stored})


def worker_b_proof(pipe, socket, shape, dtype_name):
    """Reuse against recompute: logits and greedy tokens."""
    import torch
    from transformers import DynamicCache
    w = Worker(socket, shape, dtype_name, "worker-b", PROMPT // BS + 8)
    ids = prompt_b()
    hit = w.conn.lookup(ids)
    table = list(range(w.pages))
    ld = w.conn.load(ids, table[:hit // BS])
    cache = w.loading_cache(ld, table, hit)
    reuse = forward(w.model, ids[hit:], cache)
    ld.wait()
    full_cache = DynamicCache()
    full = forward(w.model, ids, full_cache)
    diff = float((reuse - full).abs().max())
    scale = float(full.abs().max())
    tok_reuse = greedy(w.model, reuse, cache, 32)
    tok_full = greedy(w.model, full, full_cache, 32)
    w.close()
    torch.cuda.synchronize()
    pipe.send({"hit": hit, "max_abs_diff": diff, "max_abs_logit": scale,
               "same_argmax": int(reuse[0, -1].argmax()) == int(full[0, -1].argmax()),
               "greedy_equal": tok_reuse == tok_full, "greedy_reuse": tok_reuse,
               "greedy_full": tok_full})


def worker_c(pipe, socket, shape, dtype_name):
    """Another salt: nothing of A's or B's prompt is found."""
    import kvdock
    import torch
    cfg = SHAPES[shape]
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    kv = [torch.zeros(2, 8, BS, cfg["num_key_value_heads"], cfg["head_dim"], dtype=dt,
                      device="cuda") for _ in range(cfg["num_hidden_layers"])]
    with kvdock.Client(socket, name="worker-c", timeout=120) as cli:
        conn = kvdock.Connector(cli, f"engine-{shape}-{dtype_name}", block_size=BS,
                                kv_caches=kv, salt=b"another-tenant", pool_name="worker-c-kv")
        hits = conn.lookup(prompt_b())
        conn.close()  # its pool goes: the same memory is registered again below
        same = kvdock.Connector(cli, f"engine-{shape}-{dtype_name}", block_size=BS,
                                kv_caches=kv, salt=SALT, pool_name="worker-c-kv2")
        control = same.lookup(prompt_b())
        same.close()
    pipe.send({"hit": hits, "same_salt_hit": control})


def worker_b_ttft(pipe, socket, shape, dtype_name, runs):
    """Time to first token: reuse layer by layer, reuse after the whole
    load, recompute; warm (two rounds first), median of runs."""
    import torch
    from transformers import DynamicCache
    w = Worker(socket, shape, dtype_name, "worker-b", PROMPT // BS + 8)
    ids = prompt_b()
    table = list(range(w.pages))

    def reuse(layerwise):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hit = w.conn.lookup(ids)
        ld = w.conn.load(ids, table[:hit // BS])
        if not layerwise:
            ld.wait()
        cache = w.loading_cache(ld, table, hit)
        tok = int(forward(w.model, ids[hit:], cache)[0, -1].argmax())  # the host has it
        t1 = time.perf_counter()
        r = ld.wait()
        assert r.rows == hit // BS, (r, hit)
        return t1 - t0, tok, hit

    def recompute():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tok = int(forward(w.model, ids, DynamicCache())[0, -1].argmax())
        return time.perf_counter() - t0, tok

    def load_only():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hit = w.conn.lookup(ids)
        w.conn.load(ids, table[:hit // BS]).wait()
        return time.perf_counter() - t0

    def suffix_only():  # the suffix's forward pass over a prefix already in place
        hit = w.conn.lookup(ids)
        ld = w.conn.load(ids, table[:hit // BS])
        ld.wait()
        cache = w.loading_cache(ld, table, hit)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        int(forward(w.model, ids[hit:], cache)[0, -1].argmax())
        return time.perf_counter() - t0

    for _ in range(2):
        reuse(True), reuse(False), recompute(), load_only(), suffix_only()
    res = {"layerwise": [], "whole": [], "recompute": [], "load": [], "suffix": []}
    toks = set()
    hit = 0
    for _ in range(runs):
        t, tok, hit = reuse(True)
        res["layerwise"].append(t)
        toks.add(tok)
        t, tok, _ = reuse(False)
        res["whole"].append(t)
        toks.add(tok)
        t, tok = recompute()
        res["recompute"].append(t)
        toks.add(tok)
        res["load"].append(load_only())
        res["suffix"].append(suffix_only())
    load_bytes = w.conn.cache.info.block_bytes * (hit // BS)
    w.close()
    out = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    out.update(hit=hit, same_first_token=len(toks) == 1, load_bytes=load_bytes)
    pipe.send(out)


def worker_decode(pipe, steps):
    """Decode steps of the 1B shape: 32 sequences, 1,024 tokens of context."""
    import torch
    from transformers import DynamicCache
    model, _ = build_model("1b", "bf16")
    ctx = torch.randint(0, 32000, (32, 1024), device="cuda")
    cache = DynamicCache()
    forward(model, ctx, cache)
    nxt = torch.randint(0, 32000, (32, 1), device="cuda")
    pipe.send("ready")
    while True:
        msg = pipe.recv()
        if msg == "quit":
            return
        times = []
        for _ in range(steps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            forward(model, nxt, cache)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
            cache.crop(-1)  # back to the same context every step
        pipe.send(times)


def worker_saver(pipe, socket, path):
    """Save 16,384-token prompts of fresh keys, one after another, until told to stop."""
    import torch
    import kvdock
    cfg = SHAPES["1b"]
    L, H, D = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    kv = [torch.randn(2, PROMPT // BS, BS, H, D, device="cuda").to(torch.bfloat16)
          for _ in range(L)]
    with kvdock.Client(socket, name=f"saver-{path}", timeout=300) as cli:
        conn = kvdock.Connector(cli, f"saver-{path}", block_size=BS, kv_caches=kv,
                                budget_bytes=3 << 30, pool_name=f"saver-{path}-kv", path=path)
        table = list(range(PROMPT // BS))
        pipe.send("ready")
        n = 0
        while True:
            msg = pipe.recv()
            if msg == "quit":
                break
            moved, t0 = 0, time.time()
            while not pipe.poll():
                ids = prompt_ids(1000 + n, PROMPT)  # new keys: every block is stored
                n += 1
                r = conn.save(ids, table).wait()
                moved += r.bytes
            pipe.recv()
            pipe.send(moved / (time.time() - t0) / 1e9)
        conn.close()


# ---------------------------------------------------------------------------
# The orchestrator

def start_daemon(build, tmp, out):
    sock = os.path.join(tmp, "kvdockd.sock")
    log = open(os.path.join(out, "engine-kvdockd.log"), "w")
    p = subprocess.Popen([str(Path(build) / "daemon" / "kvdockd"), "--backend", "cuda",
                          "--socket", sock, "--log-level", "warn",
                          "--host-memory-budget", "24G"], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(sock):
            return p, sock
        if p.poll() is not None:
            raise SystemExit(f"kvdockd exited: {p.returncode}")
        time.sleep(0.05)
    raise SystemExit("kvdockd did not start")


def run(ctx, target, *args):
    """target(pipe, *args) in a process of its own; its one answer."""
    here, there = ctx.Pipe()
    p = ctx.Process(target=target, args=(there,) + args)
    p.start()
    there.close()  # so that recv ends (EOFError) when the child dies
    try:
        ans = here.recv()
    except EOFError:
        p.join()
        raise SystemExit(f"{target.__name__} died (exit {p.exitcode})")
    p.join()
    return ans


def phase_proof(ctx, sock):
    a = run(ctx, worker_a, sock, "1b", "fp32", 5 << 30)
    b = run(ctx, worker_b_proof, sock, "1b", "fp32")
    c = run(ctx, worker_c, sock, "1b", "fp32")
    return {"shape": "1b", "dtype": "fp32", "stored": a["stored"], **b,
            "other_salt_hit": c["hit"], "same_salt_hit": c["same_salt_hit"]}


def phase_ttft(ctx, sock, runs):
    rows = []
    for shape in ("1b", "8b"):
        budget = (3 if shape == "1b" else 5) << 30
        a = run(ctx, worker_a, sock, shape, "bf16", budget)
        b = run(ctx, worker_b_ttft, sock, shape, "bf16", runs)
        rows.append({"shape": shape, "dtype": "bf16", "stored": a["stored"], **b,
                     "ratio": b["layerwise"] / b["recompute"],
                     "ratio_whole": b["whole"] / b["recompute"], "target": TARGET[shape]})
    return rows


def phase_interference(ctx, sock, steps, rounds):
    dpipe, dchild = ctx.Pipe()
    dec = ctx.Process(target=worker_decode, args=(dchild, steps))
    dec.start()
    dchild.close()
    savers = {}
    for path in ("copy_engine", "kernel"):
        here, there = ctx.Pipe()
        p = ctx.Process(target=worker_saver, args=(there, sock, path))
        p.start()
        there.close()
        savers[path] = (here, p)
    assert dpipe.recv() == "ready"
    for here, _ in savers.values():
        assert here.recv() == "ready"
    times = {"none": [], "copy_engine": [], "kernel": []}
    rates = {"copy_engine": [], "kernel": []}
    for _ in range(rounds):
        for cond in ("none", "copy_engine", "none", "kernel"):
            if cond != "none":
                savers[cond][0].send("go")
                time.sleep(0.5)
            dpipe.send("measure")
            times[cond] += dpipe.recv()
            if cond != "none":
                savers[cond][0].send("stop")
                rates[cond].append(savers[cond][0].recv())
    dpipe.send("measure")
    times["none"] += dpipe.recv()
    dpipe.send("quit")
    dec.join()
    for here, p in savers.values():
        here.send("quit")
        p.join()
    base = statistics.median(times["none"])
    return [{"condition": c, "decode_ms": statistics.median(t),
             "pct": 100 * (statistics.median(t) / base - 1),
             "save_gbps": statistics.median(rates[c]) if c in rates else None}
            for c, t in times.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build folder (daemon/, client/)")
    ap.add_argument("--phases", default="proof,ttft,interference")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per TTFT figure")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interference rounds")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    os.environ["KVDOCK_LIB"] = str(Path(args.build) / "client" / "libkvdock.so")
    sys.path.insert(0, str(REPO / "client" / "python"))
    os.environ["PYTHONPATH"] = (str(REPO / "client" / "python") + os.pathsep +
                                os.environ.get("PYTHONPATH", ""))
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="kvdock-engine-")
    daemon, sock = start_daemon(args.build, tmp, args.out)
    result = {"torch": torch.__version__, "transformers": transformers.__version__}
    failed = False
    try:
        phases = args.phases.split(",")
        if "proof" in phases:
            p = result["proof"] = phase_proof(ctx, sock)
            p["ok"] = (p["hit"] == SHARED and p["max_abs_diff"] <= LOGIT_BOUND and
                       p["greedy_equal"] and p["other_salt_hit"] == 0)
            print(f"\nproof (1B shape, float32, {PROMPT:,}-token prompt of A, {SHARED:,} shared "
                  f"with B's): A stored {p['stored']} blocks; B hit {p['hit']:,} tokens; "
                  f"last-token logits max |reuse - recompute| {p['max_abs_diff']:.3g} "
                  f"(largest |logit| {p['max_abs_logit']:.3g}); same argmax {p['same_argmax']}; "
                  f"32 greedy tokens equal {p['greedy_equal']}; another salt hit "
                  f"{p['other_salt_hit']} (same salt {p['same_salt_hit']:,}): "
                  f"{'PASS' if p['ok'] else 'FAIL'} (bound {LOGIT_BOUND:g})", flush=True)
            if not p["ok"]:
                failed = True
        if "ttft" in phases:
            rows = result["ttft"] = phase_ttft(ctx, sock, args.runs)
            print(f"\nTTFT of B (bf16, {SHARED:,} of {PROMPT:,} tokens reused), median of "
                  f"{args.runs}, ms:")
            print(f"{'shape':6} {'recompute':>10} {'reuse':>8} {'ratio':>6} {'target':>7} "
                  f"{'whole load first':>17} {'load alone':>11} {'suffix alone':>13} {'GB':>5}")
            for r in rows:
                print(f"{r['shape']:6} {r['recompute']:10.1f} {r['layerwise']:8.1f} "
                      f"{r['ratio']:6.3f} {r['target']:7.1f} {r['whole']:17.1f} "
                      f"{r['load']:11.1f} {r['suffix']:13.1f} {r['load_bytes'] / 1e9:5.2f}")
        if "interference" in phases:
            rows = result["interference"] = phase_interference(ctx, sock, args.steps,
                                                               args.rounds)
            print("\nworker D's decode step (1B shape, bf16, 32 x 1,024 tokens of context) while "
                  "worker S saves 16,384-token prompts:")
            for r in rows:
                rate = f"{r['save_gbps']:.1f} GB/s" if r["save_gbps"] is not None else "-"
                print(f"  {r['condition']:12} {r['decode_ms']:8.3f} ms {r['pct']:+6.1f}%  "
                      f"saves {rate}")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        Path(args.out, "engine.json").write_text(json.dumps(result, indent=1))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

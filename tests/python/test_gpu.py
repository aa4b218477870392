"""The kvdock Python client on the GPU machine (label gpu): a worker written
as an inference engine writes it, against kvdockd --backend cuda.

- Its KV cache is per-layer CUDA tensors allocated with PyTorch, imported
  into the daemon (each tensor's allocation by its CUDA IPC handle and the
  tensor's offset); K/V stored through the daemon; offloaded to a daemon
  host pool; the device copy cleared; reloaded; compared with torch.equal.
- Stream ordering with interprocess events: the worker's stream writes the
  source after a long stretch of work and records an event; the daemon
  waits on it before transferring; the result shows that the order held.
  And back: the daemon records an event, answering at enqueue, and the
  worker's stream waits on it before reading.
- A daemon-owned device pool mapped here as CUDA tensors without a copy;
  operands in registered device buffers; fp8 from CUDA bf16 tensors against
  the kernel library's CPU reference.
- The cache tier: blocks saved from the imported KV cache, loaded back into
  other pages with one event per layer group (each group read on a stream
  that waits on its event only), and a second worker process that looks
  the prompt up and loads what the first saved into its own KV cache.
- kvdock.copy_rows: scattered 2 KiB rows gathered by the kernel within two
  blocks on a low-priority stream queued behind other work, and on the
  copy engines, against torch's indexing; the staging recipe (gather,
  the daemon offloads the staging pool whole, reloads it, scatter).
- kvdock.Connector on a CUDA KV cache in vLLM's layout: a save ordered
  after the stream's late writes, a load waited on layer by layer by the
  stream (no host wait), and a failed load whose flags are set anyway so
  that the stream does not wait forever.

Skips (exit 77 through run_suite.py, printing why) where PyTorch has no
usable CUDA device or libkvdock was built without CUDA.

PyTorch only, no numpy: the GPU machine has PyTorch without numpy, and so
the client's CUDA and CPU tensor paths are checked there as they run.
test_no_numpy.py imports this module with numpy blocked, so that a numpy
import here fails the CPU CI.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import harness
import kvdock

torch = harness.torch_or_none()
D: harness.Daemon = None  # type: ignore[assignment]


def _why_no_gpu() -> str:
    if torch is None:
        return "PyTorch is not importable"
    try:
        if not torch.cuda.is_available():
            return f"torch.cuda has no usable device (torch {torch.__version__})"
    except Exception as e:  # noqa: BLE001
        return f"torch.cuda fails: {e}"
    if not kvdock.Client.has_cuda():
        return "libkvdock was built without CUDA (device mappings unsupported)"
    return ""


def setUpModule() -> None:
    global D
    why = _why_no_gpu()
    if why:
        raise unittest.SkipTest(why)
    torch.cuda.init()
    D = harness.Daemon("cuda")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean(timeout=60)


def sleep_on(stream, ms: float) -> None:
    """Keep stream busy for about ms milliseconds."""
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            # ~1.5 GHz: cycles per ms, generously
            torch.cuda._sleep(int(ms * 2_000_000))
        else:  # pragma: no cover - every CUDA build of torch has _sleep
            x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
            for i in range(int(ms)):
                x.fill_(i & 0xFF)


class GpuBase(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = kvdock.Client(D.socket, name="gpu-" + self.id().rsplit(".", 1)[-1][:40],
                                 timeout=120)
        self.assertEqual(self.cli.info.backend, "cuda")
        self.tag = f"{self.id().rsplit('.', 1)[-1][:30]}-{os.getpid()}"
        self.gen = torch.Generator(device="cuda").manual_seed(7)

    def tearDown(self) -> None:
        self.cli.close()


class TestWorker(GpuBase):
    def engine_round_trip(self, mla: bool) -> None:
        """Store, offload, clear, reload: what a serving engine does."""
        L, S, H, Dh, T = 4, 256, 8, 64, 40
        dev = torch.device("cuda")
        if mla:
            # MLA: one latent per layer, e.g. kv_lora_rank + rope dim.
            k_cache = [torch.zeros(S, 576, dtype=torch.bfloat16, device=dev) for _ in range(L)]
            v_cache = None
        else:
            # As engines do: one allocation per layer and per K/V (some
            # share an allocation of the caching allocator, some do not).
            k_cache = [torch.zeros(S, H, Dh, dtype=torch.bfloat16, device=dev) for _ in range(L)]
            v_cache = [torch.zeros(S, H, Dh, dtype=torch.bfloat16, device=dev) for _ in range(L)]
        torch.cuda.synchronize()
        gpu = self.cli.import_pool(f"kv-{self.tag}-{int(mla)}", k_cache, v_cache)
        self.assertTrue(gpu.info.imported)
        self.assertEqual(gpu.info.kind, "device")
        self.assertEqual(gpu.info.num_slots, S)
        row_bytes = k_cache[0][0].numel() * 2
        self.assertEqual(gpu.info.slot_bytes, row_bytes)
        host = self.cli.create_pool(f"off-{self.tag}-{int(mla)}", L, S, row_bytes, kind="host",
                                    mla=mla)

        # The forward pass produced K/V for T tokens; store them through the
        # daemon at their slots (CUDA operands: staged in device buffers).
        loc = torch.randperm(S, device=dev)[:T]
        ks, vs = [], []
        for l in range(L):
            k = torch.randn(T, *k_cache[0].shape[1:], generator=self.gen, device=dev,
                            dtype=torch.float32).to(torch.bfloat16)
            v = None if mla else torch.randn(T, H, Dh, generator=self.gen, device=dev,
                                             dtype=torch.float32).to(torch.bfloat16)
            res = self.cli.store(gpu, l, loc, k, v)
            self.assertEqual(res.rows, T)
            ks.append(k)
            vs.append(v)
        for l in range(L):
            self.assertTrue(torch.equal(k_cache[l][loc], ks[l]), f"K of layer {l} after store")
            if not mla:
                self.assertTrue(torch.equal(v_cache[l][loc], vs[l]), f"V of layer {l}")
        snapshot = [t.clone() for t in k_cache] + ([t.clone() for t in v_cache] if v_cache else [])

        # Offload every layer of those slots to the host pool.
        host_slots = torch.arange(T)
        ready = torch.cuda.Event(interprocess=True)
        ready.record()
        res = self.cli.transfer(gpu, host, loc.cpu(), host_slots, wait_event=ready)
        self.assertEqual(res.skipped_oob, 0)
        hm = host.map()
        for l in range(L):
            self.assertTrue(torch.equal(hm.k_tensor(l, torch.bfloat16)[:T].cuda(),
                                        ks[l].reshape(T, -1)), f"offloaded K {l}")

        # The device copy is cleared (the slots are reused) ...
        for t in k_cache + (v_cache or []):
            t.zero_()
        ready.record()
        # ... and reloaded, ordered after the clearing by the event.
        self.cli.transfer(host, gpu, host_slots, loc.cpu(), wait_event=ready)
        after = k_cache + (v_cache or [])
        for i, (a, b) in enumerate(zip(after, snapshot)):
            self.assertTrue(torch.equal(a, b), f"tensor {i} after the reload")

        # Layer by layer too, collected as futures.
        for t in k_cache + (v_cache or []):
            t.zero_()
        ready.record()
        futs = [self.cli.transfer_async(host, gpu, host_slots, loc.cpu(), layer=l,
                                        wait_event=ready) for l in range(L)]
        for f in reversed(futs):
            f.result(120)
        for i, (a, b) in enumerate(zip(after, snapshot)):
            self.assertTrue(torch.equal(a, b), f"tensor {i} after the per-layer reload")
        host.drop()
        gpu.drop()

    def test_engine_mha(self):
        self.engine_round_trip(mla=False)

    def test_engine_mla(self):
        self.engine_round_trip(mla=True)

    def test_operands_in_device_buffers(self):
        S, B, T = 64, 256, 16
        pool = self.cli.create_pool(f"dp-{self.tag}", 2, S, B, kind="device")
        m = pool.map()
        self.assertEqual(m.kind, "device")
        kbuf = self.cli.register_buffer(T * B, device=True)
        vbuf = self.cli.register_buffer(T * B, device=True)
        ibuf = self.cli.register_buffer(T * 8, device=True)
        k = kbuf.tensor(torch.uint8, (T, B))
        v = vbuf.tensor(torch.uint8, (T, B))
        loc = ibuf.tensor(torch.int64, (T,))
        self.assertTrue(k.is_cuda and loc.is_cuda)
        k.copy_(torch.randint(0, 256, (T, B), dtype=torch.uint8, device="cuda"))
        v.copy_(torch.randint(0, 256, (T, B), dtype=torch.uint8, device="cuda"))
        loc.copy_(torch.randperm(S, device="cuda")[:T])
        # By reference (they lie in registered buffers); the client
        # synchronises the current stream since no wait event is given.
        self.cli.store(pool, 1, loc, k, v)
        kt, vt = m.k_tensor(1), m.v_tensor(1)  # the daemon's pool, no copy
        self.assertTrue(kt.is_cuda)
        self.assertEqual(kt.data_ptr(), m.base + pool.info.layer_stride)
        self.assertTrue(torch.equal(kt[loc], k))
        self.assertTrue(torch.equal(vt[loc], v))
        # Written here through the mapped tensor, moved by the daemon.
        m.k_tensor(0).fill_(0x42)
        torch.cuda.synchronize()
        host = self.cli.create_pool(f"hp-{self.tag}", 2, S, B, kind="host")
        self.cli.transfer(pool, host, list(range(S)), list(range(S)), layer=0)
        self.assertTrue(bool((host.map().k_tensor(0) == 0x42).all()))
        for b in (kbuf, vbuf, ibuf):
            b.drop()
        host.drop()
        pool.drop()

    def test_fp8_from_cuda_tensors(self):
        S, H, Dh, T = 64, 8, 128, 24
        pool = self.cli.create_pool(f"fp8-{self.tag}", 1, S, H * Dh, kind="device")
        m = pool.map()
        m.tensor().fill_(0)
        torch.cuda.synchronize()
        k = (torch.randn(T, H, Dh, generator=self.gen, device="cuda") * 50).to(torch.bfloat16)
        v = torch.randn(T, H, Dh, generator=self.gen, device="cuda").to(torch.bfloat16)
        loc = torch.randperm(S, device="cuda")[:T]
        self.cli.fp8_set(pool, 0, loc, k, v, k_scale=2.0, v_scale=0.5)
        got = m.tensor().cpu()
        ref = torch.zeros_like(got)
        harness.fp8_reference(ref, pool.info, 0, loc.cpu(), k.cpu().view(torch.int16),
                              v.cpu().view(torch.int16), 5, 6, 1, 2.0, 0.5)
        self.assertTrue(torch.equal(got, ref), "fp8 from CUDA bf16 tensors")
        pool.drop()


class TestEvents(GpuBase):
    def test_stream_ordering_with_interprocess_events(self):
        S, B = 128, 4096
        src = torch.full((2, S, B), 0x11, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        dev = self.cli.import_pool(f"ev-src-{self.tag}", [src[0]], [src[1]])
        host = self.cli.create_pool(f"ev-dst-{self.tag}", 1, S, B, kind="host")
        hm = host.map()
        hm.tensor().fill_(0)
        ready = torch.cuda.Event(interprocess=True)
        done = torch.cuda.Event(interprocess=True)
        ev_ready = self.cli.register_event(ready)
        ev_done = self.cli.register_event(done)
        idx = torch.arange(S)
        stream = torch.cuda.Stream()

        # The worker's stream: a long stretch of work, then the source's
        # final values, then the event.  Nothing is synchronised here.  The
        # ordering is tested only when the stream is still busy once the
        # request has been sent: otherwise again with a stretch four times
        # as long, and the test fails when three tries never got there.
        for attempt, ms in enumerate((300, 1200, 4800)):
            hm.tensor().fill_(0)
            src.fill_(0x11)
            torch.cuda.synchronize()
            sleep_on(stream, ms)
            with torch.cuda.stream(stream):
                src.fill_(0xAB)
                ready.record(stream)
            fut = self.cli.transfer_async(dev, host, idx, idx, wait_event=ev_ready)
            was_busy = not ready.query()
            fut.result(120)
            k, v = hm.k_tensor(0), hm.v_tensor(0)
            bad = (k != 0xAB).reshape(-1).nonzero().reshape(-1)
            first = int(k.reshape(-1)[bad[0]]) if bad.numel() else 0
            self.assertEqual(bad.numel(), 0, f"{bad.numel()} bytes of K were copied before the "
                                             f"worker's event (first {first:#x})")
            self.assertTrue(bool((v == 0xAB).all()), "V copied before the worker's event")
            stream.synchronize()
            if was_busy:
                break
            print(f"\nordering: the worker's stream ({ms} ms) was done before the request was "
                  "sent; again, longer")
        self.assertTrue(was_busy, "the worker's stream was done before the transfer was sent, "
                                  "three times: the ordering was not tested")

        # Back: the daemon answers at enqueue and records `done`; the
        # worker's stream waits on it before it reads.
        hm.tensor().fill_(0xCD)
        res = self.cli.transfer(host, dev, idx, idx, record_event=ev_done,
                                reply_at_enqueue=True)
        self.assertTrue(res.enqueued, "the reply_at_enqueue reply is not marked enqueued")
        with torch.cuda.stream(stream):
            stream.wait_event(done)
            out = src.to("cpu", non_blocking=False)
        stream.synchronize()
        self.assertTrue(bool((out == 0xCD).all()),
                        "the worker read the rows before the daemon's recorded event")
        # torch.cuda.Event objects passed directly are registered once.
        with torch.cuda.stream(stream):
            ready.record(stream)
        self.cli.transfer(dev, host, idx[:4], idx[:4], wait_event=ready)
        self.cli.drop_event(ev_ready)
        self.cli.drop_event(ev_done)
        host.drop()
        dev.drop()


# ---------------------------------------------------------------------------
# The cache tier

L_C, T_C, H_C, DH_C, PAGES_C = 8, 16, 8, 64, 64  # layers, tokens a block, heads, dim, pages


def cache_worker_kv(cli, name: str):
    """A worker's paged KV cache: per layer K and V [pages * T, H, Dh] bf16,
    imported with pages of T_C slots."""
    k = [torch.zeros(PAGES_C * T_C, H_C, DH_C, dtype=torch.bfloat16, device="cuda")
         for _ in range(L_C)]
    v = [torch.zeros_like(t) for t in k]
    torch.cuda.synchronize()
    return k, v, cli.import_pool(name, k, v, page_size=T_C)


def prompt_blocks(seed: int, n: int):
    """The prompt's token ids and each block's K/V (layer-major), the same
    in every process for a seed."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tokens = torch.randint(0, 32000, (n * T_C,), generator=g, device="cuda").tolist()
    kv = torch.randn(L_C, 2, n, T_C, H_C, DH_C, generator=g, device="cuda").to(torch.bfloat16)
    return tokens, kv


def write_pages(k, v, kv, pages) -> None:
    for l in range(L_C):
        for i, p in enumerate(pages):
            k[l][p * T_C:(p + 1) * T_C] = kv[l, 0, i]
            v[l][p * T_C:(p + 1) * T_C] = kv[l, 1, i]


def pages_hold(k, v, kv, pages, layers=range(L_C)) -> bool:
    return all(torch.equal(k[l][p * T_C:(p + 1) * T_C], kv[l, 0, i]) and
               torch.equal(v[l][p * T_C:(p + 1) * T_C], kv[l, 1, i])
               for l in layers for i, p in enumerate(pages))


class TestCache(GpuBase):
    def make_cache(self, name: str) -> kvdock.Cache:
        return self.cli.create_cache(name, num_layers=L_C, tokens_per_block=T_C,
                                     token_bytes=H_C * DH_C * 2, dtype="bf16",
                                     budget_bytes=256 * L_C * 2 * T_C * H_C * DH_C * 2)

    def test_save_load_layer_events(self):
        n = 24
        k, v, gpu = cache_worker_kv(self.cli, f"ckv-{self.tag}")
        cache = self.make_cache(f"c-{self.tag}")
        tokens, kv = prompt_blocks(11, n)
        keys = kvdock.block_hashes(tokens, T_C, salt=b"test-model")
        src = [(i * 5) % PAGES_C for i in range(n)]  # scattered pages
        write_pages(k, v, kv, src)
        done = torch.cuda.Event(interprocess=True)
        done.record()
        r = cache.save(gpu, keys, blocks=src, wait_event=done)
        self.assertEqual((r.stored, r.skipped), (n, 0))
        self.assertEqual(r.path, "copy_engine")
        self.assertEqual(cache.lookup(keys).hits, n)
        # the worker reuses the pages: load into others, a layer group at a
        # time; a stream that waits on group g's event reads group g only
        for t in k + v:
            t.zero_()
        torch.cuda.synchronize()
        dst = [PAGES_C - 1 - i for i in range(n)]
        groups = 4
        evs = [torch.cuda.Event(interprocess=True) for _ in range(groups)]
        hit = cache.lookup(keys, lease=True)
        self.assertEqual(hit.hits, n)
        r = cache.load(gpu, lease=hit.lease, blocks=dst, layer_events=evs, reply_at_enqueue=True)
        self.assertTrue(r.enqueued)
        stream = torch.cuda.Stream()
        per = L_C // groups
        seen = []
        for g in range(groups):
            with torch.cuda.stream(stream):
                stream.wait_event(evs[g])
                seen.append([(k[l].clone(), v[l].clone()) for l in range(g * per, (g + 1) * per)])
        stream.synchronize()
        for g in range(groups):
            for j, (kk, vv) in enumerate(seen[g]):
                l = g * per + j
                self.assertTrue(all(torch.equal(kk[p * T_C:(p + 1) * T_C], kv[l, 0, i]) and
                                    torch.equal(vv[p * T_C:(p + 1) * T_C], kv[l, 1, i])
                                    for i, p in enumerate(dst)),
                                f"layer {l} read after its group's event was not whole")
        self.assertTrue(pages_hold(k, v, kv, dst))
        st = cache.stats()
        self.assertEqual((st.blocks, st.loaded, st.leases), (n, n, 0))
        cache.drop()
        gpu.drop()

    def test_load_layer_flags(self):
        """Flags in a device buffer: the worker's stream waits for group g's
        flag, queued before the daemon has even received the load, then
        reads group g; every read finds its layers whole."""
        n, groups = 48, 4
        k, v, gpu = cache_worker_kv(self.cli, f"fkv-{self.tag}")
        cache = self.make_cache(f"f-{self.tag}")
        tokens, kv = prompt_blocks(31, n)
        keys = kvdock.block_hashes(tokens, T_C, salt=b"test-model")
        write_pages(k, v, kv, range(n))
        torch.cuda.synchronize()
        cache.save(gpu, keys, blocks=range(n))
        for t in k + v:
            t.zero_()
        flags = self.cli.register_buffer(4 * groups, device=True)
        flags.tensor(torch.int32).zero_()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        per = L_C // groups
        seen = []
        for g in range(groups):  # queued first: the waits hold the stream
            flags.wait_value(4 * g, 1, stream)
            with torch.cuda.stream(stream):
                seen.append([(k[l].clone(), v[l].clone()) for l in range(g * per, (g + 1) * per)])
        fut = cache.load_async(gpu, keys, blocks=range(n), layer_flags=flags, flag_value=1)
        fut.result(120)
        stream.synchronize()
        for g in range(groups):
            for j, (kk, vv) in enumerate(seen[g]):
                l = g * per + j
                self.assertTrue(all(torch.equal(kk[p * T_C:(p + 1) * T_C], kv[l, 0, p]) and
                                    torch.equal(vv[p * T_C:(p + 1) * T_C], kv[l, 1, p])
                                    for p in range(n)),
                                f"layer {l} read after its group's flag was not whole")
        self.assertEqual(flags.tensor(torch.int32).tolist(), [1] * groups)
        flags.drop()
        cache.drop()
        gpu.drop()

    def test_second_worker_loads_the_prefix(self):
        """Worker A saves a prompt's blocks; worker B, another process with
        its own KV cache, gets a prompt sharing the first 20 blocks, looks
        it up, loads the hits and finds A's bytes."""
        n = 28
        k, v, gpu = cache_worker_kv(self.cli, f"akv-{self.tag}")
        name = f"shared-{self.tag}"
        cache = self.make_cache(name)
        tokens, kv = prompt_blocks(23, n)
        keys = kvdock.block_hashes(tokens, T_C, salt=b"test-model")
        write_pages(k, v, kv, range(n))
        torch.cuda.synchronize()
        self.assertEqual(cache.save(gpu, keys[:20], blocks=range(20)).stored, 20)
        out = subprocess.run([sys.executable, __file__, "cache-worker-b", D.socket, name, "23"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("worker b: 20 of 28 blocks hit, loaded, equal", out.stdout)
        self.assertEqual(cache.stats().loaded, 20)
        cache.drop()
        gpu.drop()


class TestConnector(GpuBase):
    """kvdock.Connector on CUDA tensors in vLLM's layout: layer-wise loads
    waited on by the stream, saves ordered after the stream's work, and a
    failed load that must not leave the stream waiting forever."""

    def tearDown(self) -> None:
        self.doCleanups()  # the connector and its cache go before the client
        super().tearDown()

    def connector(self):
        kv = torch.zeros(L_C, 2, PAGES_C, T_C, H_C, DH_C, dtype=torch.bfloat16, device="cuda")
        conn = kvdock.Connector(self.cli, f"conn-{self.tag}", block_size=T_C, kv_caches=kv,
                                salt=b"test-model", pool_name=f"connkv-{self.tag}",
                                budget_bytes=256 * L_C * 2 * T_C * H_C * DH_C * 2)
        self.addCleanup(lambda: self.cli.drop_cache(f"conn-{self.tag}"))
        self.addCleanup(conn.close)
        k = [kv[l, 0].view(PAGES_C * T_C, H_C, DH_C) for l in range(L_C)]
        v = [kv[l, 1].view(PAGES_C * T_C, H_C, DH_C) for l in range(L_C)]
        return kv, k, v, conn

    def test_layerwise_load_on_the_stream(self):
        n = 20
        kv_all, k, v, conn = self.connector()
        tokens, kv = prompt_blocks(41, n)
        # the pages are written late on the current stream: the save waits
        sleep_on(torch.cuda.current_stream(), 200)
        write_pages(k, v, kv, range(n))
        conn.save(tokens, list(range(n)))
        self.assertEqual(conn.wait_for_saves(), n)
        kv_all.zero_()
        self.assertEqual(conn.lookup(tokens), n * T_C)
        dst = [PAGES_C - 1 - i for i in range(n)]
        sleep_on(torch.cuda.current_stream(), 50)  # the load waits for the stream too
        ld = conn.load(tokens, dst)
        seen = []
        for l in range(L_C):
            ld.wait_layer(l)  # queued on the stream; no host wait
            seen.append((k[l].clone(), v[l].clone()))
        torch.cuda.synchronize()
        self.assertEqual(ld.wait(120).rows, n)
        for l, (kk, vv) in enumerate(seen):
            self.assertTrue(all(torch.equal(kk[p * T_C:(p + 1) * T_C], kv[l, 0, i]) and
                                torch.equal(vv[p * T_C:(p + 1) * T_C], kv[l, 1, i])
                                for i, p in enumerate(dst)),
                            f"layer {l} read after wait_layer({l}) was not whole")

    def test_failed_load_does_not_hang_the_stream(self):
        import threading
        kv_all, k, v, conn = self.connector()
        tokens, _ = prompt_blocks(43, 4)
        # the kernel queued behind the waits is loaded first, as a serving
        # engine's are: a lazy module load waits for the device to go idle,
        # which a stream waiting on flags never does
        k[0].add_(0)
        torch.cuda.synchronize()
        ld = conn.load(tokens, [0, 1, 2, 3])  # never saved: ENOENT
        for l in range(L_C):
            ld.wait_layer(l)
        k[0].add_(1)  # queued behind the waits
        synced = threading.Event()
        t = threading.Thread(target=lambda: (torch.cuda.synchronize(), synced.set()),
                             daemon=True)
        t.start()
        self.assertTrue(synced.wait(60), "the stream still waits on a failed load's flags")
        with self.assertRaises(kvdock.Error) as cm:
            ld.wait(60)
        self.assertEqual(cm.exception.name, "ENOENT")
        self.assertEqual(conn.failed_loads, 1)


def cache_worker_b(socket: str, name: str, seed: int) -> int:
    """The second worker (its own process): a prompt whose first 20 blocks
    are those worker A saved, then its own."""
    cli = kvdock.Client(socket, name="worker-b", timeout=120)
    k, v, gpu = cache_worker_kv(cli, f"bkv-{os.getpid()}")
    cache = cli.cache(name)
    tokens, kv = prompt_blocks(seed, 28)
    tokens = tokens[:20 * T_C] + [7] * (8 * T_C)  # the same prefix, another ending
    keys = kvdock.block_hashes(tokens, T_C, salt=b"test-model")
    hit = cache.lookup(keys, lease=True)
    pages = list(range(30, 30 + hit.hits))
    cache.load(gpu, lease=hit.lease, blocks=pages)
    ok = pages_hold(k, v, kv[:, :, :hit.hits], pages)
    print(f"worker b: {hit.hits} of {len(keys)} blocks hit, loaded, "
          f"{'equal' if ok else 'DIFFERENT'}")
    gpu.drop()
    cli.close()
    return 0 if ok and hit.hits == 20 else 1


class TestCopyRows(GpuBase):
    """kvdock.copy_rows on CUDA tensors: the budgeted kernel on a side
    stream, the copy engines, and the staging recipe through the daemon."""

    def cache(self, L: int, S: int) -> "list":
        return [torch.randn(S, 8, 128, generator=self.gen, device="cuda").to(torch.bfloat16)
                for _ in range(L)]  # 2 KiB rows

    def test_gather_on_a_side_stream_within_two_blocks(self):
        L, S, N = 4, 4096, 1000
        k, v = self.cache(L, S), self.cache(L, S)
        ok = [torch.full((N, 8, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
              for _ in range(L)]
        ov = [t.clone() for t in ok]
        rows = torch.randperm(S, generator=self.gen, device="cuda")[:N]
        rows32 = rows.to(torch.int32)
        side = torch.cuda.Stream(priority=0)
        side.wait_stream(torch.cuda.current_stream())  # after the tensors above
        sleep_on(side, 20)  # the copy must follow what the side stream holds
        kvdock.copy_rows(k, ok, rows32, list(range(N)), src_v=v, dst_v=ov,
                         max_blocks=2, stream=side)
        side.synchronize()
        for l in range(L):
            self.assertTrue(torch.equal(ok[l], k[l][rows]), f"K of layer {l}")
            self.assertTrue(torch.equal(ov[l], v[l][rows]), f"V of layer {l}")
        # the same on the copy engines (indices read on the host)
        for t in ok:
            t.fill_(float("nan"))
        kvdock.copy_rows(k, ok, rows.cpu(), torch.arange(N), copy_engine=True)
        torch.cuda.current_stream().synchronize()
        for l in range(L):
            self.assertTrue(torch.equal(ok[l], k[l][rows]), f"K of layer {l}, copy engines")
        # the same layers again (their address tables kept from the first
        # call), other rows, on the current stream
        again = torch.randperm(S, generator=self.gen, device="cuda")[:N]
        kvdock.copy_rows(k, ok, again, range(N), src_v=v, dst_v=ov, max_blocks=8)
        torch.cuda.current_stream().synchronize()
        for l in range(L):
            self.assertTrue(torch.equal(ok[l], k[l][again]), f"K of layer {l}, again")
            self.assertTrue(torch.equal(ov[l], v[l][again]), f"V of layer {l}, again")

    def test_staging_then_the_daemon_moves_it_whole(self):
        L, S, N = 4, 4096, 512
        k, v = self.cache(L, S), self.cache(L, S)
        sk = [torch.zeros(N, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(L)]
        sv = [torch.zeros_like(t) for t in sk]
        torch.cuda.synchronize()
        staged = self.cli.import_pool(f"stage-{self.tag}", sk, sv)
        host = self.cli.create_pool(f"host-{self.tag}", L, N, 2048, kind="host")
        rows = torch.randperm(S, generator=self.gen, device="cuda")[:N]
        seq = torch.arange(N, device="cuda")
        side = torch.cuda.Stream(priority=0)
        side.wait_stream(torch.cuda.current_stream())  # after the tensors above
        kvdock.copy_rows(k, sk, rows, seq, src_v=v, dst_v=sv, max_blocks=2, stream=side)
        packed = torch.cuda.Event(interprocess=True)
        packed.record(side)
        self.cli.transfer(staged, host, torch.arange(N), torch.arange(N), wait_event=packed)
        hm = host.map()
        for l in range(L):
            self.assertTrue(torch.equal(hm.k_tensor(l, torch.bfloat16).cuda(),
                                        k[l][rows].reshape(N, -1)), f"offloaded K {l}")
            self.assertTrue(torch.equal(hm.v_tensor(l, torch.bfloat16).cuda(),
                                        v[l][rows].reshape(N, -1)), f"offloaded V {l}")
        # and back into other rows: the daemon fills the staging pool, the
        # worker scatters it
        for t in sk + sv:
            t.zero_()
        torch.cuda.synchronize()
        self.cli.transfer(host, staged, torch.arange(N), torch.arange(N))
        back = torch.randperm(S, generator=self.gen, device="cuda")[:N]
        k2, v2 = [t.clone() for t in k], [t.clone() for t in v]
        kvdock.copy_rows(sk, k2, seq, back, src_v=sv, dst_v=v2, max_blocks=2)
        torch.cuda.current_stream().synchronize()
        for l in range(L):
            self.assertTrue(torch.equal(k2[l][back], k[l][rows]), f"reloaded K {l}")
            self.assertTrue(torch.equal(v2[l][back], v[l][rows]), f"reloaded V {l}")
        host.drop()
        staged.drop()


class TestCluster(unittest.TestCase):
    """Two cuda daemons in one cluster (UCX over TCP on the loopback): a
    chain saved from one worker's device cache through daemon A is loaded
    into another worker's device cache through daemon B, bytes equal."""

    def test_saved_on_a_loaded_through_b(self):
        tmp = tempfile.mkdtemp(prefix="kvdock-cluster-")
        secret = os.path.join(tmp, "secret")
        with open(secret, "w") as f:
            f.write("a cluster secret of thirty-two b\n")
        os.chmod(secret, 0o600)
        ports: list = []
        while len(ports) < 2:  # below the ephemeral range, which outgoing connections use
            p = random.randrange(20000, 32000)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
                if p not in ports:
                    ports.append(p)
            except OSError:
                pass
            finally:
                s.close()
        peers = ",".join(f"127.0.0.1:{p}" for p in ports)
        os.environ.update(UCX_TLS="tcp", UCX_NET_DEVICES="lo", UCX_WARN_UNUSED_ENV_VARS="n")
        daemons = [harness.Daemon("cuda", extra=[
            "--cluster-listen", f"127.0.0.1:{p}", "--cluster-peers", peers,
            "--cluster-secret-file", secret]) for p in ports]
        for d in daemons:  # stopped last (cleanups run last first), each must exit 0
            self.addCleanup(d.stop_clean)
        clis = [kvdock.Client(d.socket, name=f"cluster-worker-{i}", timeout=120)
                for i, d in enumerate(daemons)]
        for c in clis:
            self.addCleanup(c.close)
        deadline = time.monotonic() + 15 * harness.time_scale()
        while not all(p["state"] == "up" for c in clis for p in c.status()["cluster"]["peers"]):
            self.assertLess(time.monotonic(), deadline, [c.status()["cluster"] for c in clis])
            time.sleep(0.05)
        n = 24
        conns, kvs = [], []
        for i, c in enumerate(clis):
            kv = torch.zeros(L_C, 2, PAGES_C, T_C, H_C, DH_C, dtype=torch.bfloat16, device="cuda")
            conn = kvdock.Connector(c, "cluster-kv", block_size=T_C, kv_caches=kv,
                                    salt=b"test-model", pool_name=f"clkv-{i}", cluster=True,
                                    budget_bytes=64 * L_C * 2 * T_C * H_C * DH_C * 2)
            self.addCleanup(conn.close)
            conns.append(conn)
            kvs.append(kv)
        tokens, blocks = prompt_blocks(77, n)
        k = [kvs[0][l, 0].view(PAGES_C * T_C, H_C, DH_C) for l in range(L_C)]
        v = [kvs[0][l, 1].view(PAGES_C * T_C, H_C, DH_C) for l in range(L_C)]
        write_pages(k, v, blocks, range(n))
        conns[0].save(tokens, list(range(n)))
        self.assertEqual(conns[0].wait_for_saves(), n)
        self.assertEqual(conns[1].lookup(tokens), n * T_C)  # on A only
        dst = [PAGES_C - 1 - i for i in range(n)]
        ld = conns[1].load(tokens, dst)
        self.assertEqual(ld.wait(120).rows, n)
        torch.cuda.synchronize()
        for i in range(n):
            self.assertTrue(torch.equal(kvs[1][:, :, dst[i]], kvs[0][:, :, i]), f"block {i}")
        st = clis[1].status()["cluster"]
        self.assertEqual(st["blocks_fetched"], n)
        self.assertTrue(clis[1].cache("cluster-kv").info.fetched == n)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "cache-worker-b":
        sys.exit(cache_worker_b(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    unittest.main(verbosity=2)

"""The kvdock Python client against the real kvdockd (cpu backend): every
operation end to end through bytes and numpy, data checked byte for byte
against references computed here (numpy copies, and the kernel library's
kvd_cpu_fp8_set for fp8), futures, and errors.  Needs numpy: skipped,
saying why, where it does not import (test_no_numpy.py covers the client
without it)."""

from __future__ import annotations

import concurrent.futures
import os
import random
import threading
import time
import unittest

try:
    import numpy as np
except ImportError as _e:  # e.g. the GPU machine: PyTorch without numpy
    np = None  # type: ignore[assignment]
    _NO_NUMPY = f"numpy is not importable ({_e}): this suite checks the numpy paths"

import harness
import kvdock

D: harness.Daemon = None  # type: ignore[assignment]


def setUpModule() -> None:
    global D
    if np is None:
        raise unittest.SkipTest(_NO_NUMPY)
    D = harness.Daemon("cpu")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean()


def connect(name: str = "py-test") -> kvdock.Client:
    return kvdock.Client(D.socket, name=name, timeout=30)


def rnd(shape, seed: int, dtype=None) -> np.ndarray:
    dtype = np.uint8 if dtype is None else dtype
    g = np.random.default_rng(seed)
    return g.integers(0, 256, size=shape, dtype=np.uint8).view(dtype) if dtype == np.uint8 else \
        g.integers(0, 256, size=tuple(shape[:-1]) + (shape[-1] * np.dtype(dtype).itemsize,),
                   dtype=np.uint8).view(dtype)


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = connect(self.id().rsplit(".", 1)[-1][:60])
        self._n = 0

    def tearDown(self) -> None:
        self.cli.close()

    def pool(self, layers=2, slots=64, slot_bytes=48, mla=False, page_size=0, fill=None):
        self._n += 1
        name = f"{self.id().rsplit('.', 1)[-1][:40]}-{self._n}-{os.getpid()}"
        p = self.cli.create_pool(name, layers, slots, slot_bytes, kind="host", mla=mla,
                                 page_size=page_size)
        m = p.map()
        if fill is not None:
            m.array()[:] = fill
        return p, m

    def assertBytesEqual(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        got, want = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
        self.assertEqual(got.shape, want.shape, what)
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        if bad.size:
            i = int(bad[0])
            self.fail(f"{what}: {bad.size} bytes differ, first at {i}: "
                      f"{got.reshape(-1)[i]:#04x} != {want.reshape(-1)[i]:#04x}")


# ---------------------------------------------------------------------------
class TestSession(Base):
    def test_hello_and_library(self):
        info = self.cli.info
        self.assertEqual(info.protocol_version, 2)
        self.assertEqual(info.backend, "cpu")
        self.assertTrue(info.daemon_version)
        self.assertGreater(info.limits.max_frame_bytes, 0)
        self.assertGreater(info.client_id, 0)
        self.assertTrue(info.admin)
        self.assertEqual(self.cli.socket_path, D.socket)
        self.assertTrue(self.cli.connected)
        self.assertGreaterEqual(self.cli.fd, 0)
        self.assertTrue(os.path.exists(kvdock.library_path()))
        self.assertIsInstance(kvdock.Client.has_cuda(), bool)

    def test_library_search(self):
        """library_path() loads nothing; $KVDOCK_LIB, when set, is the only
        choice: a path there that is absent or no library is an OSError
        naming it, never a silent fall back to another copy."""
        import subprocess
        import sys
        import tempfile

        probe = ("import kvdock\n"
                 "assert kvdock.library_path() is None\n"
                 "try:\n"
                 "    kvdock.Client(name='probe')\n"
                 "except OSError as e:\n"
                 "    print('OSError:', e)\n")
        with tempfile.NamedTemporaryFile(suffix=".so") as junk:
            junk.write(b"not a library")
            junk.flush()
            for lib, want in (("/nonexistent/libkvdock.so",
                               "KVDOCK_LIB=/nonexistent/libkvdock.so does not exist"),
                              (junk.name, f"KVDOCK_LIB={junk.name} cannot be loaded")):
                out = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                     text=True, timeout=60,
                                     env=dict(os.environ, KVDOCK_LIB=lib,
                                              KVDOCK_SOCKET=D.socket))
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("OSError: " + want, out.stdout)

    def test_context_manager_and_close(self):
        with connect("ctx") as c:
            c.ping(b"x")
            self.assertTrue(c.connected)
        self.assertFalse(c.connected)
        with self.assertRaises(kvdock.Error) as e:
            c.ping()
        self.assertEqual(e.exception.name, "ECONN")

    def test_ping_status_stats(self):
        for n in (0, 1, 100, 1 << 16):
            self.cli.ping(os.urandom(n))
        other = connect("status-other")
        st = self.cli.status()
        self.assertEqual(st["backend"], "cpu")
        self.assertGreaterEqual(st["clients"], 2)
        names = {c["name"] for c in st["clients_list"]}
        self.assertIn("status-other", names)
        me = [c for c in st["clients_list"] if c["id"] == self.cli.info.client_id][0]
        self.assertEqual(me["pid"], os.getpid())
        stats = self.cli.stats()
        ping = [o for o in stats["ops"] if o["op"] == "ping"]
        self.assertTrue(ping and ping[0]["requests"] >= 4)
        self.assertEqual(len(ping[0]["counts"]), len(ping[0]["bounds_us"]) + 1)
        other.close()


# ---------------------------------------------------------------------------
class TestPools(Base):
    def test_create_list_export_drop(self):
        p, m = self.pool(layers=3, slots=10, slot_bytes=40)
        q, _ = self.pool(layers=2, slots=32, slot_bytes=17, mla=True, page_size=16)
        self.assertEqual(p.info.kind, "host")
        self.assertEqual((p.info.num_layers, p.info.num_slots, p.info.slot_bytes), (3, 10, 40))
        self.assertTrue(q.info.mla)
        self.assertEqual(q.info.page_size, 16)
        ids = {i.id for i in self.cli.pools()}
        self.assertTrue({p.id, q.id} <= ids)
        self.assertEqual(self.cli.pool(p.name).id, p.id)
        # A second export, by name, maps the same pages.
        again = self.cli.export_pool(p.name)
        self.assertNotEqual(again.base, m.base)
        m.array()[:64] = 0x3C
        self.assertEqual(int(again.array()[63]), 0x3C)
        again.k(1)[2, 5] = 0x77
        self.assertEqual(int(m.array()[p.info.layer_stride + 2 * p.info.slot_stride + 5]), 0x77)
        self.assertEqual(m.k(2).shape, (10, 40))
        self.assertEqual(m.v(2).ctypes.data,
                         m.base + 2 * p.info.layer_stride + p.info.v_offset)
        with self.assertRaises(IndexError):
            m.k(3)
        with self.assertRaises(ValueError):
            q.map().v(0)
        self.assertEqual(q.map().latent(1).shape, (32, 17))
        bare = self.cli.export_pool(q, map=False)
        self.assertEqual(bare.base, 0)
        self.assertGreaterEqual(bare.fd, 0)
        bare.close()
        # Views outlive the mapping object: the pages stay mapped.
        view = again.k(0)
        again.close()
        view[0, 0] = 9
        self.assertEqual(int(m.k(0)[0, 0]), 9)
        p.drop()
        self.cli.drop_pool(q.name)
        ids = {i.id for i in self.cli.pools()}
        self.assertFalse({p.id, q.id} & ids)
        with self.assertRaises(kvdock.Error) as e:
            self.cli.export_pool(p.id)
        self.assertEqual(e.exception.name, "ENOENT")

    def test_dtype_views(self):
        p, m = self.pool(layers=1, slots=8, slot_bytes=64)
        f = m.k(0, np.float32)
        self.assertEqual(f.shape, (8, 16))
        f[3, 2] = 1.5
        self.assertEqual(m.k(0)[3, 8:12].tobytes(), np.float32(1.5).tobytes())
        self.assertEqual(m.v(0, "float16").shape, (8, 32))
        with self.assertRaises(ValueError):
            m.k(0, np.dtype("V3"))


# ---------------------------------------------------------------------------
class TestStore(Base):
    def check_store(self, *, mla: bool, loc, k, v, layer: int, via=None, **kw):
        p, m = self.pool(layers=3, slots=64, slot_bytes=48, mla=mla, fill=0xA5)
        ref = m.array().copy()
        res = self.cli.store(p, layer, loc if via is None else via[0],
                             k if via is None else via[1],
                             None if mla else (v if via is None else via[2]), **kw)
        self.assertFalse(res.enqueued)
        loc = np.asarray(loc).reshape(-1)
        kk = np.frombuffer(bytes(k), np.uint8).reshape(len(loc), -1)[:, :48]
        vv = None if mla else np.frombuffer(bytes(v), np.uint8).reshape(len(loc), -1)[:, :48]
        pi = p.info
        for i, s in enumerate(loc):
            if s < 0:
                continue
            o = layer * pi.layer_stride + int(s) * pi.slot_stride
            ref[o:o + 48] = kk[i]
            if not mla:
                o += pi.v_offset
                ref[o:o + 48] = vv[i]
        self.assertBytesEqual(m.array(), ref, "pool after store")
        return res

    def test_store_bytes_inline(self):
        loc = [5, 63, 0, -1, 17, 33, 2, 9, 60, 1]
        k, v = os.urandom(480), os.urandom(480)
        res = self.check_store(mla=False, loc=loc, k=k, v=v, layer=1)
        self.assertEqual(res.skipped_oob, 0)

    def test_store_numpy_mla_int32(self):
        loc = np.array([3, 7, -1, 40], dtype=np.int32)
        k = rnd((4, 48), 2)
        self.check_store(mla=True, loc=loc, k=k, v=None, layer=2)

    def test_store_src_stride(self):
        loc = np.array([1, 2, 3], dtype=np.int64)
        k, v = rnd((3, 64), 3), rnd((3, 64), 4)  # rows 64 bytes apart, 48 used
        self.check_store(mla=False, loc=loc, k=k, v=v, layer=0, src_stride=64)

    def test_store_via_registered_buffers(self):
        kb = self.cli.register_buffer(10 * 48, name="k")
        vb = self.cli.register_buffer(10 * 48 + 100, name="v")
        lb = self.cli.register_buffer(8 + 10 * 4, name="loc")
        self.assertEqual(kb.kind, "host")
        k, v = rnd((10, 48), 5), rnd((10, 48), 6)
        loc = np.array([5, 63, 0, -1, 17, 33, 2, 9, 60, 1], dtype=np.int32)
        kb.array()[:] = k.reshape(-1)
        vb.array()[100:] = v.reshape(-1)
        lb.array("int32", offset=8)[:10] = loc
        # By reference: explicit slices, and numpy views inside the buffers.
        self.check_store(mla=False, loc=loc, k=k, v=v, layer=1,
                         via=(lb.indices(10, "int32", 8), kb.ref(), vb.ref(100, 480)))
        self.check_store(mla=False, loc=loc, k=k, v=v, layer=2,
                         via=(lb.array("int32", (10,), 8), kb.array((np.uint8), (10, 48)),
                              vb.array(np.uint8, (10, 48), 100)))
        for b in (kb, vb, lb):
            b.drop()
        with self.assertRaises(kvdock.Error) as e:
            self.cli.drop_buffer(lb.id)
        self.assertEqual(e.exception.name, "ENOENT")

    def test_large_operands_are_staged(self):
        # Past the inline limit, operands and indices go through temporary
        # buffers that are dropped afterwards.
        self.cli.max_inline_bytes = 1024
        n = 60
        loc = np.arange(n, dtype=np.int64)[::-1].copy()
        k, v = rnd((n, 48), 7), rnd((n, 48), 8)
        before = self.cli.status()["buffers"]
        self.check_store(mla=False, loc=loc, k=k, v=v, layer=1)
        f = self.cli.store_async(self.pool(layers=1, slots=64)[0], 0, loc, k, v)
        self.assertEqual(f.result(10).rows, n)
        self.cli.ping()  # the drops were sent before this
        self.assertEqual(self.cli.status()["buffers"], before)

    def test_empty_store(self):
        p, m = self.pool(fill=1)
        res = self.cli.store(p, 0, np.zeros(0, np.int64), b"", b"")
        self.assertEqual(res.rows, 0)
        self.assertTrue((m.array() == 1).all())


# ---------------------------------------------------------------------------
FP8 = {"e4m3": 6, "e5m2": 7}
SRC = {"float32": 3, "float16": 4}


class TestFp8(Base):
    def run_case(self, src: str, cache: str, mode: int, page_size: int = 0):
        H, Dh, T = 4, 24, 7
        g = np.random.default_rng(hash((src, cache, mode)) & 0xFFFF)
        k = (g.standard_normal((T, H, Dh)) * 300).astype(src)  # some saturate e4m3
        v = (g.standard_normal((T, H, Dh)) * 2).astype(src)
        loc = np.array([3, 39, -1, 0, 21, 8, 30], dtype=np.int64)
        p, m = self.pool(layers=2, slots=40, slot_bytes=H * Dh, page_size=page_size, fill=0x5A)
        ref = m.array().copy()
        kw = {}
        khs, vhs = [0.5, 1.0, 2.0, 4.0], [3.0, 0.25, 1.0, 8.0]
        if mode == 1:
            kw = {"k_scale": 2.0, "v_scale": 0.5}
        elif mode == 2:
            kw = {"k_head_scales": khs, "v_head_scales": vhs}
        res = self.cli.fp8_set(p, 1, loc, k, v, cache_dtype=cache, **kw)
        self.assertEqual(res.rows, T)
        harness.fp8_reference(ref, p.info, 1, loc, k, v, SRC[src], FP8[cache], mode,
                      kw.get("k_scale", 1.0), kw.get("v_scale", 1.0),
                      khs if mode == 2 else None, vhs if mode == 2 else None, page_size)
        self.assertBytesEqual(m.array(), ref, f"fp8 {src}->{cache} mode {mode}")

    def test_fp8_f32_e4m3_none(self):
        self.run_case("float32", "e4m3", 0)

    def test_fp8_f16_e4m3_tensor_scale(self):
        self.run_case("float16", "e4m3", 1)

    def test_fp8_f32_e5m2_per_head(self):
        self.run_case("float32", "e5m2", 2)

    def test_fp8_paged_pool(self):
        self.run_case("float16", "e5m2", 1, page_size=4)

    def test_fp8_head_scales_count(self):
        # The C library reads num_heads scales: a shorter list is refused first.
        p, m = self.pool(layers=1, slots=8, slot_bytes=16, fill=0)
        k = np.ones((2, 2, 8), np.float32)
        with self.assertRaises(ValueError):
            self.cli.fp8_set(p, 0, [0, 1], k, k, k_head_scales=[1.0], v_head_scales=[1.0, 1.0])
        self.cli.fp8_set(p, 0, [0, 1], k, k, k_head_scales=[1.0, 2.0], v_head_scales=[1.0, 1.0])

    def test_fp8_shape_from_arguments(self):
        # Flat bytes need num_heads and head_dim (and the source dtype).
        p, m = self.pool(layers=1, slots=8, slot_bytes=16, fill=0)
        k = np.ones((2, 16), np.float32)
        with self.assertRaises(ValueError):
            self.cli.fp8_set(p, 0, [0, 1], k, k)
        self.cli.fp8_set(p, 0, [0, 1], k.tobytes(), k.tobytes(), num_heads=2, head_dim=8,
                         src_dtype="float32")
        self.assertTrue((m.k(0)[:2] == 0x38).all())  # 1.0 in e4m3


# ---------------------------------------------------------------------------
class TestGather(Base):
    def run_case(self, dtype: str, page_size: int):
        rows, cols, bs, maxp = 6, 10, 4, 8
        dt = np.dtype(dtype)
        tb = self.cli.register_buffer(rows * cols * dt.itemsize + 64)
        ob = self.cli.register_buffer(bs * maxp * dt.itemsize)
        table = tb.array(dt, (rows, cols), offset=64 if dt.itemsize == 8 else 32)
        table[:] = np.arange(rows * cols, dtype=dt).reshape(rows, cols) * 3 + 1
        out = ob.array(dt, (bs, maxp))
        out[:] = -7
        req = np.array([4, -1, 0, 5], np.int64)
        seq = np.array([17, 3, 0, 80], np.int64)
        res = self.cli.gather(table, req, seq, out, page_size=page_size, dummy_slot=-2)
        self.assertEqual(res.skipped_oob, 0)
        want = np.full((bs, maxp), -2, dt)
        for r in range(bs):
            if req[r] < 0:
                continue
            n = min(-(-int(seq[r]) // page_size), maxp, cols)
            want[r, :n] = table[req[r], :n]
        self.assertBytesEqual(out, want, f"gather {dtype} page {page_size}")
        tb.drop()
        ob.drop()

    def test_gather_int32(self):
        self.run_case("int32", 4)

    def test_gather_int64(self):
        self.run_case("int64", 1)

    def test_gather_needs_buffers(self):
        with self.assertRaises(ValueError):
            self.cli.gather(np.zeros((2, 2), np.int32), [0], [1], np.zeros((1, 2), np.int32))


# ---------------------------------------------------------------------------
class TestTransfer(Base):
    def setup_pair(self, mla=False, layers=4, slots=32, slot_bytes=40):
        a, ma = self.pool(layers=layers, slots=slots, slot_bytes=slot_bytes, mla=mla)
        b, mb = self.pool(layers=layers, slots=slots, slot_bytes=slot_bytes, mla=mla, fill=0xEE)
        # Written by Python through the shared mapping, moved by the daemon.
        ma.array()[:] = rnd((ma.bytes,), 9)
        return a, ma, b, mb

    def expect(self, ma, mb, before, pairs, layers, mla):
        want = before.copy()
        parts = [False] if mla else [False, True]
        for l in layers:
            for v in parts:
                src_rows = ma.v(l) if v else ma.k(l)
                off = l * mb.pool.layer_stride + (mb.pool.v_offset if v else 0)
                for s, d in pairs:
                    if s < 0 or d < 0:
                        continue
                    o = off + d * mb.pool.slot_stride
                    want[o:o + mb.pool.slot_bytes] = src_rows[s]
        self.assertBytesEqual(mb.array(), want, f"dst after transfer of layers {list(layers)}")

    def test_transfer_one_layer(self):
        a, ma, b, mb = self.setup_pair()
        src, dst = [0, 5, 31, -1, 7], [3, 4, 0, 9, -1]
        before = mb.array().copy()
        res = self.cli.transfer(a, b, src, dst, layer=2)
        self.assertEqual(res.skipped_oob, 0)
        self.expect(ma, mb, before, list(zip(src, dst)), [2], False)

    def test_transfer_all_layers(self):
        a, ma, b, mb = self.setup_pair()
        src = np.array([1, 2, 3, 30], np.int32)
        dst = np.array([31, 0, 15, 16], np.int32)
        before = mb.array().copy()
        self.cli.transfer(a, b, src, dst)
        self.expect(ma, mb, before, list(zip(src, dst)), range(4), False)

    def test_transfer_layer_range_mla(self):
        a, ma, b, mb = self.setup_pair(mla=True, layers=5)
        before = mb.array().copy()
        self.cli.transfer(a, b, [4, 6], [6, 4], layer=1, num_layers=3)
        self.expect(ma, mb, before, [(4, 6), (6, 4)], range(1, 4), True)

    def test_python_writes_daemon_moves_back(self):
        # Offload, clear, reload: the round trip a serving engine makes.
        gpu, mg, host, mh = self.setup_pair(layers=2)
        slots = np.array([3, 8, 20], np.int64)
        orig = mg.array().copy()
        self.cli.transfer(gpu, host, slots, slots)
        for l in range(2):
            mg.k(l)[slots] = 0
            mg.v(l)[slots] = 0
        self.cli.transfer(host, gpu, slots, slots)
        self.assertBytesEqual(mg.array(), orig, "reloaded pool")

    def test_import_host_memory(self):
        L, S, B = 2, 16, 24
        hm = kvdock.HostMemory(L * 2 * S * 32)
        whole = hm.array().reshape(L, 2, S, 32)
        # Rows of 24 bytes, 32 apart: a strided import.
        k_layers = [whole[l, 0, :, :B] for l in range(L)]
        v_layers = [whole[l, 1, :, :B] for l in range(L)]
        imp = self.cli.import_pool(f"imported-{os.getpid()}", k_layers, v_layers)
        self.assertTrue(imp.info.imported)
        self.assertEqual((imp.info.slot_bytes, imp.info.slot_stride), (B, 32))
        src, ms = self.pool(layers=L, slots=S, slot_bytes=B)
        ms.array()[:] = rnd((ms.bytes,), 10)
        self.cli.transfer(src, imp, [1, 2], [14, 0])
        for l in range(L):
            self.assertBytesEqual(k_layers[l][[14, 0]], ms.k(l)[[1, 2]], "imported K")
            self.assertBytesEqual(v_layers[l][[14, 0]], ms.v(l)[[1, 2]], "imported V")
        with self.assertRaises(kvdock.Error) as e:
            self.cli.export_pool(imp)
        self.assertEqual(e.exception.name, "ENOTSUP")
        with self.assertRaises(ValueError):  # not shared memory
            self.cli.import_pool("bad", [np.zeros((4, 8), np.uint8)], [np.zeros((4, 8), np.uint8)])
        imp.drop()


# ---------------------------------------------------------------------------
class TestFutures(Base):
    def test_many_in_flight_collected_out_of_order(self):
        p, m = self.pool(layers=2, slots=64, slot_bytes=32, fill=0)
        q, mq = self.pool(layers=2, slots=64, slot_bytes=32, fill=0)
        rows = {i: rnd((1, 32), 100 + i) for i in range(24)}
        futs = []
        for i, r in rows.items():
            futs.append(("store", i, self.cli.store_async(p, 1, [i], r, r)))
            futs.append(("ping", i, self.cli.ping_async(bytes([i]) * i)))
        futs.append(("pools", 0, self.cli.pools_async()))
        self.assertGreaterEqual(self.cli.pending, 1)
        order = list(range(len(futs)))
        random.Random(3).shuffle(order)
        for j in order:
            kind, i, f = futs[j]
            val = f.result(timeout=20)
            self.assertTrue(f.done())
            if kind == "store":
                self.assertEqual(val.rows, 1)
            elif kind == "pools":
                self.assertIn(p.id, [x.id for x in val])
        self.assertEqual(self.cli.pending, 0)
        for i, r in rows.items():
            self.assertBytesEqual(m.k(1)[i], r[0], f"row {i}")
        # as_completed hands each future back once, whatever the order.
        fs = [self.cli.store_async(p, 0, [i], rows[i], rows[i]) for i in range(24)]
        got = list(kvdock.as_completed(fs, timeout=20))
        self.assertEqual(sorted(id(f) for f in got), sorted(id(f) for f in fs))
        self.assertTrue(all(f.result(0).rows == 1 for f in got))
        # Transfers in flight, then collected newest first.
        tf = [self.cli.transfer_async(p, q, [i], [63 - i], layer=1) for i in range(24)]
        for f in reversed(tf):
            f.result(20)
        for i in range(24):
            self.assertBytesEqual(mq.k(1)[63 - i], rows[i][0], f"moved row {i}")

    def test_future_api(self):
        f = self.cli.ping_async(b"abc")
        seen = []
        f.add_done_callback(lambda fut: seen.append(fut))
        try:
            f.result(timeout=0)  # may or may not have come yet
        except concurrent.futures.TimeoutError:
            pass
        self.assertIsNone(f.result(10))
        self.assertIsNone(f.exception())
        self.assertEqual(seen, [f])
        self.assertFalse(f.cancel())
        self.assertFalse(f.cancelled())
        late = []
        f.add_done_callback(late.append)  # already done: called at once
        self.assertEqual(late, [f])
        self.assertEqual(kvdock.wait_all([self.cli.ping_async(), self.cli.ping_async()]),
                         [None, None])
        g = self.cli.ping_async()
        g.abandon()
        self.assertTrue(g.cancelled())
        with self.assertRaises(concurrent.futures.CancelledError):
            g.result()
        self.cli.ping()
        # An error travels in the future.
        e = self.cli.drop_pool_async(987654).exception(10)
        self.assertIsInstance(e, kvdock.Error)
        self.assertEqual(e.name, "ENOENT")
        # A dropped future abandons its request.
        self.cli.ping_async()
        self.cli.ping()
        self.assertEqual(self.cli.pending, 0)

    def test_threads_share_a_client(self):
        p, m = self.pool(layers=1, slots=64, slot_bytes=16, fill=0)
        errors = []

        def work(t: int) -> None:
            try:
                for i in range(8):
                    s = t * 8 + i
                    row = np.full((1, 16), s, np.uint8)
                    self.cli.store(p, 0, [s], row, row)
                    self.cli.ping_async(b"t").result(10)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertTrue((m.k(0)[:, 0] == np.arange(64)).all())


# ---------------------------------------------------------------------------
class TestErrors(Base):
    def assertError(self, name: str, fn, *a, contains: str = "", **kw) -> kvdock.Error:
        with self.assertRaises(kvdock.Error) as cm:
            fn(*a, **kw)
        e = cm.exception
        self.assertEqual(e.name, name, str(e))
        self.assertEqual(e.code, kvdock._capi.STATUS_NAMES and
                         [c for c, n in kvdock._capi.STATUS_NAMES.items() if n == name][0])
        self.assertIsInstance(e.code, int)
        self.assertTrue(e.message)
        if contains:
            self.assertIn(contains, e.message)
        self.assertIn(e.name, str(e))
        # The connection stays usable.
        self.cli.ping(b"still here")
        self.assertTrue(self.cli.connected)
        return e

    def test_unknown_pool(self):
        e = self.assertError("ENOENT", self.cli.store, 424242, 0, [0], b"x" * 8, b"y" * 8,
                             contains="424242")
        self.assertEqual(e.code, 15)
        self.assertError("ENOENT", self.cli.drop_pool, "no-such-pool")
        self.assertError("ENOENT", self.cli.transfer, 424242, 424243, [0], [0])

    def test_out_of_range(self):
        p, _ = self.pool(layers=2, slots=16, slot_bytes=8)
        self.assertError("ERANGE", self.cli.store, p, 0, [16], b"x" * 8, b"y" * 8,
                         contains="out of range")
        self.assertError("ERANGE", self.cli.store, p, 2, [0], b"x" * 8, b"y" * 8)
        q, _ = self.pool(layers=2, slots=16, slot_bytes=8)
        self.assertError("ERANGE", self.cli.transfer, p, q, [0], [99], layer=0)
        self.assertError("ERANGE", self.cli.transfer, p, q, [0], [1], layer=1, num_layers=2)

    def test_shape_mismatch(self):
        p, _ = self.pool(layers=1, slots=16, slot_bytes=8)
        self.assertError("ESHAPE", self.cli.store, p, 0, [1, 2], b"x" * 8, b"y" * 16,
                         contains="needed")
        q, _ = self.pool(layers=1, slots=16, slot_bytes=12)
        self.assertError("ESHAPE", self.cli.transfer, p, q, [0], [0], contains="slot_bytes")
        self.assertError("ESHAPE", self.cli.transfer, p, p, [0, 1], [2])
        m, _ = self.pool(layers=1, slots=16, slot_bytes=8, mla=True)
        self.assertError("ESHAPE", self.cli.transfer, p, m, [0], [0])

    def test_other_errors(self):
        p, _ = self.pool(layers=1, slots=16, slot_bytes=8)
        self.assertError("EEXIST", self.cli.create_pool, p.name, 1, 1, 1)
        self.assertError("EINVAL", self.cli.create_pool, "bad name!", 1, 1, 1)
        self.assertError("ENOENT", self.cli.drop_buffer, 99999)
        e = self.assertError("ENOTSUP", self.cli.create_pool, "dev", 1, 4, 4, kind="device")
        self.assertTrue(e.message)

    def test_connect_failure(self):
        with self.assertRaises(kvdock.Error) as cm:
            kvdock.Client(os.path.join(D.dir, "nope.sock"))
        self.assertIn(cm.exception.name, ("ECONN", "EIO", "ENOENT"))
        self.assertIn("nope.sock", cm.exception.message)

    def test_local_argument_errors(self):
        with self.assertRaises(ValueError):
            self.cli.create_pool("x", 1, 1, 1, kind="nowhere")
        with self.assertRaises(TypeError):
            self.cli.store(object(), 0, [0], b"x")
        with self.assertRaises(TypeError):
            self.cli.store(1, 0, [0.5], b"x")
        # Refused here, before a request is built: the pool keeps its bytes
        # and the connection goes on.
        p, m = self.pool(layers=1, slots=8, slot_bytes=16, fill=0x5a)
        k = np.ones((2, 2, 8), np.float32)
        cases = [
            (TypeError, lambda: self.cli.store(p, 0, [0, 1], object())),
            (TypeError, lambda: self.cli.store(p, 0, np.array([0.0, 1.0]), b"k" * 32, b"v" * 32)),
            (ValueError, lambda: self.cli.transfer(p, p, [0], [1], stream="nowhere")),
            (TypeError, lambda: self.cli.transfer(p, p, [0], [1], wait_event=object())),
            (ValueError, lambda: self.cli.transfer(p, p, [0], [1], record_event=b"short")),
            (ValueError, lambda: self.cli.fp8_set(p, 0, [0, 1], k, k, cache_dtype="e3m4")),
            (ValueError, lambda: self.cli.fp8_set(p, 0, [0, 1], k.tobytes(), k.tobytes(),
                                                  num_heads=2, head_dim=8, src_dtype="int8")),
            (TypeError, lambda: self.cli.drop_pool(3.5)),
        ]
        for i, (exc, call) in enumerate(cases):
            with self.subTest(case=i), self.assertRaises(exc):
                call()
        self.assertTrue((m.array() == 0x5a).all())
        self.cli.ping()
        self.assertTrue(issubclass(kvdock.Timeout, TimeoutError))
        self.assertTrue(issubclass(kvdock.Timeout, kvdock.Error))


class TestRefused(unittest.TestCase):
    """A client that --max-clients turns away learns why: ELIMIT and the
    daemon's words, whether its hello was written before the daemon closed
    the connection or not."""

    def test_max_clients_says_elimit(self):
        d = harness.Daemon("cpu", extra=["--max-clients", "2"])
        held = []
        try:
            deadline = time.monotonic() + 10
            while len(held) < 2 and time.monotonic() < deadline:
                try:  # the harness's probe may still be leaving
                    held.append(kvdock.Client(d.socket, name="holder"))
                except kvdock.Error:
                    time.sleep(0.02)
            self.assertEqual(len(held), 2)
            for i in range(60):
                with self.assertRaises(kvdock.Error, msg=f"try {i}") as cm:
                    kvdock.Client(d.socket, name="turned-away")
                self.assertEqual(cm.exception.name, "ELIMIT", f"try {i}: {cm.exception}")
                self.assertIn("max-clients", str(cm.exception))
        finally:
            for c in held:
                c.close()
            d.stop_clean()


if __name__ == "__main__":
    unittest.main(verbosity=2)

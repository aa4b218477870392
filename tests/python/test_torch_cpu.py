"""The kvdock Python client's PyTorch paths on the cpu backend: host pools
as CPU tensors over the shared pages, tensors for indices and operands,
fp8 from bfloat16/float16 tensors checked against the kernel library's
CPU reference, gather into buffer tensors, imports of tensor layers.
Skipped, saying why, where `import torch` fails.

None of it needs numpy, as on the GPU machine (PyTorch without numpy):
test_no_numpy.py runs this suite with `import numpy` blocked.  The one
check that compares numpy and tensor views skips there, saying why."""

from __future__ import annotations

import ctypes
import gc
import os
import unittest
import weakref

import harness
import kvdock

torch = harness.torch_or_none()
D: harness.Daemon = None  # type: ignore[assignment]


def setUpModule() -> None:
    global D
    if torch is None:
        raise unittest.SkipTest("PyTorch is not importable (apt-get install python3-torch)")
    D = harness.Daemon("cpu")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean()


class TorchBase(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = kvdock.Client(D.socket, name="torch-" + self.id().rsplit(".", 1)[-1][:40],
                                 timeout=30)
        self.n = 0
        self.gen = torch.Generator().manual_seed(1234)

    def tearDown(self) -> None:
        self.cli.close()

    def pool(self, layers=2, slots=32, slot_bytes=64, mla=False, fill=None):
        self.n += 1
        p = self.cli.create_pool(f"t-{self.id().rsplit('.', 1)[-1][:30]}-{self.n}-{os.getpid()}",
                                 layers, slots, slot_bytes, mla=mla)
        m = p.map()
        if fill is not None:
            m.tensor().fill_(fill)
        return p, m

    def rand_bytes(self, *shape) -> "torch.Tensor":
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=self.gen)


class TestTensorViews(TorchBase):
    def test_host_pool_as_cpu_tensors(self):
        p, m = self.pool(layers=2, slots=16, slot_bytes=64, fill=0)
        k1 = m.k_tensor(1)
        self.assertEqual(tuple(k1.shape), (16, 64))
        self.assertEqual(k1.device.type, "cpu")
        self.assertEqual(k1.data_ptr(), m.base + p.info.layer_stride)
        vb = m.v_tensor(0, torch.bfloat16)
        self.assertEqual(tuple(vb.shape), (16, 32))
        self.assertEqual(vb.dtype, torch.bfloat16)
        # Written through the tensor, seen by the daemon.
        k1[3] = self.rand_bytes(64)
        vb[3] = torch.arange(32, dtype=torch.bfloat16)
        self.assertEqual(bytes(m.memoryview()[p.info.layer_stride + 3 * 64:][:64]),
                         bytes(k1[3].tolist()))
        q, mq = self.pool(layers=2, slots=16, slot_bytes=64, fill=0)
        self.cli.transfer(p, q, torch.tensor([3]), torch.tensor([9]))
        self.assertTrue(torch.equal(mq.k_tensor(1)[9], k1[3]))
        self.assertTrue(torch.equal(mq.v_tensor(0, torch.bfloat16)[9], vb[3]))
        whole = m.tensor()
        self.assertEqual(whole.numel(), m.bytes)
        f32 = m.tensor(torch.float32)
        self.assertEqual(f32.numel(), m.bytes // 4)

    def test_numpy_and_tensor_views_agree(self):
        np = harness.numpy_or_skip("compares numpy views with tensor views")
        p, m = self.pool(layers=2, slots=16, slot_bytes=64, fill=0)
        m.k_tensor(1)[3] = self.rand_bytes(64)
        self.assertTrue(np.array_equal(m.k(1)[3], m.k_tensor(1)[3].numpy()))
        m.v(0)[5] = 7
        self.assertTrue(bool((m.v_tensor(0)[5] == 7).all()))

    def test_views_keep_the_mapping(self):
        p, m = self.pool(layers=1, slots=4, slot_bytes=16, fill=5)
        t = m.k_tensor(0)
        m.close()
        p._map = None
        self.assertTrue(bool((t == 5).all()))
        t[0, 0] = 6
        self.assertEqual(int(self.cli.export_pool(p).k_tensor(0)[0, 0]), 6)

    def test_dlpack_views_hold_their_owner(self):
        # Device pools become CUDA tensors through the same DLPack capsule
        # (only the device differs): made here over CPU memory, the
        # tensor and its views must keep the owner alive, and free it after.
        from kvdock import _dlpack as K

        class Owner:
            pass

        mem = (ctypes.c_uint8 * 256)(*range(256))
        owner = Owner()
        owner.mem = mem
        gone = weakref.ref(owner)
        live = len(K._dl_live)
        t = K._dlpack_bytes(ctypes.addressof(mem) + 16, (4, 32), (64, 1), False, 0, owner)
        del owner
        self.assertEqual((tuple(t.shape), t.stride(), t.dtype), ((4, 32), (64, 1), torch.uint8))
        self.assertEqual(t.data_ptr(), ctypes.addressof(mem) + 16)
        self.assertEqual(t[1, :3].tolist(), [80, 81, 82])
        h = t.view(torch.int16)[2]  # a view keeps the storage, so the owner
        t[2, 0] = 0
        del t
        gc.collect()
        self.assertIsNotNone(gone(), "owner freed while a view lives")
        self.assertEqual(h.view(torch.uint8)[:3].tolist(), [0, 145, 146])
        del h
        gc.collect()
        self.assertIsNone(gone(), "owner kept after the last view died")
        self.assertEqual(len(K._dl_live), live)


class TestTensorOps(TorchBase):
    def test_store_from_tensors(self):
        H, Dh, T = 4, 8, 6
        p, m = self.pool(layers=2, slots=32, slot_bytes=H * Dh * 2, fill=0)
        k = torch.randn(T, H, Dh, generator=self.gen).to(torch.bfloat16)
        v = torch.randn(T, H, Dh, generator=self.gen).to(torch.bfloat16)
        for dt in (torch.int32, torch.int64):
            loc = torch.tensor([4, 0, 31, -1, 7, 12], dtype=dt)
            res = self.cli.store(p, 1, loc, k, v)
            self.assertEqual(res.rows, T)
            kt, vt = m.k_tensor(1, torch.bfloat16), m.v_tensor(1, torch.bfloat16)
            sel = loc >= 0
            self.assertTrue(torch.equal(kt[loc[sel].long()], k.reshape(T, -1)[sel]))
            self.assertTrue(torch.equal(vt[loc[sel].long()], v.reshape(T, -1)[sel]))
        # Non-contiguous operands are made contiguous first.
        kk = torch.randn(H * Dh, 2, generator=self.gen).to(torch.bfloat16).t()  # [2, H*Dh]
        self.cli.store(p, 0, torch.tensor([1, 2]), kk, kk)
        self.assertTrue(torch.equal(m.k_tensor(0, torch.bfloat16)[1:3], kk))

    def fp8_case(self, dtype, cache, mode):
        H, Dh, T = 2, 16, 5
        p, m = self.pool(layers=2, slots=24, slot_bytes=H * Dh, fill=0x11)
        k = (torch.randn(T, H, Dh, generator=self.gen) * 100).to(dtype)
        v = (torch.randn(T, H, Dh, generator=self.gen) * 3).to(dtype)
        loc = torch.tensor([0, 23, -1, 5, 6])
        ref = m.tensor().clone()
        kw = {1: {"k_scale": 4.0, "v_scale": 0.25},
              2: {"k_head_scales": torch.tensor([2.0, 0.5]), "v_head_scales": [1.0, 8.0]}}.get(
                  mode, {})
        self.cli.fp8_set(p, 0, loc, k, v, cache_dtype=cache, **kw)
        # The reference reads raw bytes: bf16 as int16 of the same layout.
        raw = {torch.bfloat16: torch.int16}.get(dtype, dtype)
        src_code = {torch.bfloat16: 5, torch.float16: 4, torch.float32: 3}[dtype]
        harness.fp8_reference(ref, p.info, 0, loc, k.view(raw), v.view(raw), src_code,
                              {"e4m3": 6, "e5m2": 7}[cache],
                              mode, 4.0 if mode == 1 else 1.0, 0.25 if mode == 1 else 1.0,
                              [2.0, 0.5] if mode == 2 else None,
                              [1.0, 8.0] if mode == 2 else None)
        self.assertTrue(torch.equal(m.tensor(), ref), f"fp8 {dtype} {cache} mode {mode}")

    def test_fp8_bf16_e4m3(self):
        self.fp8_case(torch.bfloat16, "e4m3", 0)

    def test_fp8_f16_e5m2_tensor_scale(self):
        self.fp8_case(torch.float16, "e5m2", 1)

    def test_fp8_f32_per_head_tensor_scales(self):
        self.fp8_case(torch.float32, "e4m3", 2)

    def test_gather_into_buffer_tensors(self):
        tb = self.cli.register_buffer(8 * 12 * 4)
        ob = self.cli.register_buffer(3 * 6 * 4)
        table = tb.tensor(torch.int32, (8, 12))
        table.copy_(torch.arange(96, dtype=torch.int32).reshape(8, 12))
        out = ob.tensor(torch.int32, (3, 6))
        out.fill_(-5)
        res = self.cli.gather(table, torch.tensor([7, 2, -1]), torch.tensor([9, 40, 3]), out,
                              page_size=2, dummy_slot=-1)
        self.assertEqual(res.skipped_oob, 0)
        want = torch.full((3, 6), -1, dtype=torch.int32)
        want[0, :5] = table[7, :5]
        want[1, :6] = table[2, :6]
        self.assertTrue(torch.equal(out, want), f"{out} != {want}")

    def test_transfer_with_tensor_indices_and_futures(self):
        a, ma = self.pool(layers=3, slots=32, slot_bytes=32)
        b, mb = self.pool(layers=3, slots=32, slot_bytes=32, fill=0)
        ma.tensor().copy_(self.rand_bytes(ma.bytes))
        src = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
        dst = torch.tensor([31, 30, 29, 28], dtype=torch.int64)
        futs = [self.cli.transfer_async(a, b, src[i:i + 1], dst[i:i + 1]) for i in range(4)]
        for f in futs[::-1]:
            f.result(20)
        for l in range(3):
            self.assertTrue(torch.equal(mb.k_tensor(l)[dst], ma.k_tensor(l)[src.long()]))
            self.assertTrue(torch.equal(mb.v_tensor(l)[dst], ma.v_tensor(l)[src.long()]))
        self.assertTrue(bool((mb.k_tensor(0)[:28] == 0).all()))

    def test_import_tensor_layers_in_host_memory(self):
        L, S, W = 2, 16, 8  # 8 float32 per slot
        hm = kvdock.HostMemory(L * S * W * 4)  # MLA: one latent per layer
        lat = hm.tensor(torch.float32).reshape(L, S, W)
        layers = [lat[l] for l in range(L)]
        imp = self.cli.import_pool(f"t-imp-{os.getpid()}", layers)  # v_layers None: MLA
        self.assertTrue(imp.info.mla)
        self.assertEqual(imp.info.slot_bytes, W * 4)
        src, ms = self.pool(layers=L, slots=S, slot_bytes=W * 4, mla=True)
        ms.tensor(torch.float32).copy_(torch.randn(ms.bytes // 4, generator=self.gen))
        self.cli.transfer(src, imp, torch.arange(S), torch.arange(S).flip(0))
        for l in range(L):
            self.assertTrue(torch.equal(layers[l], ms.k_tensor(l, torch.float32).flip(0)))
        imp.drop()

    def test_cuda_paths_refuse_cleanly_without_cuda(self):
        # Without a CUDA build, device buffers cannot be mapped here.
        with self.assertRaises(kvdock.Error) as cm:
            self.cli.register_buffer(64, device=True)
        self.assertIn(cm.exception.name, ("ENOTSUP", "EINVAL", "ENODEV"))
        self.cli.ping()


class TestCopyRows(TorchBase):
    """kvdock.copy_rows in host memory (the kernel library's CPU reference;
    the CUDA kernel against torch is test_gpu.py's TestCopyRows)."""

    def test_gather_layers_k_and_v(self):
        L, S, R = 3, 64, 24
        k = [self.rand_bytes(S, R) for _ in range(L)]
        v = [self.rand_bytes(S, R) for _ in range(L)]
        ok = [torch.full((16, R), 7, dtype=torch.uint8) for _ in range(L)]
        ov = [torch.full((16, R), 7, dtype=torch.uint8) for _ in range(L)]
        src = torch.tensor([5, 63, 0, -1, 9, 64, 17])      # -1 padding, 64 past the rows
        dst = torch.tensor([0, 1, 2, 3, 15, 4, -1], dtype=torch.int32)
        kvdock.copy_rows(k, ok, src, dst, src_v=v, dst_v=ov)
        for l in range(L):
            for side, out in ((k, ok), (v, ov)):
                self.assertTrue(torch.equal(out[l][[0, 1, 2, 15]], side[l][[5, 63, 0, 9]]))
                for untouched in (3, 4, 5, 14):
                    self.assertTrue(bool((out[l][untouched] == 7).all()), (l, untouched))

    def test_one_layer_latents_strided_rows_and_lists(self):
        base = torch.randn(40, 2, 3, generator=self.gen)
        src = base[::2]                                     # 20 rows, every other row
        out = torch.zeros(20, 2, 3)
        kvdock.copy_rows(src, out, [3, 1, 19], [0, 10, 19])
        self.assertTrue(torch.equal(out[[0, 10, 19]], src[[3, 1, 19]]))
        self.assertEqual(int((out[1:10] != 0).sum()), 0)
        kvdock.copy_rows(src, out, [], [])                   # nothing to do

    def test_staging_then_the_daemon_moves_it_whole(self):
        # the recipe for scattered rows: gather them in the worker into a
        # contiguous staging pool, the daemon moves that; and back
        L, S, R, N = 2, 256, 32, 40
        cache_mem = kvdock.HostMemory(2 * L * S * R)
        cache = cache_mem.tensor().reshape(2, L, S, R)
        cache.copy_(self.rand_bytes(2, L, S, R))
        stage_mem = kvdock.HostMemory(2 * L * N * R)
        stage = stage_mem.tensor().reshape(2, L, N, R)
        staged = self.cli.import_pool(f"t-stage-{os.getpid()}", list(stage[0]), list(stage[1]))
        host, mh = self.pool(layers=L, slots=4 * N, slot_bytes=R, fill=0)
        rows = torch.randperm(S, generator=self.gen)[:N]
        kvdock.copy_rows(list(cache[0]), list(stage[0]), rows, torch.arange(N),
                         src_v=list(cache[1]), dst_v=list(stage[1]), max_blocks=2)
        self.cli.transfer(staged, host, torch.arange(N), torch.arange(N) + N)
        for l in range(L):
            self.assertTrue(torch.equal(mh.k_tensor(l)[N:2 * N], cache[0, l][rows]))
            self.assertTrue(torch.equal(mh.v_tensor(l)[N:2 * N], cache[1, l][rows]))
        # reload into other rows of the cache: the daemon fills the staging
        # pool, the worker scatters it
        stage.zero_()
        self.cli.transfer(host, staged, torch.arange(N) + N, torch.arange(N))
        back = torch.randperm(S, generator=self.gen)[:N]
        kvdock.copy_rows(list(stage[0]), list(cache[0]), torch.arange(N), back,
                         src_v=list(stage[1]), dst_v=list(cache[1]))
        for l in range(L):
            self.assertTrue(torch.equal(cache[0, l][back], mh.k_tensor(l)[N:2 * N]))
            self.assertTrue(torch.equal(cache[1, l][back], mh.v_tensor(l)[N:2 * N]))
        staged.drop()

    def test_bad_arguments(self):
        a, b = self.rand_bytes(8, 16), torch.zeros(8, 16, dtype=torch.uint8)
        cases = [
            ((a, torch.zeros(8, 8, dtype=torch.uint8), [0], [0]), {}, ValueError, "bytes"),
            (([a, a], [b], [0], [0]), {}, ValueError, "as many layers"),
            ((a, b, [0], [0]), {"src_v": a}, ValueError, "both src_v and dst_v"),
            ((a, b, [0, 1], [0]), {}, ValueError, "as long"),
            ((a, b, [0], [0]), {"copy_engine": True}, ValueError, "CUDA"),
            ((a, b, torch.tensor([0.5]), [0]), {}, TypeError, "integers"),
            ((a, b, torch.zeros(1, 1, dtype=torch.int64), [0]), {}, ValueError, "one-dimensional"),
            ((a.t(), b, [0], [0]), {}, ValueError, "contiguous"),
            ((a, b, [0], [0]), {"max_blocks": -1}, ValueError, "max_blocks"),
            (([], b, [0], [0]), {}, ValueError, "no layers"),
        ]
        for args, kw, exc, says in cases:
            with self.assertRaises(exc, msg=says) as cm:
                kvdock.copy_rows(*args, **kw)
            self.assertIn(says, str(cm.exception))
        self.assertEqual(int(b.sum()), 0)                  # nothing was written


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""The cache tier from Python (cpu backend, no numpy needed): keys from
token ids (kvdock.block_hashes, equal to libkvdock's kvd_block_hashes),
create / open / list / drop, save, lookup, load (by keys and by lease),
dedup, a chain continued from its parent, eviction, and errors with their
codes.  Pages are read and written through the pool mapping's memoryview."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import random
import shutil
import struct
import tempfile
import time
import unittest
from typing import Any

import harness
import kvdock
from kvdock import _capi as C

D: harness.Daemon = None  # type: ignore[assignment]

LAYERS, TPB, TOKEN_BYTES = 2, 4, 32


def setUpModule() -> None:
    global D
    D = harness.Daemon("cpu")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean()


def block_bytes(key: bytes, layer: int, v: int) -> bytes:
    """What page holding key's block has in layer's K (v 0) or V rows."""
    seed = key + bytes([layer, v])
    out = b""
    while len(out) < TPB * TOKEN_BYTES:
        seed = hashlib.blake2s(seed).digest()
        out += seed
    return out[:TPB * TOKEN_BYTES]


class CacheTest(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = kvdock.Client(D.socket, name="py-cache", timeout=30)
        self.pool = self.cli.create_pool(f"cpool-{self.id()[-20:]}", num_layers=LAYERS,
                                         num_slots=32 * TPB, slot_bytes=TOKEN_BYTES,
                                         page_size=TPB)
        self.map = self.pool.map()
        self.mv = self.map.memoryview()
        info = self.pool.info
        self.row = lambda page, layer, v: (layer * info.layer_stride + v * info.v_offset
                                           + page * TPB * info.slot_stride)

    def tearDown(self) -> None:
        for c in self.cli.caches():
            self.cli.drop_cache(c.id)
        self.map.close()
        self.cli.close()

    def fill(self, pages, keys) -> None:
        for p, k in zip(pages, keys):
            for layer in range(LAYERS):
                for v in (0, 1):
                    at = self.row(p, layer, v)
                    self.mv[at:at + TPB * TOKEN_BYTES] = block_bytes(k, layer, v)

    def holds(self, page, key) -> bool:
        for layer in range(LAYERS):
            for v in (0, 1):
                at = self.row(page, layer, v)
                if bytes(self.mv[at:at + TPB * TOKEN_BYTES]) != block_bytes(key, layer, v):
                    return False
        return True

    def make(self, name="c", blocks=64, **kw) -> kvdock.Cache:
        return self.cli.create_cache(name, num_layers=LAYERS, tokens_per_block=TPB,
                                     token_bytes=TOKEN_BYTES, dtype="bf16",
                                     budget_bytes=blocks * LAYERS * 2 * TPB * TOKEN_BYTES, **kw)

    def test_block_hashes_match_the_library(self):
        rng = random.Random(4)
        toks = [rng.randrange(-2**40, 2**40) for _ in range(37)]
        py = kvdock.block_hashes(toks, 4, salt=b"model-a")
        self.assertEqual(len(py), 9)
        arr = (ctypes.c_int64 * len(toks))(*toks)
        out = ctypes.create_string_buffer(32 * 9)
        n = ctypes.c_size_t(0)
        lib = C.load()
        self.assertEqual(lib.kvd_block_hashes(arr, len(toks), 4, b"model-a", 7, out, 9,
                                              ctypes.byref(n)), 0)
        self.assertEqual(n.value, 9)
        self.assertEqual([out.raw[32 * i:32 * i + 32] for i in range(9)], py)
        # a shared prefix gives shared keys, the salt keeps models apart
        self.assertEqual(kvdock.block_hashes(toks[:20] + [1, 2, 3, 4], 4, b"model-a")[:5],
                         py[:5])
        self.assertNotEqual(kvdock.block_hashes(toks, 4, b"model-b")[0], py[0])

    def test_save_lookup_load(self):
        cache = self.make("roundtrip")
        self.assertEqual(cache.info.block_bytes, LAYERS * 2 * TPB * TOKEN_BYTES)
        keys = kvdock.block_hashes(list(range(10 * TPB)), TPB, b"s")
        self.fill(range(10), keys)
        r = cache.save(self.pool, keys[:6], blocks=list(range(6)))
        self.assertEqual((r.stored, r.skipped, r.refused), (6, 0, 0))
        r = cache.save(self.pool, keys[6:], blocks=[6, 7, 8, 9], parent=keys[5])
        self.assertEqual(r.stored, 4)
        r = cache.save(self.pool, keys, blocks=range(10))  # all there: dedup
        self.assertEqual((r.stored, r.skipped), (0, 10))
        self.assertEqual(cache.lookup(keys + [b"x" * 32]).hits, 10)
        got = cache.lookup(keys[:7], lease=True)
        self.assertEqual(got.hits, 7)
        self.assertNotEqual(got.lease, 0)
        self.assertEqual(cache.stats().leases, 1)
        cache.load(self.pool, lease=got.lease, blocks=range(20, 27))
        self.assertEqual(cache.stats().leases, 0)
        cache.load(self.pool, keys[7:], blocks=[27, 28, 29])
        for i, k in enumerate(keys):
            self.assertTrue(self.holds(20 + i, k), f"block {i}")
        st = cache.stats()
        self.assertEqual((st.blocks, st.stored, st.skipped, st.loaded), (10, 10, 10, 10))
        self.assertEqual(st.bytes_out, 10 * st.block_bytes)
        self.assertIn(st.id, [c.id for c in self.cli.caches()])

    def test_layer_flags(self):
        cache = self.make("flags")
        keys = kvdock.block_hashes(list(range(3 * TPB)), TPB)
        self.fill(range(3), keys)
        cache.save(self.pool, keys, blocks=range(3))
        buf = self.cli.register_buffer(16)
        r = cache.load(self.pool, keys, blocks=[10, 11, 12], layer_flags=buf.ref(4, 4 * LAYERS),
                       flag_value=5)
        self.assertEqual(r.rows, 3)
        flags = struct.unpack("<4I", bytes(buf.mapping.memoryview()[:16]))
        self.assertEqual(flags, (0, 5, 5, 0))
        for i, k in enumerate(keys):
            self.assertTrue(self.holds(10 + i, k))
        with self.assertRaises(kvdock.Error) as e:
            cache.load(self.pool, keys, blocks=[10, 11, 12], layer_flags=buf.ref(0, 4),
                       flag_value=0)
        self.assertEqual(e.exception.name, "EINVAL")
        with self.assertRaises(ValueError):  # a stream waits on device flags only
            buf.wait_value(0, 1)
        buf.drop()

    def test_asyncio(self):
        """Futures are awaitable: an asyncio program (an engine's scheduler)
        awaits lookups, saves and loads while its loop keeps running."""
        cache = self.make("aio")
        keys = kvdock.block_hashes(list(range(4 * TPB)), TPB, b"aio")
        self.fill(range(4), keys)
        ticks = 0

        async def ticker() -> None:  # a step each time the loop runs its ready tasks
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        async def during(aw: Any) -> tuple:
            """aw's value and the ticker's steps while main awaited it: at
            least one when the await gave the loop back (the ticker is
            ready whenever main runs), none when it blocked the loop."""
            before = ticks
            value = await aw
            return value, ticks - before

        async def main() -> tuple:
            t = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)  # the ticker runs from here on
            saved, n1 = await during(cache.save_async(self.pool, keys, blocks=range(4)))
            (hit, loaded), n2 = await during(asyncio.gather(
                cache.lookup_async(keys), cache.load_async(self.pool, keys, blocks=range(10, 14))))
            t.cancel()
            return saved, hit, loaded, n1, n2

        saved, hit, loaded, n1, n2 = asyncio.run(main())
        self.assertEqual(saved.stored, 4)
        self.assertEqual(hit.hits, 4)
        self.assertEqual(loaded.rows, 4)
        self.assertGreater(n1, 0, "the loop did not run while save_async was awaited")
        self.assertGreater(n2, 0, "the loop did not run while lookup and load were awaited")
        for i, k in enumerate(keys):
            self.assertTrue(self.holds(10 + i, k))

    def test_open_existing_and_names(self):
        a = self.make("shared-prefix", shared=True)
        b = self.make("shared-prefix", shared=True, open_existing=True)
        self.assertEqual(a.id, b.id)
        self.assertEqual(self.cli.cache("shared-prefix").id, a.id)
        with self.assertRaises(kvdock.Error) as e:
            self.make("shared-prefix")
        self.assertEqual(e.exception.name, "EEXIST")
        with self.assertRaises(kvdock.Error) as e:
            self.cli.create_cache("shared-prefix", num_layers=LAYERS + 1, tokens_per_block=TPB,
                                  token_bytes=TOKEN_BYTES, budget_bytes=1 << 20, shared=True,
                                  dtype="bf16", open_existing=True)
        self.assertEqual(e.exception.name, "ESHAPE")
        self.cli.drop_cache("shared-prefix")
        with self.assertRaises(kvdock.Error) as e:
            self.cli.cache("shared-prefix")
        self.assertEqual(e.exception.name, "ENOENT")

    def test_errors(self):
        cache = self.make("errors")
        keys = kvdock.block_hashes(list(range(4 * TPB)), TPB)
        self.fill(range(4), keys)
        cases = [
            ("EINVAL", lambda: cache.save(self.pool, [keys[0], keys[0]], blocks=[0, 1])),
            ("EINVAL", lambda: cache.save(self.pool, [b""], blocks=[0])),
            ("EINVAL", lambda: cache.save(self.pool, [b"k" * 65], blocks=[0])),
            ("ESHAPE", lambda: cache.save(self.pool, keys, blocks=[0, 1])),
            ("ERANGE", lambda: cache.save(self.pool, keys[:1], blocks=[32])),
            ("ENOENT", lambda: cache.save(self.pool, keys[1:2], blocks=[1], parent=b"p" * 32)),
            ("ENOENT", lambda: cache.load(self.pool, keys[:1], blocks=[0])),
            ("ENOENT", lambda: cache.load(self.pool, lease=999, blocks=[0])),
            ("ENOENT", lambda: cache.release(999)),
        ]
        for code, call in cases:
            with self.assertRaises(kvdock.Error, msg=code) as e:
                call()
            self.assertEqual(e.exception.name, code, e.exception.message)
        with self.assertRaisesRegex(ValueError, "not both"):
            cache.load(self.pool, keys, lease=5, blocks=[0])
        # a lookup that found nothing gives lease 0: the error says so
        self.assertEqual(cache.lookup(keys, lease=True).lease, 0)
        with self.assertRaisesRegex(ValueError, "lease is 0"):
            cache.load(self.pool, lease=0, blocks=[])
        with self.assertRaises(TypeError):
            cache.lookup(b"one bytes object")
        self.assertEqual(cache.stats().blocks, 0)

    def test_disk_level_fields(self):
        """Without --cache-dir: a disk budget is ENOTSUP naming the option,
        and no disk level shows (info.disk None, lookups' disk_hits 0,
        no "disk" in the status); a bad disk_budget is a ValueError."""
        with self.assertRaises(kvdock.Error) as e:
            self.make("disk", disk_budget=1 << 20)
        self.assertEqual(e.exception.name, "ENOTSUP")
        self.assertIn("--cache-dir", e.exception.message)
        for bad in (-1, 1 << 64, 1.5, True):
            with self.assertRaisesRegex(ValueError, "disk_budget"):
                self.make("disk", disk_budget=bad)  # type: ignore[arg-type]
        cache = self.make("nodisk")
        self.assertIsNone(cache.info.disk)
        keys = kvdock.block_hashes(list(range(3 * TPB)), TPB, b"d")
        self.fill(range(3), keys)
        cache.save(self.pool, keys, blocks=[0, 1, 2])
        got = cache.lookup(keys)
        self.assertEqual((got.hits, got.local_hits, got.disk_hits), (3, 3, 0))
        self.assertIsNone(cache.stats().disk)
        self.assertNotIn("disk", self.cli.status())

    def test_disk_level_on_a_cache_dir(self):
        """With --cache-dir (on the machine's disk, not a tmpfs /tmp): the
        status carries the disk level; a disk budget past --disk-budget is
        ELIMIT; a cache with a disk level shows it (budget, directory,
        blocks written through), and a lookup counts its disk-only hits.
        A directory there the daemon could not reopen is in the status,
        with the reason."""
        top = tempfile.mkdtemp(prefix="kvd-py-disk-", dir="/var/tmp")
        try:
            os.mkdir(os.path.join(top, "cache"), 0o700)
            os.mkdir(os.path.join(top, "cache", "junk"), 0o700)  # no manifest
            d = harness.Daemon("cpu", extra=["--cache-dir", os.path.join(top, "cache"),
                                             "--disk-budget", "64M"])
            try:
                with kvdock.Client(d.socket, name="py-disk", timeout=30) as cli:
                    st = cli.status()
                    disk = st["disk"]
                    self.assertEqual(disk["cache_dir"], os.path.join(top, "cache"))
                    self.assertEqual(disk["budget_bytes"], 64 << 20)
                    self.assertEqual((disk["reserved_bytes"], disk["used_bytes"]), (0, 0))
                    self.assertGreater(disk["fs_free_bytes"], 0)
                    self.assertIsInstance(disk["direct"], bool)
                    self.assertEqual(disk["num_skipped"], 1)
                    self.assertEqual(disk["skipped"], [{
                        "dir": "junk", "name": "", "owner_uid": 0,
                        "reason": "no manifest: No such file or directory"}])
                    self.assertTrue(disk["io_engine"] == "io_uring"
                                    or disk["io_engine"].startswith("threads ("),
                                    disk["io_engine"])
                    with self.assertRaises(kvdock.Error) as e:
                        cli.create_cache("big", num_layers=LAYERS, tokens_per_block=TPB,
                                         token_bytes=TOKEN_BYTES, budget_bytes=1 << 20,
                                         disk_budget=(64 << 20) + 1)
                    self.assertEqual(e.exception.name, "ELIMIT")
                    self.assertIn("--disk-budget", e.exception.message)
                    # a cache with a disk level: blocks past the host budget stay
                    # on disk, and a lookup says how many it found only there
                    block = LAYERS * 2 * TPB * TOKEN_BYTES
                    cache = cli.create_cache("disk", num_layers=LAYERS, tokens_per_block=TPB,
                                             token_bytes=TOKEN_BYTES, budget_bytes=8 * block,
                                             disk_budget=1 << 20)
                    dl = cache.info.disk
                    assert dl is not None
                    self.assertEqual((dl.budget_bytes, dl.blocks), (1 << 20, 0))
                    self.assertTrue(dl.path.startswith(os.path.join(top, "cache") + "/"),
                                    dl.path)
                    pool = cli.create_pool("disk-pool", num_layers=LAYERS, num_slots=8 * TPB,
                                           slot_bytes=TOKEN_BYTES, page_size=TPB)
                    chains = [kvdock.block_hashes(list(range(c * 99, c * 99 + 4 * TPB)), TPB)
                              for c in range(4)]
                    for keys in chains:  # 16 blocks: twice the host budget
                        deadline = time.monotonic() + 20
                        while True:
                            try:
                                cache.save(pool, keys, blocks=[0, 1, 2, 3])
                                break
                            except kvdock.Error as e:  # the disk is behind: EBUSY
                                if e.name != "EBUSY" or time.monotonic() > deadline:
                                    raise
                                time.sleep(0.001)
                    deadline = time.monotonic() + 20
                    st = cache.stats()
                    while (st.disk is None or st.disk.blocks < 16) and \
                            time.monotonic() < deadline:
                        time.sleep(0.005)
                        st = cache.stats()
                    assert st.disk is not None
                    self.assertEqual(st.disk.blocks, 16)
                    self.assertEqual(st.disk.spills, 16 - st.blocks)
                    self.assertGreater(st.disk.write_bytes, 0)
                    got = cache.lookup(chains[0])
                    self.assertEqual((got.hits, got.local_hits, got.disk_hits), (4, 4, 4))
                    self.assertGreater(cli.status()["disk"]["used_bytes"], 0)
                    cache.drop()
                    pool.drop()
            finally:
                d.stop_clean()
        finally:
            shutil.rmtree(top, ignore_errors=True)

    def test_evict(self):
        cache = self.make("evict")
        keys = kvdock.block_hashes(list(range(8 * TPB)), TPB)
        self.fill(range(8), keys)
        cache.save(self.pool, keys, blocks=range(8))
        ev = cache.evict([keys[5], b"absent"])
        self.assertEqual((ev.evicted, ev.busy, ev.missing), (3, 0, 1))
        self.assertEqual(cache.lookup(keys).hits, 5)
        self.assertEqual(cache.clear().evicted, 5)
        self.assertEqual(cache.stats().blocks, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)

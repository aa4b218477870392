"""kvdock.Connector end to end on the cpu backend: a small decoder (plain
PyTorch, paged KV, rotary positions) in three worker processes.  Worker A
prefills a prompt and saves its blocks; worker B, another process with its
own pages in another layout, gets a prompt sharing A's first blocks, looks
them up, loads them layer by layer and prefills only the rest: its logits
and greedy tokens equal a full recompute.  A worker with another salt
finds nothing.  Then the connector's rules: failed loads release their
layer waits and raise, saves skip what is cached, leases, layouts.

Skipped, saying why, where `import torch` fails."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import unittest
from typing import Any, Dict, List, Tuple

import harness
import kvdock

torch = harness.torch_or_none()
D: harness.Daemon = None  # type: ignore[assignment]

BS = 16            # tokens a block
PAGES = 64         # pages a worker has
SALT = b"tiny-decoder/seed0"
CACHE_BUDGET = 8 << 20
SHARED_BLOCKS = 8  # A's and B's prompts share this many blocks


def setUpModule() -> None:
    global D
    if torch is None:
        raise unittest.SkipTest("PyTorch is not importable (apt-get install python3-torch)")
    D = harness.Daemon("cpu")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean()


def model() -> Any:
    from tiny_decoder import TinyDecoder
    return TinyDecoder(seed=0)


def prompt(seed: int, n: int) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def paged_kv(m: Any, layout: str) -> Tuple[Any, List[Any], List[Any], Dict[str, Any]]:
    """A worker's pages in shared host memory: (memory, k views, v views,
    the connector's layout arguments).  layout "vllm": per layer
    [2, pages, BS, kv_heads, head_dim]; "sglang": per layer token-major
    K and V [pages * BS, kv_heads, head_dim]."""
    row = m.kv_heads * m.head_dim
    hm = kvdock.HostMemory(m.num_layers * 2 * PAGES * BS * row * 4)
    flat = hm.tensor(torch.float32)
    flat.fill_(float("nan"))  # nothing reads a page it did not fill
    if layout == "vllm":
        kv = flat.view(m.num_layers, 2, PAGES, BS, m.kv_heads, m.head_dim)
        ks = [kv[l, 0].view(PAGES * BS, m.kv_heads, m.head_dim) for l in range(m.num_layers)]
        vs = [kv[l, 1].view(PAGES * BS, m.kv_heads, m.head_dim) for l in range(m.num_layers)]
        return hm, ks, vs, {"kv_caches": [kv[l] for l in range(m.num_layers)]}
    kv = flat.view(m.num_layers, 2, PAGES * BS, m.kv_heads, m.head_dim)
    ks = [kv[l, 0] for l in range(m.num_layers)]
    vs = [kv[l, 1] for l in range(m.num_layers)]
    return hm, ks, vs, {"k_layers": ks, "v_layers": vs}


def plain_kv(m: Any) -> Tuple[List[Any], List[Any]]:
    return ([torch.zeros(PAGES * BS, m.kv_heads, m.head_dim) for _ in range(m.num_layers)],
            [torch.zeros(PAGES * BS, m.kv_heads, m.head_dim) for _ in range(m.num_layers)])


def worker_a(socket: str, cache: str, seed: int) -> int:
    """Prefill prompt(seed) in full and save its blocks, its pages in
    reverse order; print what the saves stored."""
    m = model()
    cli = kvdock.Client(socket, name="worker-a", timeout=60)
    hm, ks, vs, layout = paged_kv(m, "sglang")
    conn = kvdock.Connector(cli, cache, block_size=BS, salt=SALT, budget_bytes=CACHE_BUDGET,
                            **layout)
    toks = prompt(seed, 10 * BS + 5)
    table = list(range(PAGES - 1, PAGES - 12, -1))
    m.forward(toks, 0, ks, vs, table, BS)
    conn.save(toks, table)
    stored = conn.wait_for_saves()
    again = conn.save(toks, table).wait()  # all there now: skipped
    conn.close()
    cli.close()
    print(json.dumps({"stored": stored, "skipped_again": again.skipped}))
    return 0


class ConnectorBase(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = kvdock.Client(D.socket, name="conn-" + self.id().rsplit(".", 1)[-1][:40],
                                 timeout=60)
        self.m = model()
        self.cache_name = f"tiny-{self.id().rsplit('.', 1)[-1][:30]}-{os.getpid()}"
        # cleanups run last first: connectors close, the cache goes, then the client
        self.addCleanup(self.cli.close)
        self.addCleanup(self.drop_cache)

    def drop_cache(self) -> None:
        try:
            self.cli.drop_cache(self.cache_name)
        except kvdock.Error:
            pass

    def connector(self, layout: str = "vllm", salt: bytes = SALT,
                  **kw: Any) -> Tuple[Any, List[Any], List[Any], Any]:
        hm, ks, vs, args = paged_kv(self.m, layout)
        kw.setdefault("budget_bytes", CACHE_BUDGET)
        conn = kvdock.Connector(self.cli, self.cache_name, block_size=BS, salt=salt, **args, **kw)
        self.addCleanup(conn.close)
        return hm, ks, vs, conn


class TestReuseAcrossWorkers(ConnectorBase):
    def run_worker_a(self, seed: int) -> Dict[str, int]:
        out = subprocess.run([sys.executable, __file__, "worker-a", D.socket, self.cache_name,
                              str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def test_worker_b_reuses_worker_a_prefix(self):
        a = self.run_worker_a(seed=5)
        self.assertEqual(a, {"stored": 10, "skipped_again": 10})

        # worker B: this process, pages in vLLM's layout, a prompt sharing
        # A's first SHARED_BLOCKS blocks and then its own
        hm, ks, vs, conn = self.connector("vllm")
        toks = prompt(5, SHARED_BLOCKS * BS) + prompt(99, 3 * BS + 7)
        self.assertNotEqual(toks[SHARED_BLOCKS * BS], prompt(5, 10 * BS)[SHARED_BLOCKS * BS])
        hit = conn.lookup(toks)
        self.assertEqual(hit, SHARED_BLOCKS * BS)
        table = [3 + 2 * i for i in range(12)]  # B's own pages, not A's
        load = conn.load(toks, table[:hit // BS])
        waited: List[int] = []

        def before_layer(l: int) -> None:
            load.wait_layer(l)
            waited.append(l)

        logits = self.m.forward(toks[hit:], hit, ks, vs, table, BS, before_layer)
        self.assertEqual(load.wait().rows, SHARED_BLOCKS)
        self.assertEqual(waited, list(range(self.m.num_layers)))

        k0, v0 = plain_kv(self.m)
        full = self.m.forward(toks, 0, k0, v0, table, BS)
        diff = float((logits - full[hit:]).abs().max())
        self.assertLess(diff, 1e-4, f"logits differ by {diff}")
        # the loaded pages hold what B's recompute wrote there
        pages = self.m.slots(table, BS, 0, hit)
        for l in range(self.m.num_layers):
            self.assertLess(float((ks[l][pages] - k0[l][pages]).abs().max()), 1e-5)
            self.assertLess(float((vs[l][pages] - v0[l][pages]).abs().max()), 1e-5)
        tok_reuse = self.m.greedy(toks, logits, 8, ks, vs, table, BS)
        tok_full = self.m.greedy(toks, full, 8, k0, v0, table, BS)
        self.assertEqual(tok_reuse, tok_full)

        # B saves its own blocks: the shared ones are skipped, 3 new stored
        conn.save(toks, table)
        self.assertEqual(conn.wait_for_saves(), 3)
        self.assertEqual(conn.lookup(toks), (SHARED_BLOCKS + 3) * BS)

    def test_another_salt_finds_nothing(self):
        self.run_worker_a(seed=6)
        hm, ks, vs, conn = self.connector("sglang", salt=b"another-tenant")
        self.assertEqual(conn.lookup(prompt(6, 10 * BS + 5)), 0)
        hm2, ks2, vs2, same = self.connector("sglang", salt=SALT, pool_name=f"same-{os.getpid()}")
        self.assertEqual(same.lookup(prompt(6, 10 * BS + 5)), 10 * BS)


class TestConnectorRules(ConnectorBase):
    def fill(self, ks: List[Any], vs: List[Any], toks: List[int], table: List[int]) -> None:
        self.m.forward(toks, 0, ks, vs, table, BS)

    def test_failed_load_releases_its_waits_and_raises(self):
        hm, ks, vs, conn = self.connector()
        toks = prompt(11, 4 * BS)
        load = conn.load(toks, [0, 1, 2, 3])  # never saved: ENOENT
        with self.assertRaises(kvdock.Error) as cm:
            load.wait_layer(1)  # returns (raising), does not wait forever
        self.assertEqual(cm.exception.name, "ENOENT")
        with self.assertRaises(kvdock.Error):
            load.wait(timeout=30)
        self.assertEqual(conn.failed_loads, 1)
        self.assertTrue(torch.isnan(ks[0][:4 * BS]).all())  # nothing written
        # the connector goes on: the next load works
        self.fill(ks, vs, toks, [10, 11, 12, 13])
        self.assertEqual(conn.save(toks, [10, 11, 12, 13]).wait().stored, 4)
        self.assertEqual(conn.load(toks, [0, 1, 2, 3]).wait().rows, 4)
        self.assertTrue(torch.equal(ks[1][:4 * BS], ks[1][10 * BS:14 * BS]))

    def test_load_without_lookup_names_keys(self):
        hm, ks, vs, conn = self.connector()
        toks = prompt(12, 3 * BS)
        self.fill(ks, vs, toks, [5, 6, 7])
        conn.save(toks, [5, 6, 7])
        conn.wait_for_saves()
        before = conn.cache.stats().leases
        ld = conn.load(toks, [20, 21])  # no lease of ours: by keys, the first two blocks
        self.assertEqual(ld.wait().rows, 2)
        self.assertEqual(conn.cache.stats().leases, before)
        self.assertTrue(torch.equal(vs[0][20 * BS:22 * BS], vs[0][5 * BS:7 * BS]))

    def test_lookup_leases_until_the_load(self):
        hm, ks, vs, conn = self.connector()
        toks = prompt(13, 5 * BS)
        self.fill(ks, vs, toks, list(range(5)))
        conn.save(toks, range(5))
        conn.wait_for_saves()
        self.assertEqual(conn.lookup(toks), 5 * BS)
        self.assertEqual(conn.cache.stats().leases, 1)
        self.assertEqual(conn.lookup(toks), 5 * BS)  # again: the old lease ends
        self.assertEqual(conn.cache.stats().leases, 1)
        self.assertEqual(conn.load(toks, [30, 31, 32]).wait().rows, 3)  # the lease's first 3
        self.assertEqual(conn.cache.stats().leases, 0)
        self.assertEqual(conn.cache.evict(all=True).busy, 0)  # nothing held now

    def test_partial_blocks_and_empty_calls(self):
        hm, ks, vs, conn = self.connector()
        toks = prompt(14, 2 * BS + 9)
        self.assertEqual(conn.lookup(toks[:BS - 1]), 0)  # no whole block
        self.assertEqual(conn.load(toks, []).wait().rows, 0)
        self.fill(ks, vs, toks, [0, 1, 2])
        self.assertEqual(conn.save(toks, [0, 1, 2]).wait().stored, 2)  # the partial one is not
        with self.assertRaises(ValueError):
            conn.load(toks, [0, 1, 2])  # 3 pages for 2 whole blocks

    def test_layer_groups(self):
        hm, ks, vs, conn = self.connector(layer_groups=1)
        self.assertEqual(conn.layer_groups, 1)
        toks = prompt(15, 2 * BS)
        self.fill(ks, vs, toks, [0, 1])
        conn.save(toks, [0, 1]).wait()
        ld = conn.load(toks, [8, 9])
        for l in range(self.m.num_layers):
            ld.wait_layer(l)
        ld.wait()
        with self.assertRaises(IndexError):
            ld.wait_layer(self.m.num_layers)

    def test_many_loads_in_flight(self):
        hm, ks, vs, conn = self.connector(max_loads=2)
        toks = prompt(16, 4 * BS)
        self.fill(ks, vs, toks, [0, 1, 2, 3])
        conn.save(toks, [0, 1, 2, 3]).wait()
        loads = [conn.load(toks, [8 + 4 * i + j for j in range(4)]) for i in range(6)]
        for ld in loads:
            self.assertEqual(ld.wait().rows, 4)
        for i in range(6):
            self.assertTrue(torch.equal(ks[1][(8 + 4 * i) * BS:(12 + 4 * i) * BS], ks[1][:4 * BS]))

    def test_layouts_must_match(self):
        hm, ks, vs, conn = self.connector()
        # joining (no budget) a cache of another layout: ESHAPE, nothing made
        other = kvdock.HostMemory(2 * PAGES * BS * 64 * 4)
        t = other.tensor(torch.float32).view(1, 2, PAGES, BS, 64)
        with self.assertRaises(kvdock.Error) as cm:
            kvdock.Connector(self.cli, self.cache_name, block_size=BS, kv_caches=[t[0]],
                             pool_name=f"x-{os.getpid()}")
        self.assertEqual(cm.exception.name, "ESHAPE")
        self.assertNotIn(f"x-{os.getpid()}", [p.name for p in self.cli.pools()])
        # FlashInfer's [pages, 2, ...] layout is refused, saying why
        fi = other.tensor(torch.float32).view(PAGES, 2, BS, 64)
        with self.assertRaises(ValueError) as ce:
            kvdock.Connector(self.cli, self.cache_name, block_size=BS, kv_caches=[fi])
        self.assertIn("FlashInfer", str(ce.exception))
        with self.assertRaises(ValueError):
            kvdock.Connector(self.cli, self.cache_name, block_size=BS)  # no layers

    def test_path_choice(self):
        hm, ks, vs, conn = self.connector(path="kernel")
        toks = prompt(18, 2 * BS)
        self.fill(ks, vs, toks, [0, 1])
        self.assertEqual(conn.save(toks, [0, 1]).wait().stored, 2)
        self.assertEqual(conn.load(toks, [4, 5]).wait().rows, 2)
        with self.assertRaises(ValueError):
            self.connector(path="dma", pool_name=f"p-{os.getpid()}")

    def test_keys_are_block_hashes_under_the_salt(self):
        """The connector's keys, worked out here with hashlib from the
        documented rule (key i = BLAKE2s-256(key i-1 || the block's tokens
        as little-endian int64), key -1 = BLAKE2s-256(salt)), are the keys
        its saves store in the cache."""
        hm, ks, vs, conn = self.connector()
        toks = prompt(17, 3 * BS + 5)  # and a partial block, which has no key
        prev, want = hashlib.blake2s(SALT).digest(), []
        for b in range(3):
            raw = b"".join(struct.pack("<q", t) for t in toks[b * BS:(b + 1) * BS])
            prev = hashlib.blake2s(prev + raw).digest()
            want.append(prev)
        self.assertEqual(conn.block_hashes(toks), want)
        self.fill(ks, vs, toks[:3 * BS], [0, 1, 2])
        self.assertEqual(conn.save(toks, [0, 1, 2, 3]).wait().stored, 3)
        self.assertEqual(self.cli.cache(self.cache_name).lookup(want).hits, 3)
        other = want[:2] + [hashlib.blake2s(want[1] + b"\0" * 8 * BS).digest()]
        self.assertEqual(self.cli.cache(self.cache_name).lookup(other).hits, 2)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "worker-a":
        sys.exit(worker_a(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    unittest.main(verbosity=2)

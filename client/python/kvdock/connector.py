"""The worker side of a serving engine's KV connector, over the cache tier.

An engine keeps its KV cache in pages (blocks of ``block_size`` tokens) and
asks two questions of an external cache: how many leading tokens of this
prompt it holds, and to copy them into pages it has just allocated, layer
by layer while the forward pass runs; after a forward pass it hands over
the new blocks.  :class:`Connector` answers them for one worker (one GPU
rank) with a cache of kvdockd::

    conn = kvdock.Connector(cli, "llama-3-8b", block_size=16,
                            kv_caches=kv_caches,          # vLLM: per layer [2, blocks, 16, H, D]
                            salt=b"llama-3-8b/tp0", budget_bytes=16 << 30)
    hit = conn.lookup(prompt_ids)                         # tokens cached, whole blocks
    load = conn.load(prompt_ids, block_ids[:hit // 16])   # returns at once
    for i, layer in enumerate(model.layers):
        load.wait_layer(i)       # the stream waits for layer i (no host wait)
        x = layer(x)             # ... over the loaded prefix and the new tokens
    load.wait()                  # raises if the load failed: recompute then
    conn.save(prompt_ids, block_ids)                      # after the forward pass
    ...
    conn.wait_for_saves()        # before the engine frees or reuses those pages

How the engines' interfaces map onto it:

- vLLM's KV connector (v1): ``get_num_new_matched_tokens`` is
  :meth:`Connector.lookup` minus the tokens already computed;
  ``register_kv_caches`` is the constructor (``kv_caches`` in vLLM's
  FlashAttention layout); ``start_load_kv`` calls :meth:`Connector.load`
  per request, ``wait_for_layer_load`` calls :meth:`Load.wait_layer`,
  ``save_kv_layer`` and ``wait_for_save`` are :meth:`Connector.save`
  (whole-model, after the step's forward pass) and
  :meth:`Connector.wait_for_saves`; a failed :meth:`Load.wait` is a block
  with a load error (recompute it).
- SGLang's HiCache storage backend: ``batch_exists`` is
  :meth:`Connector.lookup` in blocks, ``batch_get`` / ``batch_set`` are
  :meth:`Connector.load` / :meth:`Connector.save` with SGLang's page
  indices as block ids (k_layers / v_layers in its token-major layout).

Keys are :func:`kvdock.block_hashes` of the token ids under the
connector's salt: BLAKE2s-256 chained from BLAKE2s-256(salt), each block's
tokens as little-endian int64 (``kvd_block_hashes`` in C).  Workers that
must share blocks use the same salt (the model, its dtype, the
tensor-parallel rank: whatever changes the KV); tenants that must not
share use different ones.

Ordering: on CUDA, a save waits for the work queued on the current stream
when it is called (an interprocess event recorded there), and so does a
load (the pages it fills may still be read by earlier kernels);
:meth:`Load.wait_layer` queues a wait on a flag the daemon sets once the
layer has landed, so the forward pass starts on layer 0 while the rest
arrive.  A failed load sets its flags all the same, from this process, so
that no stream waits forever; its pages then hold whatever they held, and
:meth:`Load.wait` (or :attr:`Load.error`) says so.  On the cpu backend the
same calls run, and :meth:`Load.wait_layer` waits on the host.
"""

from __future__ import annotations

import collections
import logging
import queue
import struct
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from . import _capi as C
from ._cache import Cache, CacheLookup, block_hashes
from ._buffers import Buffer
from ._client import Client
from ._errors import Error
from ._futures import Future
from ._pools import Pool
from ._results import OpResult
from ._util import _is_tensor, _need_torch

log = logging.getLogger("kvdock.connector")

_DTYPE_LABELS = {
    "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
    "torch.float64": "fp64", "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2",
    "torch.int8": "int8", "torch.uint8": "uint8",
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
    "int8": "int8", "uint8": "uint8",
}

# A lease is used for a load only while this much of its time is left; after
# that the load names its keys (the blocks may have gone: ENOENT).
_LEASE_MARGIN_S = 0.25


def _dtype_label(t: Any) -> str:
    name = str(t.dtype)
    if name not in _DTYPE_LABELS:
        raise ValueError(f"no dtype label for {name}: pass dtype= (a label of at most 15 bytes)")
    return _DTYPE_LABELS[name]


def _token_major(t: Any, block_size: int, what: str) -> Any:
    """[num_blocks, block_size, *row] -> [num_blocks * block_size, *row] (a view)."""
    if len(t.shape) < 3 or t.shape[1] != block_size:
        raise ValueError(f"{what}: shape {tuple(t.shape)} is not [num_blocks, {block_size}, ...]")
    shape = (int(t.shape[0]) * block_size,) + tuple(int(s) for s in t.shape[2:])
    try:  # a view or nothing: a copy would import memory the engine never sees
        if _is_tensor(t):
            return t.view(shape)
        v = t.view()
        v.shape = shape
        return v
    except (RuntimeError, AttributeError, ValueError):
        raise ValueError(f"{what}: the pages' token rows are not evenly spaced "
                         f"(shape {tuple(t.shape)}, strides {t.stride() if _is_tensor(t) else t.strides})"
                         ) from None


def _split_kv_caches(kv_caches: Any, block_size: int,
                     mla: bool) -> Tuple[List[Any], Optional[List[Any]]]:
    """Per-layer K (or latent) and V token-major views of an engine's cache."""
    if isinstance(kv_caches, dict):
        layers = list(kv_caches.values())  # insertion order is layer order
    elif hasattr(kv_caches, "shape") and len(kv_caches.shape) >= (4 if mla else 5):
        layers = [kv_caches[i] for i in range(kv_caches.shape[0])]  # one tensor, layer first
    else:
        layers = list(kv_caches)
    if not layers:
        raise ValueError("kv_caches: no layers")
    if mla:
        return [_token_major(t, block_size, f"kv_caches[{i}]") for i, t in enumerate(layers)], None
    ks, vs = [], []
    for i, t in enumerate(layers):
        if len(t.shape) < 4 or t.shape[0] != 2:
            raise ValueError(
                f"kv_caches[{i}]: shape {tuple(t.shape)} is not [2, num_blocks, {block_size}, ...] "
                f"(vLLM's FlashAttention layout); a [num_blocks, 2, ...] layout (FlashInfer's) "
                f"spaces a layer's K rows unevenly across blocks: pass k_layers / v_layers of "
                f"token-major views instead, or a cache in the layout above")
        ks.append(_token_major(t[0], block_size, f"kv_caches[{i}][0]"))
        vs.append(_token_major(t[1], block_size, f"kv_caches[{i}][1]"))
    return ks, vs


def _nbytes_of_row(t: Any) -> int:
    n = int(t.element_size()) if _is_tensor(t) else int(t.itemsize)
    for s in t.shape[1:]:
        n *= int(s)
    return n


def _after(a: int, b: int) -> bool:
    """a >= b for flag values that wrap around 2**32 (CUDA's GEQ compare)."""
    return ((a - b) & 0xFFFFFFFF) < 0x80000000


class Load:
    """A load in flight (:meth:`Connector.load`): the pages it fills are
    ready layer by layer (:meth:`wait_layer`) and all at once (:meth:`wait`)."""

    def __init__(self, conn: "Connector", fut: Optional[Future[OpResult]], slot: int, value: int,
                 blocks: int) -> None:
        self._conn = conn
        self._fut = fut
        self.slot = slot
        self.value = value
        self.blocks = blocks  # pages it fills
        self._done = threading.Event()
        self._result: Optional[OpResult] = None
        self.error: Optional[BaseException] = None  # set once it failed
        if fut is None:
            self._done.set()

    @property
    def tokens(self) -> int:
        """The tokens the load brings: its blocks times the block size."""
        return self.blocks * self._conn.block_size

    def done(self) -> bool:
        """Whether the load has finished (landed or failed)."""
        return self._done.is_set()

    def wait_layer(self, layer: int) -> None:
        """Layer `layer` of every page has landed before what comes next: on
        CUDA, torch's current stream waits (queued, the host goes on); on the
        host, this call returns once it has.  Raises if the load failed."""
        conn = self._conn
        if self._fut is None:
            return
        if not 0 <= layer < conn.num_layers:
            raise IndexError(f"layer {layer} of {conn.num_layers}")
        off = conn._flag_offset(self.slot, conn._group_of[layer])
        if conn._on_cuda:
            conn._flags.wait_value(off, self.value)
            return
        deadline = None if conn.client.timeout is None else time.monotonic() + conn.client.timeout
        pause = 2e-5
        while not _after(conn._host_flag(off), self.value):
            if self._done.is_set():
                break
            if deadline is not None and time.monotonic() > deadline:
                raise Error(C.ETIMEDOUT, f"layer {layer} of a load did not land within "
                                         f"{conn.client.timeout} s")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        if self.error is not None:
            raise self.error

    def wait(self, timeout: Optional[float] = None) -> OpResult:
        """Wait on the host until every layer has landed (at most timeout
        seconds; None: without end); the load's result.  Raises the load's
        error: its pages then hold what they held before, and those tokens
        must be recomputed."""
        if self._fut is None:
            return OpResult(rows=0, skipped_oob=0, bytes=0, enqueued=False)
        if not self._done.wait(timeout):
            raise Error(C.ETIMEDOUT, f"the load did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self._result is not None
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self.error else "done" if self.done() else "in flight"
        return f"<kvdock.Load {self.blocks} blocks, {state}>"


class Save:
    """A save in flight (:meth:`Connector.save`)."""

    def __init__(self, fut: Optional[Future[OpResult]], blocks: int) -> None:
        self._fut = fut
        self.blocks = blocks  # pages handed over (blocks already cached are skipped)

    def done(self) -> bool:
        """Whether the save has finished (its pages may be reused)."""
        return self._fut is None or self._fut.done()

    def wait(self, timeout: Optional[float] = None) -> OpResult:
        """Wait until the daemon has copied the pages (they may then be
        reused), at most timeout seconds (None: without end); raises the
        save's error (EBUSY: every block held)."""
        if self._fut is None:
            return OpResult(rows=0, skipped_oob=0, bytes=0, enqueued=False)
        return self._fut.result(timeout)


class Connector:
    """One worker's KV cache (its pages) joined to a cache of kvdockd.

    Args:
        client: a :class:`kvdock.Client` of this worker (one per process is
            enough; the connector may share it).
        cache: the cache's name, created with the layout of the pages (when
            budget_bytes is given and no such cache exists) or joined.
        block_size: tokens per page (the engine's block size).
        kv_caches: the engine's KV cache: per-layer tensors
            ``[2, num_blocks, block_size, *row]`` (K then V; vLLM's
            FlashAttention layout), a sequence or an ordered dict of them,
            or one tensor ``[num_layers, 2, num_blocks, block_size, *row]``;
            with mla, per-layer ``[num_blocks, block_size, *row]`` latents.
        k_layers, v_layers: instead of kv_caches, token-major per-layer
            arrays ``[num_slots, *row]`` (SGLang's layout), page p holding
            slots ``[p * block_size, (p + 1) * block_size)``; v_layers None
            for MLA latents.
        salt: bytes chained into every key (the model, dtype, TP rank, a
            tenant: whatever must not share blocks).
        budget_bytes: the cache's byte budget if this worker creates it
            (0: join an existing cache only).
        dtype: the cache's dtype label (default: from the tensors' dtype).
        shared: a created cache may be used by other users' workers.
        cluster: a created cache reaches the caches of its name on the
            daemon's cluster peers: lookups count their blocks, loads pull
            them (kvdockd --cluster-listen).
        layer_groups: flags per load (0: one per layer, at most 128); layer
            i waits for its group.
        max_loads: loads in flight at once; one more waits for the oldest.
        pool_name: the name of the imported pool (default: from the
            client's id).
        path: how saves and loads move: "copy_engine", "kernel", or None
            for the daemon's default (the copy engines, which leave every
            SM to the forward pass).

    The tensors must stay alive while the connector is; on the cpu backend
    they must lie in a :class:`kvdock.HostMemory`.
    """

    def __init__(self, client: Client, cache: str, *, block_size: int, kv_caches: Any = None,
                 k_layers: Optional[Sequence[Any]] = None,
                 v_layers: Optional[Sequence[Any]] = None, mla: bool = False, salt: bytes = b"",
                 budget_bytes: int = 0, dtype: Optional[str] = None, shared: bool = True,
                 layer_groups: int = 0, max_loads: int = 16,
                 pool_name: Optional[str] = None, path: Optional[str] = None,
                 cluster: bool = False) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if (kv_caches is None) == (k_layers is None):
            raise ValueError("give kv_caches or k_layers (and v_layers), one of them")
        if kv_caches is not None:
            ks, vs = _split_kv_caches(kv_caches, block_size, mla)
        else:
            assert k_layers is not None
            ks, vs = list(k_layers), None if v_layers is None else list(v_layers)
            if mla and vs is not None:
                raise ValueError("mla: give k_layers only (the latents)")
            if not ks:
                raise ValueError("k_layers: no layers")
        if not 1 <= max_loads <= 1024:
            raise ValueError("max_loads: 1 to 1024")
        if path not in (None, "copy_engine", "kernel"):
            raise ValueError(f"path must be 'copy_engine', 'kernel' or None, not {path!r}")
        self.client = client
        self.path = path
        self.block_size = block_size
        self.salt = bytes(salt)
        self.num_layers = len(ks)
        self.mla = vs is None
        self._on_cuda = bool(_is_tensor(ks[0]) and ks[0].is_cuda)
        token_bytes = _nbytes_of_row(ks[0])
        label = dtype if dtype is not None else _dtype_label(ks[0])
        self._lock = threading.Lock()
        self._closed = False
        self.pool: Pool = client.import_pool(
            pool_name or f"kvdock-connector-{client.info.client_id}", ks, vs,
            page_size=block_size)
        try:
            self.cache: Cache = self._open_cache(cache, token_bytes, label, budget_bytes, shared,
                                                 cluster)
            self.num_pages = self.pool.info.num_slots // block_size
            lim = C.CACHE_LAYER_EVENTS_MAX
            self.layer_groups = min(layer_groups or self.num_layers, self.num_layers, lim)
            g, L = self.layer_groups, self.num_layers
            self._group_of = [0] * L
            for grp in range(g):
                for layer in range(grp * L // g, (grp + 1) * L // g):
                    self._group_of[layer] = grp
            self._max_loads = max_loads
            self._flags: Buffer = client.register_buffer(4 * g * max_loads, device=self._on_cuda,
                                                         name="connector-flags")
        except BaseException:
            self.pool.drop()
            raise
        # flags start at 0: before any value a load writes (cyclically)
        self._release_stream: Any = None
        self._release_words: Any = None
        self._flag_words: Any = None
        if self._on_cuda:
            torch = _need_torch()
            self._flags.tensor(torch.int32).zero_()
            torch.cuda.current_stream().synchronize()
            self._host_view = None
            # What a failed load's release needs is made here, not when a
            # load fails: by then another thread may sit in a device-wide
            # synchronize that waits on those very flags, and creating a
            # stream (or loading a kernel) would wait behind it for ever.
            # The release is a copy from pinned memory: no kernel to load.
            self._release_stream = torch.cuda.Stream()
            self._release_words = torch.zeros(g, dtype=torch.int32, pin_memory=True)
            self._flag_words = self._flags.tensor(torch.int32)
            with torch.cuda.stream(self._release_stream):
                self._flag_words[:g].copy_(self._release_words, non_blocking=True)
            self._release_stream.synchronize()
        else:
            self._host_view = self._flags._mapped().memoryview()
            self._host_view[:] = bytes(len(self._host_view))
        self._next_value = 0
        self._free_slots: Deque[int] = collections.deque(range(max_loads))
        self._slot_cv = threading.Condition(self._lock)
        self._loads: "queue.Queue[Optional[Load]]" = queue.Queue()
        self._saves: List[Save] = []
        self._leases: "collections.OrderedDict[bytes, Tuple[int, int, float]]" = \
            collections.OrderedDict()  # last hit key -> (lease, hits, expires)
        self._events: List[Any] = []
        self._next_event = 0
        self.failed_loads = 0
        self.failed_saves = 0
        self._watcher = threading.Thread(target=self._watch, name="kvdock-connector",
                                         daemon=True)
        self._watcher.start()

    # -- set-up -----------------------------------------------------------
    def _open_cache(self, name: str, token_bytes: int, dtype: str, budget: int,
                    shared: bool, cluster: bool) -> Cache:
        if budget > 0:
            return self.client.create_cache(
                name, num_layers=self.num_layers, tokens_per_block=self.block_size,
                token_bytes=token_bytes, budget_bytes=budget, mla=self.mla, dtype=dtype,
                shared=shared, open_existing=True, cluster=cluster)
        c = self.client.cache(name)
        i = c.info
        want = (self.num_layers, self.mla, self.block_size, token_bytes, dtype)
        have = (i.num_layers, i.mla, i.tokens_per_block, i.token_bytes, i.dtype)
        if want != have:
            raise Error(C.ESHAPE, f"cache '{name}' holds blocks of {have[0]} layers, "
                                  f"{'MLA' if have[1] else 'MHA'}, {have[2]} tokens of "
                                  f"{have[3]} bytes, {have[4]!r}; these pages are {want[0]} "
                                  f"layers, {'MLA' if want[1] else 'MHA'}, {want[2]} tokens of "
                                  f"{want[3]} bytes, {want[4]!r}")
        return c

    # -- keys ---------------------------------------------------------------
    def block_hashes(self, token_ids: Any) -> List[bytes]:
        """The keys of the whole blocks of token_ids under this salt."""
        return block_hashes(token_ids, self.block_size, self.salt)

    # -- lookup -------------------------------------------------------------
    def lookup(self, token_ids: Any) -> int:
        """How many leading tokens of token_ids the cache holds (whole
        blocks).  The blocks found are held for this worker's next
        :meth:`load` of them (a lease, until that load or its expiry)."""
        keys = self.block_hashes(token_ids)
        if not keys:
            return 0
        try:
            hit = self.cache.lookup(keys, lease=True)
        except Error as e:
            if e.code != C.ELIMIT:
                raise
            self._release_oldest_lease()  # at the daemon's --max-leases: make room once
            hit = self.cache.lookup(keys, lease=True)
        if hit.hits > 0 and hit.local_hits == hit.hits:
            self._keep_lease(keys[hit.hits - 1], hit)
        elif hit.lease:  # some are on cluster peers: the load pulls them, by keys
            self._release_quietly(hit.lease)
        return hit.hits * self.block_size

    def _keep_lease(self, last_key: bytes, hit: CacheLookup) -> None:
        expires = time.monotonic() + hit.lease_expires_ms / 1000.0
        with self._lock:
            old = self._leases.pop(last_key, None)
            self._leases[last_key] = (hit.lease, hit.hits, expires)
        if old is not None:
            self._release_quietly(old[0])

    def _take_lease(self, keys: Sequence[bytes], n: int) -> int:
        """A lease of this worker covering keys[:n] (0: none usable)."""
        now = time.monotonic()
        got = None
        with self._lock:
            for h in range(len(keys), n - 1, -1):
                got = self._leases.get(keys[h - 1])
                if got is not None and got[1] == h:
                    del self._leases[keys[h - 1]]
                    break
                got = None
        if got is None:
            return 0
        if got[2] - now > _LEASE_MARGIN_S:
            return got[0]
        self._release_quietly(got[0])  # about to expire: load by keys
        return 0

    def _release_oldest_lease(self) -> None:
        with self._lock:
            if not self._leases:
                return
            _, (lease, _, _) = self._leases.popitem(last=False)
        self._release_quietly(lease)

    def _release_quietly(self, lease: int) -> None:
        try:
            self.cache.release(lease)
        except Error:
            pass  # expired already

    # -- load ---------------------------------------------------------------
    def _flag_offset(self, slot: int, group: int) -> int:
        return 4 * (slot * self.layer_groups + group)

    def _host_flag(self, off: int) -> int:
        assert self._host_view is not None
        return int(struct.unpack_from("<I", self._host_view, off)[0])

    def _take_slot(self) -> Tuple[int, int]:
        with self._slot_cv:
            while not self._free_slots:
                self._slot_cv.wait()
            slot = self._free_slots.popleft()
            self._next_value = (self._next_value + 1) & 0xFFFFFFFF or 1
            return slot, self._next_value

    def _order_after_stream(self) -> Any:
        """An interprocess event recorded on torch's current stream (CUDA), else None."""
        if not self._on_cuda:
            return None
        torch = _need_torch()
        if len(self._events) < 8:
            self._events.append(torch.cuda.Event(interprocess=True))
        ev = self._events[self._next_event % len(self._events)]
        self._next_event += 1
        ev.record()
        return ev

    def load(self, token_ids: Any, block_ids: Any) -> Load:
        """Copy the cached blocks of token_ids' first len(block_ids) blocks
        into this worker's pages block_ids; returns at once.  Uses the lease
        of this worker's :meth:`lookup` of them when it has one, else the
        keys (blocks evicted since fail the load with ENOENT)."""
        pages = block_ids.tolist() if hasattr(block_ids, "tolist") else list(block_ids)
        n = len(pages)
        if n == 0:
            return Load(self, None, -1, 0, 0)
        keys = self.block_hashes(token_ids)
        if n > len(keys):
            raise ValueError(f"{n} pages for {len(keys)} whole blocks of tokens")
        if self._closed:
            raise Error(C.ECONN, "the connector is closed")
        lease = self._take_lease(keys, n)
        slot, value = self._take_slot()
        flags = self._flags.ref(self._flag_offset(slot, 0), 4 * self.layer_groups)
        try:
            fut = self.cache.load_async(self.pool, None if lease else keys[:n], blocks=pages,
                                        lease=lease, layer_flags=flags, flag_value=value,
                                        wait_event=self._order_after_stream(), path=self.path)
        except BaseException:
            self._give_slot(slot)
            raise
        ld = Load(self, fut, slot, value, n)
        self._loads.put(ld)
        return ld

    def _give_slot(self, slot: int) -> None:
        with self._slot_cv:
            self._free_slots.append(slot)
            self._slot_cv.notify()

    def _release_flags(self, ld: Load) -> None:
        """Set a failed load's flags from here, so that no wait hangs."""
        g = self.layer_groups
        if not self._on_cuda:
            assert self._host_view is not None
            base = self._flag_offset(ld.slot, 0)
            for i in range(g):
                struct.pack_into("<I", self._host_view, base + 4 * i, ld.value)
            return
        torch = _need_torch()
        words = self._flag_words
        signed = ld.value - (1 << 32) if ld.value >= (1 << 31) else ld.value
        self._release_words.fill_(signed)  # pinned host memory: no GPU work
        with torch.cuda.stream(self._release_stream):  # not behind the waits it ends
            words[ld.slot * g:(ld.slot + 1) * g].copy_(self._release_words, non_blocking=True)
        self._release_stream.synchronize()

    def _watch(self) -> None:
        """Collect each load's reply in order: free its flag slot; on failure
        set its flags and keep the error for wait()."""
        while True:
            ld = self._loads.get()
            if ld is None:
                return
            assert ld._fut is not None
            try:
                ld._result = ld._fut.result()
            except BaseException as e:  # noqa: BLE001 - kept for wait()
                ld.error = e
                self.failed_loads += 1
                log.warning("kvdock: a load of %d blocks failed (%s); its tokens must be "
                            "recomputed", ld.blocks, e)
                try:
                    self._release_flags(ld)
                except Exception as e2:  # noqa: BLE001
                    log.error("kvdock: cannot set the flags of a failed load: %s", e2)
            ld._done.set()
            self._give_slot(ld.slot)

    # -- save ---------------------------------------------------------------
    def save(self, token_ids: Any, block_ids: Any) -> Save:
        """Hand the whole blocks of token_ids in pages block_ids (block i of
        the prompt in page block_ids[i]) to the cache, after the work queued
        on torch's current stream; returns at once.  Blocks the cache holds
        already are skipped.  The pages must stay as they are until
        :meth:`wait_for_saves` (or the save's wait) returns."""
        pages = block_ids.tolist() if hasattr(block_ids, "tolist") else list(block_ids)
        keys = self.block_hashes(token_ids)
        n = min(len(keys), len(pages))
        if n == 0:
            return Save(None, 0)
        if self._closed:
            raise Error(C.ECONN, "the connector is closed")
        fut = self.cache.save_async(self.pool, keys[:n], pages[:n],
                                    wait_event=self._order_after_stream(), path=self.path)
        sv = Save(fut, n)
        with self._lock:
            self._saves.append(sv)
        return sv

    def wait_for_saves(self, timeout: Optional[float] = None) -> int:
        """Wait for every save made so far (each at most timeout seconds;
        None: without end); the blocks they stored.  A save
        the cache refused (EBUSY: everything held) or that failed is logged
        and counted in failed_saves, not raised: serving goes on without it."""
        with self._lock:
            saves, self._saves = self._saves, []
        stored = 0
        for sv in saves:
            try:
                stored += sv.wait(timeout).stored
            except Error as e:
                self.failed_saves += 1
                log.warning("kvdock: a save of %d blocks failed: %s", sv.blocks, e)
        return stored

    # -- life ---------------------------------------------------------------
    def close(self) -> None:
        """Wait for loads and saves, end leases, drop the imported pool."""
        if self._closed:
            return
        self._closed = True
        self._loads.put(None)
        self._watcher.join()
        if not self.client.connected:
            return  # the daemon ended the connection's pool, buffer and leases
        self.wait_for_saves()
        with self._lock:
            leases = [v[0] for v in self._leases.values()]
            self._leases.clear()
        for lease in leases:
            self._release_quietly(lease)
        try:
            self.client.drop_buffer(self._flags)
        finally:
            self.pool.drop()

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<kvdock.Connector cache {self.cache.name!r}: {self.num_layers} layers, "
                f"{self.num_pages} pages of {self.block_size} tokens>")


__all__ = ["Connector", "Load", "Save"]

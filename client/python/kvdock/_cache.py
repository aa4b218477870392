"""The cache tier: caches of KV blocks in kvdockd's host memory, named by
chained block hashes and shared by the workers of a node.

A worker that has just run a prompt's prefill saves its blocks; a worker
(the same one later, or another process) that gets a prompt with the same
prefix looks it up, loads the blocks found into its own KV cache and
computes only the rest::

    keys = kvdock.block_hashes(token_ids, tokens_per_block=16, salt=b"llama-3-8b")
    cache = cli.create_cache("prefix", num_layers=32, tokens_per_block=16,
                             token_bytes=8 * 128 * 2, budget_bytes=8 << 30,
                             dtype="bf16", shared=True, open_existing=True)
    hit = cache.lookup(keys, lease=True)            # leading blocks present, held
    cache.load(gpu_pool, blocks=pages[:hit.hits], lease=hit.lease)
    ...                                             # prefill the rest, then
    cache.save(gpu_pool, keys, blocks=pages)        # present ones are skipped
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import operator
import sys
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from . import _capi as C
from ._buffers import Buffer, BufRef
from ._docs import _PATH_DOC, _SYNC_DOC, _complete_async_docs, _sync_doc
from ._errors import Error
from ._events import EventLike
from ._futures import Future
from ._pools import PoolLike, _pool_id
from ._results import OpResult, _op_result

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client

KeyChain = Sequence[bytes]


def block_hashes(token_ids: Any, tokens_per_block: int, salt: bytes = b"") -> List[bytes]:
    """Chained 32-byte keys of the whole blocks of token_ids, the way serving
    engines name KV blocks: key i = BLAKE2s-256(key i-1 || the block's
    tokens as little-endian int64), key -1 = BLAKE2s-256(salt).  Equal
    prefixes (under an equal salt: the model and whatever else changes the
    KV) give equal chains.  The same function as libkvdock's
    kvd_block_hashes, so C and Python workers share blocks.

    token_ids: a sequence of ints, a numpy array or a tensor; tokens_per_block:
    the tokens of a block (a partial last block gets no key)."""
    if tokens_per_block < 1:
        raise ValueError("tokens_per_block must be >= 1")
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    try:  # one int64 array, little-endian, sliced per block: no work per token in Python
        toks = array.array("q", token_ids)
    except TypeError:
        toks = array.array("q", [operator.index(t) for t in token_ids])
    if sys.byteorder != "little":
        toks.byteswap()
    raw = toks.tobytes()
    step = 8 * tokens_per_block
    prev = hashlib.blake2s(bytes(salt)).digest()
    out = []
    for i in range(len(toks) // tokens_per_block):
        prev = hashlib.blake2s(prev + raw[i * step:(i + 1) * step]).digest()
        out.append(prev)
    return out


@dataclass(frozen=True)
class CacheDiskLevel:
    """A cache's disk level (a cache made with a disk budget on a daemon with
    ``--cache-dir``): its state now and its counters since the daemon
    started.  A block may be on both levels at once (read back into host
    memory, or spilled and still on disk)."""

    budget_bytes: int
    blocks: int             #: complete blocks on disk
    used_bytes: int         #: bytes their records take
    hits: int               #: keys of lookups found on disk only
    spills: int             #: host copies dropped, the block staying on disk only
    promotions: int         #: blocks read back into host memory
    reads: int              #: records read
    read_bytes: int
    writes: int             #: batches written
    write_bytes: int
    evictions: int          #: blocks dropped from disk
    checksum_failures: int  #: records that failed their checks (never served)
    io_errors: int
    no_space: int           #: spills refused: the file system or the budget was full
    path: str               #: the cache's directory


@dataclass(frozen=True)
class CacheInfo:
    """A cache's layout, budget, contents and counters; ``disk``: its disk
    level, None when it has none.  used_bytes: its blocks' bytes in host
    memory; held_bytes: the host memory it holds for them (slabs, entries,
    index).  keys_hit: keys of lookups found here (host memory or disk) or
    on a cluster peer; peer_hits: of those, the ones on peers only."""

    id: int
    name: str
    num_layers: int
    mla: bool
    tokens_per_block: int
    token_bytes: int
    dtype: str
    budget_bytes: int
    block_bytes: int
    capacity: int
    blocks: int
    used_bytes: int
    held_bytes: int
    shared: bool
    owner_uid: int
    allow_uids: Tuple[int, ...]
    allow_gids: Tuple[int, ...]
    lookups: int
    keys_asked: int
    keys_hit: int
    saves: int
    stored: int
    skipped: int
    refused: int
    loads: int
    loaded: int
    evictions: int
    leases: int
    bytes_in: int
    bytes_out: int
    cluster: bool = False
    fetched: int = 0
    served: int = 0
    disk: Optional[CacheDiskLevel] = None
    peer_hits: int = 0


@dataclass(frozen=True)
class CacheLookup:
    """How many leading keys are cached (here or, for a cluster cache, on a
    peer); the lease on those here (0: none); local_hits of them here;
    waited_for: the peers asked that did not answer (HOST:PORT,
    comma-separated; "" when all did); disk_hits: of local_hits, those on
    the cache's disk level only (a load reads them back first)."""

    hits: int
    lease: int = 0
    lease_expires_ms: int = 0
    local_hits: int = -1  # -1: as many as hits
    waited_for: str = ""
    disk_hits: int = 0

    def __post_init__(self) -> None:
        if self.local_hits < 0:
            object.__setattr__(self, "local_hits", self.hits)


@dataclass(frozen=True)
class CacheEvicted:
    evicted: int
    busy: int
    missing: int


def _disk_level(d: C.CacheDiskLevel) -> Optional[CacheDiskLevel]:
    if not d.enabled:
        return None
    return CacheDiskLevel(
        budget_bytes=d.budget_bytes, blocks=d.blocks, used_bytes=d.used_bytes, hits=d.hits,
        spills=d.spills, promotions=d.promotions, reads=d.reads, read_bytes=d.read_bytes,
        writes=d.writes, write_bytes=d.write_bytes, evictions=d.evictions,
        checksum_failures=d.checksum_failures, io_errors=d.io_errors, no_space=d.no_space,
        path=C.cstr(d.path))


def _cache_info(c: C.CacheInfo) -> CacheInfo:
    lay = c.layout
    return CacheInfo(
        id=c.id, name=C.cstr(c.name), num_layers=lay.num_layers, mla=bool(lay.mla),
        tokens_per_block=lay.tokens_per_block, token_bytes=lay.token_bytes,
        dtype=C.cstr(lay.dtype), budget_bytes=c.budget_bytes, block_bytes=c.block_bytes,
        capacity=c.capacity, blocks=c.blocks, used_bytes=c.used_bytes, held_bytes=c.held_bytes,
        shared=bool(c.shared), owner_uid=c.owner_uid,
        allow_uids=tuple(c.allow_uids[:c.num_allow_uids]),
        allow_gids=tuple(c.allow_gids[:c.num_allow_gids]),
        lookups=c.lookups, keys_asked=c.keys_asked, keys_hit=c.keys_hit, saves=c.saves,
        stored=c.stored, skipped=c.skipped, refused=c.refused, loads=c.loads, loaded=c.loaded,
        evictions=c.evictions, leases=c.leases, bytes_in=c.bytes_in, bytes_out=c.bytes_out,
        cluster=bool(c.cluster), fetched=c.fetched, served=c.served, disk=_disk_level(c.disk),
        peer_hits=c.peer_hits)


def _keys(keys: Optional[KeyChain]) -> Tuple[C.CacheKeys, Tuple[Any, ...]]:
    """A CacheKeys over keys (bytes each) and what must stay alive with it:
    one blob when every key has the same length (a chain of hashes), else a
    list."""
    k = C.CacheKeys()
    if keys is None:
        return k, ()
    if isinstance(keys, (bytes, bytearray, memoryview)):
        raise TypeError("keys: a sequence of bytes keys, not one bytes object")
    ks = [bytes(x) for x in keys]
    if not ks:
        return k, ()
    if len({len(x) for x in ks}) == 1 and 1 <= len(ks[0]) <= C.CACHE_KEY_MAX:
        blob = ctypes.create_string_buffer(b"".join(ks), len(ks) * len(ks[0]))
        k.blob = ctypes.addressof(blob)
        k.key_size = len(ks[0])
        k.count = len(ks)
        return k, (blob,)
    bufs = [ctypes.create_string_buffer(x, len(x)) for x in ks]
    ptrs = (c_void_p * len(ks))(*[ctypes.addressof(b) for b in bufs])
    lens = (c_size_t * len(ks))(*[len(x) for x in ks])
    k.keys = ctypes.cast(ptrs, ctypes.POINTER(c_void_p))
    k.lens = lens
    k.count = len(ks)
    return k, (bufs, ptrs, lens)


def _pages(blocks: Any, what: str = "blocks") -> Tuple[C.Indices, Any]:
    """Page indices, sent inline: a list, numpy array or tensor (any device)."""
    if hasattr(blocks, "detach") and hasattr(blocks, "cpu"):  # a tensor
        blocks = blocks.detach().reshape(-1).cpu().tolist()
    elif hasattr(blocks, "tolist"):
        blocks = blocks.tolist()
    try:
        vals = [operator.index(b) for b in blocks]
    except TypeError:
        raise TypeError(f"{what}: page indices must be integers") from None
    arr = (ctypes.c_int64 * max(len(vals), 1))(*vals)
    ix = C.Indices()
    ix.values = ctypes.addressof(arr)
    ix.count = len(vals)
    ix.dtype = C.DTYPE_I64
    return ix, arr


class Cache:
    """A handle on a cache of the cache tier (``Client.create_cache``)."""

    def __init__(self, client: "Client", info: CacheInfo) -> None:
        self.client = client
        self.info = info

    @property
    def id(self) -> int:
        """The cache's id in the daemon."""
        return self.info.id

    @property
    def name(self) -> str:
        """The cache's name."""
        return self.info.name

    def stats_async(self) -> Future[CacheInfo]:
        """The cache's contents and counters now."""
        out = C.CacheInfo()
        return self.client._submit(self.client._lib.kvd_cache_stats_submit,
                                   (self.id, None, byref(out)), lambda: _cache_info(out), (out,))

    def stats(self) -> CacheInfo:
        """The cache's contents and counters now."""
        return self.client._block(self.stats_async())

    def lookup_async(self, keys: KeyChain, *, lease: bool = False, lease_ms: int = 0) -> Future[CacheLookup]:
        """Like :meth:`lookup`, returning a :class:`Future` of its result."""
        k, keep = _keys(keys)
        out = C.CacheLookupResult()
        return self.client._submit(
            self.client._lib.kvd_cache_lookup_submit, (self.id, byref(k), lease, lease_ms,
                                                       byref(out)),
            lambda: CacheLookup(out.hits, out.lease, out.lease_expires_ms, out.local_hits,
                                out.waited_for.decode(), out.disk_hits),
            (k, keep, out))

    def lookup(self, keys: KeyChain, *, lease: bool = False, lease_ms: int = 0) -> CacheLookup:
        """How many leading keys of the chain are cached.  With lease, those
        blocks are held for this client until a load by the lease, release(),
        lease_ms (0: the daemon's default), or the connection's end."""
        return self.client._block(self.lookup_async(keys, lease=lease, lease_ms=lease_ms))

    def save_async(self, pool: PoolLike, keys: KeyChain, blocks: Any, *,
                   parent: Optional[bytes] = None, wait_event: EventLike = None,
                   record_event: EventLike = None, reply_at_enqueue: bool = False,
                   path: Optional[str] = None) -> Future[OpResult]:
        """Like :meth:`save`, returning a :class:`Future` of its result."""
        k, keep = _keys(keys)
        ix, arr = _pages(blocks)
        par = bytes(parent) if parent else b""
        pbuf = ctypes.create_string_buffer(par, len(par)) if par else None
        a = C.CacheSave(cache=self.id, pool=_pool_id(pool), keys=k, blocks=ix,
                        parent=ctypes.addressof(pbuf) if pbuf is not None else None,
                        parent_len=len(par))
        sync = self.client._sync(wait_event, record_event, reply_at_enqueue, None, 0, False, path)
        out = C.OpResult()
        return self.client._submit(self.client._lib.kvd_cache_save_submit,
                                   (byref(a), byref(sync), byref(out)),
                                   lambda: _op_result(out), (a, keep, arr, pbuf, sync, out))

    @_sync_doc(_SYNC_DOC, _PATH_DOC)
    def save(self, pool: PoolLike, keys: KeyChain, blocks: Any, *, parent: Optional[bytes] = None,
             wait_event: EventLike = None, record_event: EventLike = None,
             reply_at_enqueue: bool = False, path: Optional[str] = None) -> OpResult:
        """Copy the blocks that the cache does not hold yet into it: keys[i]
        names the block in page blocks[i] of pool (a paged :class:`Pool`, or
        its id, of this cache's layout: a page is a block).  The result's
        stored, skipped (found there already) and refused (every block held,
        no room: EBUSY when none was stored) count them.

        pool: where the blocks are.
        keys: the chain's keys of those blocks (:func:`block_hashes`), in
            order; bytes each.
        blocks: one page index of pool per key (a list, numpy array or tensor).
        parent: the key before keys[0] in its chain (None: keys[0] starts it),
            so that an eviction of a key takes the blocks after it too.

        Blocks until the reply comes (within the client's timeout); ``save_async``
        is the same call returning a :class:`Future`."""
        return self.client._block(self.save_async(
            pool, keys, blocks, parent=parent, wait_event=wait_event, record_event=record_event,
            reply_at_enqueue=reply_at_enqueue, path=path))

    def load_async(self, pool: PoolLike, keys: Optional[KeyChain] = None, *, blocks: Any,
                   lease: int = 0, layer_events: Optional[Sequence[EventLike]] = None,
                   layer_flags: Any = None, flag_value: int = 1,
                   wait_event: EventLike = None, record_event: EventLike = None,
                   reply_at_enqueue: bool = False, path: Optional[str] = None) -> Future[OpResult]:
        """Like :meth:`load`, returning a :class:`Future` of its result."""
        if keys is not None and lease:
            raise ValueError("load takes keys or a lease, not both")
        if keys is None and not lease:
            raise ValueError("load takes keys or a lease: lease is 0 (a lookup that found no "
                             "block, or held none on this daemon, gives none): pass keys")
        k, keep = _keys(keys)
        ix, arr = _pages(blocks)
        evs = [self.client._event_id(e) for e in (layer_events or ())]
        if len(evs) > C.CACHE_LAYER_EVENTS_MAX:
            raise ValueError(f"at most {C.CACHE_LAYER_EVENTS_MAX} layer events")
        ev_arr = (c_uint64 * max(len(evs), 1))(*evs)
        flags = C.BufRef()
        if layer_flags is not None:
            ref = layer_flags.ref() if isinstance(layer_flags, Buffer) else layer_flags
            if not isinstance(ref, BufRef):
                raise TypeError("layer_flags: a Buffer or a BufRef (Buffer.ref(offset, 4 * groups))")
            flags = C.BufRef(buffer=ref.buffer.id, offset=ref.offset, bytes=ref.nbytes)
        a = C.CacheLoad(cache=self.id, pool=_pool_id(pool), keys=k, lease=lease, blocks=ix,
                        layer_events=ctypes.cast(ev_arr, ctypes.POINTER(c_uint64)),
                        num_layer_events=len(evs), layer_flags=flags, flag_value=flag_value)
        sync = self.client._sync(wait_event, record_event, reply_at_enqueue, None, 0, False, path)
        out = C.OpResult()
        return self.client._submit(self.client._lib.kvd_cache_load_submit,
                                   (byref(a), byref(sync), byref(out)),
                                   lambda: _op_result(out), (a, keep, arr, ev_arr, sync, out))

    @_sync_doc(_SYNC_DOC, _PATH_DOC)
    def load(self, pool: PoolLike, keys: Optional[KeyChain] = None, *, blocks: Any, lease: int = 0,
             layer_events: Optional[Sequence[EventLike]] = None, layer_flags: Any = None,
             flag_value: int = 1, wait_event: EventLike = None, record_event: EventLike = None,
             reply_at_enqueue: bool = False, path: Optional[str] = None) -> OpResult:
        """Copy cached blocks into pages of pool, named by keys or by a lease
        (one of them): blocks a lookup with lease=True holds, which no
        eviction takes meanwhile.  For a cluster cache, keys held by peers
        are pulled from them first.

        pool: where the blocks go (a paged :class:`Pool`, or its id, of this
            cache's layout).
        keys: the keys of the blocks, in chain order (None with a lease).
        blocks: one page index of pool per key (a list, numpy array or tensor).
        lease: a lease id from :meth:`lookup` (its blocks, all of them); 0:
            none.
        layer_events: registered events, one per group of layers, each
            recorded once that group has landed (so that a forward pass may
            start on the first layers early).
        layer_flags: a :class:`Buffer` (or a :class:`BufRef` of 4 bytes a
            group) whose uint32 per group of layers is set to flag_value once
            the group has landed (:meth:`Buffer.wait_value`).
        flag_value: the value written to layer_flags (not 0).

        Blocks until the reply comes (within the client's timeout); ``load_async``
        is the same call returning a :class:`Future`."""
        return self.client._block(self.load_async(
            pool, keys, blocks=blocks, lease=lease, layer_events=layer_events,
            layer_flags=layer_flags, flag_value=flag_value, wait_event=wait_event,
            record_event=record_event, reply_at_enqueue=reply_at_enqueue, path=path))

    def evict_async(self, keys: Optional[KeyChain] = None, *, all: bool = False) -> Future[CacheEvicted]:
        """Like :meth:`evict`, returning a :class:`Future` of its result."""
        k, keep = _keys(keys)
        out = C.CacheEvictResult()
        return self.client._submit(self.client._lib.kvd_cache_evict_submit,
                                   (self.id, byref(k), all, byref(out)),
                                   lambda: CacheEvicted(out.evicted, out.busy, out.missing),
                                   (k, keep, out))

    def evict(self, keys: Optional[KeyChain] = None, *, all: bool = False) -> CacheEvicted:
        """Evict keys and every block after them in any chain, or everything
        (all=True); held blocks stay (counted busy).  Owner or admin."""
        return self.client._block(self.evict_async(keys, all=all))

    def clear(self) -> CacheEvicted:
        """Evict every block nothing holds."""
        return self.evict(all=True)

    def release(self, lease: Union[int, CacheLookup]) -> None:
        """End a lease before its time."""
        lid = lease.lease if isinstance(lease, CacheLookup) else int(lease)
        self.client._block(self.client._submit(self.client._lib.kvd_cache_release_submit,
                                               (lid,), lambda: None))

    def drop(self) -> None:
        """Drop the cache (owner or admin): its blocks and leases go."""
        self.client.drop_cache(self)

    def __repr__(self) -> str:
        return f"<kvdock.Cache {self.name!r} id={self.id}>"


def create_cache_async(client: "Client", name: str, *, num_layers: int, tokens_per_block: int,
                       token_bytes: int, budget_bytes: int, mla: bool = False, dtype: str = "",
                       shared: bool = False, allow_uids: Sequence[int] = (),
                       allow_gids: Sequence[int] = (), open_existing: bool = False,
                       cluster: bool = False, disk_budget: int = 0) -> Future[Cache]:
    if len(dtype.encode()) > 15:
        raise ValueError("dtype is a label of at most 15 bytes")
    if not isinstance(disk_budget, int) or isinstance(disk_budget, bool) or \
            not 0 <= disk_budget < 1 << 64:
        raise ValueError(f"disk_budget is bytes from 0 (no disk level), not {disk_budget!r}")
    uids = (c_uint32 * max(len(allow_uids), 1))(*allow_uids)
    gids = (c_uint32 * max(len(allow_gids), 1))(*allow_gids)
    nm = name.encode()
    spec = C.CacheSpec(name=nm, layout=C.CacheLayout(num_layers, mla, tokens_per_block,
                                                     token_bytes, dtype.encode()),
                       budget_bytes=budget_bytes, shared=shared,
                       allow_uids=ctypes.cast(uids, ctypes.POINTER(c_uint32)),
                       num_allow_uids=len(allow_uids),
                       allow_gids=ctypes.cast(gids, ctypes.POINTER(c_uint32)),
                       num_allow_gids=len(allow_gids), open_existing=open_existing,
                       cluster=cluster, disk_budget_bytes=disk_budget)
    out = C.CacheInfo()
    return client._submit(client._lib.kvd_cache_create_submit, (byref(spec), byref(out)),
                          lambda: Cache(client, _cache_info(out)), (spec, nm, uids, gids, out))


def caches_async(client: "Client", cap: int = 256) -> Future[List[CacheInfo]]:
    out = (C.CacheInfo * cap)()
    count = c_size_t(0)
    return client._submit(client._lib.kvd_cache_list_submit, (out, cap, byref(count)),
                          lambda: [_cache_info(out[i]) for i in range(min(count.value, cap))],
                          (out, count))


def cache_by_name(client: "Client", name: str) -> Cache:
    out = C.CacheInfo()
    fut: Future[Cache] = client._submit(client._lib.kvd_cache_stats_submit,
                                        (0, name.encode(), byref(out)),
                                        lambda: Cache(client, _cache_info(out)), (out,))
    return client._block(fut)


def drop_cache_async(client: "Client", cache: Union[Cache, int, str]) -> Future[None]:
    if isinstance(cache, str):
        args: Tuple[Any, ...] = (0, cache.encode())
    else:
        args = (cache.id if isinstance(cache, Cache) else int(cache), None)
    return client._submit(client._lib.kvd_cache_drop_submit, args, lambda: None)


__all__ = ["Cache", "CacheEvicted", "CacheInfo", "CacheLookup", "block_hashes", "Error"]

_complete_async_docs(Cache)

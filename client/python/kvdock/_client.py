"""The client: a connection to kvdockd and every operation on it."""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
from ctypes import byref, c_size_t, c_uint64, c_void_p
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _cache
from . import _capi as C
from ._buffers import Buffer
from ._cache import Cache, CacheInfo
from ._docs import (_COPY_ENGINE_DOC, _PATH_DOC, _STREAM_DOC, _SYNC_DOC, _complete_async_docs,
                    _sync_doc)
from ._errors import Error, Timeout, _check, _make_error
from ._events import Event, EventLike, _event_handle
from ._futures import Future
from ._mapping import HostMemory, Mapping, _MapHandle, _host_memory_of
from ._operands import (_CACHE_DTYPES, _Req, _SRC_DTYPES, _STREAMS, _dtype_name, _floats,
                        _layer_geometry)
from ._pools import Pool, PoolLike, _pool_id
from ._results import (HelloInfo, Limits, OpResult, PoolInfo, _PATHS, _kind_name, _kind_of,
                       _op_result, _pool_info, _struct_dict)
from ._util import T, _need_torch


class Client:
    """A connection to kvdockd.

    Args:
        socket: the daemon's socket path (None: $KVDOCK_SOCKET, else
            /run/kvdock/kvdockd.sock when the system service's socket is
            there, else $XDG_RUNTIME_DIR/kvdock/kvdockd.sock, else
            /tmp/kvdock-UID/kvdockd.sock).
        name: the client name shown by ``kvdock status``.
        timeout: seconds a blocking call waits for its reply (None: forever);
            past it the call raises :class:`Timeout`.

    Every operation ``op(...)`` blocks until its reply; ``op_async(...)``
    returns a :class:`Future` at once.  Use it as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, socket: Optional[str] = None, name: str = "kvdock-python",
                 timeout: Optional[float] = None) -> None:
        lib = C.load()
        self._lib = lib
        self._cli = c_void_p()
        self._lock = threading.Lock()
        self._buffers: Dict[int, Buffer] = {}
        self._events: Dict[bytes, Event] = {}
        self.timeout = timeout
        st = lib.kvd_client_create(socket.encode() if socket else None, name.encode(),
                                   byref(self._cli))
        _check(st, None)
        h = lib.kvd_client_info(self._cli).contents
        lim = h.limits
        self.info = HelloInfo(
            protocol_version=h.protocol_version, daemon_version=C.cstr(h.daemon_version),
            backend=lib.kvd_backend_name(h.backend).decode(), device_name=C.cstr(h.device_name),
            device_ordinal=h.device_ordinal,
            limits=Limits(lim.max_frame_bytes, lim.max_inflight, lim.max_pools, lim.max_pool_bytes,
                          lim.max_total_pool_bytes, lim.max_inline_bytes),
            client_id=h.client_id, daemon_pid=h.daemon_pid, admin=bool(h.admin))
        self.socket_path: str = lib.kvd_client_socket_path(self._cli).decode()
        # Inline payloads past this go through temporary registered buffers;
        # a quarter of the frame limit leaves room for K and V together.
        lim_inline = lim.max_inline_bytes or (4 << 20)
        self.max_inline_bytes = min(lim_inline, max(lim.max_frame_bytes // 4, 1024))

    # -- life ---------------------------------------------------------------
    def _handle(self) -> c_void_p:
        if not self._cli:
            raise Error(C.ECONN, "the client is closed")
        return self._cli

    def _handle_or_none(self) -> Optional[c_void_p]:
        return self._cli if self._cli else None

    def close(self) -> None:
        """Close the connection.  Mappings stay valid while referenced."""
        if self._cli:
            self._lib.kvd_client_destroy(byref(self._cli))
            self._cli = c_void_p()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    @property
    def connected(self) -> bool:
        """Whether the connection is open (not closed, not lost)."""
        return bool(self._cli) and bool(self._lib.kvd_client_connected(self._cli))

    @property
    def pending(self) -> int:
        """Requests submitted and not yet collected."""
        return int(self._lib.kvd_client_pending(self._handle()))

    @property
    def fd(self) -> int:
        """The socket (readable when a reply waits), for selectors."""
        return int(self._lib.kvd_client_fd(self._handle()))

    @staticmethod
    def has_cuda() -> bool:
        """Whether libkvdock was built with CUDA (device mappings work)."""
        return bool(C.load().kvd_client_has_cuda())

    # -- submitting -----------------------------------------------------------
    def _submit(self, fn: Callable[..., int], args: Sequence[Any], finish: Callable[[], T],
                keep: Tuple[Any, ...] = (), req: Optional[_Req] = None) -> Future[T]:
        rid = c_uint64(0)
        try:
            st = fn(self._handle(), *args, byref(rid))
            _check(st, self._cli)
        except BaseException:
            if req is not None:
                req.cleanup()
            raise
        cleanup = req.cleanup if req is not None else None
        return Future(self, rid.value, finish, keep + tuple(args), cleanup)

    def _block(self, fut: Future[T]) -> T:
        try:
            return fut.result(self.timeout)
        except concurrent.futures.TimeoutError:
            fut.abandon()
            raise Timeout(C.ETIMEDOUT, f"no reply to request {fut.request_id} within "
                                       f"{self.timeout} s") from None

    # -- session ----------------------------------------------------------
    def ping_async(self, payload: bytes = b"") -> Future[None]:
        """Send payload and check that it comes back."""
        buf = bytes(payload)
        return self._submit(self._lib.kvd_ping_submit, (buf or None, len(buf)), lambda: None)

    def ping(self, payload: bytes = b"") -> None:
        return self._block(self.ping_async(payload))

    def status_async(self, max_clients: int = 256) -> Future[Dict[str, Any]]:
        """Daemon status as a dict (clients_list: a list of dicts, at most
        max_clients of them; "cluster" in a cluster only; "disk", the disk
        level's dict of cache_dir, io_engine, direct, budget_bytes,
        reserved_bytes, used_bytes, fs_free_bytes, num_skipped and skipped,
        with --cache-dir only: skipped lists the directories there the daemon
        did not reopen at start, as dicts of dir, name, owner_uid and reason,
        the first 16 of num_skipped)."""
        out = C.DaemonStatus()
        ents = (C.ClientEntry * max_clients)()

        def finish() -> Dict[str, Any]:
            d = _struct_dict(out)
            d["backend"] = self._lib.kvd_backend_name(out.backend).decode()
            d["clients_list"] = [_struct_dict(ents[i])
                                 for i in range(min(out.num_clients, max_clients))]
            cl = out.cluster
            if cl.enabled:  # the peers as dicts; no "cluster" key outside a cluster
                c = _struct_dict(cl)
                c["peers"] = [_struct_dict(cl.peers[i])
                              for i in range(min(cl.num_peers, C.CLUSTER_PEERS_MAX))]
                d["cluster"] = c
            else:
                del d["cluster"]
            if out.disk.enabled:  # no "disk" key without --cache-dir
                dk = _struct_dict(out.disk)
                del dk["enabled"]
                dk["direct"] = bool(dk["direct"])
                dk["skipped"] = [_struct_dict(out.disk.skipped[i]) for i in
                                 range(min(out.disk.num_skipped, C.DISK_SKIPPED_MAX))]
                d["disk"] = dk
            else:
                del d["disk"]
            return d

        return self._submit(self._lib.kvd_daemon_status_submit,
                            (byref(out), ents, max_clients), finish, (out, ents))

    def status(self, max_clients: int = 256) -> Dict[str, Any]:
        return self._block(self.status_async(max_clients))

    def stats_async(self) -> Future[Dict[str, Any]]:
        """Daemon statistics: {"bytes_in", "bytes_out", "connections", "ops": [...],
        "streams": [...]} (histograms as lists)."""
        out, ops, streams = C.DaemonStats(), (C.OpStats * 64)(), (C.StreamStats * 16)()

        def finish() -> Dict[str, Any]:
            ol = []
            for i in range(min(out.num_ops, 64)):
                o = ops[i]
                nb = min(o.num_bounds, C.HIST_MAX)
                ol.append({"op": C.cstr(o.op), "requests": o.requests, "errors": o.errors,
                           "bytes": o.bytes, "bounds_us": list(o.bounds_us[:nb]),
                           "counts": list(o.counts[: nb + 1]), "sum_us": o.sum_us})
            sl = [_struct_dict(streams[i]) for i in range(min(out.num_streams, 16))]
            return {"bytes_in": out.bytes_in, "bytes_out": out.bytes_out,
                    "connections": out.connections, "ops": ol, "streams": sl}

        return self._submit(self._lib.kvd_daemon_stats_submit,
                            (byref(out), ops, 64, streams, 16), finish, (out, ops, streams))

    def stats(self) -> Dict[str, Any]:
        return self._block(self.stats_async())

    def shutdown_async(self, drain: bool = True) -> Future[None]:
        """Ask the daemon to exit (admin only); drain: finish the work in
        flight first."""
        return self._submit(self._lib.kvd_daemon_shutdown_submit, (drain,), lambda: None)

    def shutdown(self, drain: bool = True) -> None:
        return self._block(self.shutdown_async(drain))

    # -- pools --------------------------------------------------------------
    def create_pool_async(self, name: str, num_layers: int, num_slots: int, slot_bytes: int, *,
                          kind: Union[str, int] = "host", mla: bool = False, page_size: int = 0,
                          shared: bool = False) -> Future[Pool]:
        """Like :meth:`create_pool`, returning a :class:`Future` of its result."""
        bname = name.encode()
        spec = C.PoolSpec(name=bname, kind=_kind_of(kind), num_layers=num_layers,
                          num_slots=num_slots, slot_bytes=slot_bytes, mla=mla,
                          page_size=page_size, shared=shared)
        out = C.PoolInfo()
        return self._submit(self._lib.kvd_pool_create_submit, (byref(spec), byref(out)),
                            lambda: Pool(self, _pool_info(out)), (spec, out, bname))

    def create_pool(self, name: str, num_layers: int, num_slots: int, slot_bytes: int, *,
                    kind: Union[str, int] = "host", mla: bool = False, page_size: int = 0,
                    shared: bool = False) -> Pool:
        """Create a daemon-owned pool named name: num_layers layers of
        num_slots slots of slot_bytes each, K and V (one latent with mla), in
        pages of page_size slots (0 or 1: unpaged); a :class:`Pool`.

        kind: "host" (memfd pages), "device" (cudaMalloc) or "device-vmm".
        shared: other clients may use it, and it outlives this connection
        until dropped.

        Blocks until the reply comes (within the client's timeout); ``create_pool_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.create_pool_async(name, num_layers, num_slots, slot_bytes,
                                                  kind=kind, mla=mla, page_size=page_size,
                                                  shared=shared))

    def drop_pool_async(self, pool: Union[PoolLike, str]) -> Future[None]:
        """Drop a pool by Pool, id or name."""
        pid, name = (0, pool.encode()) if isinstance(pool, str) else (_pool_id(pool), None)
        return self._submit(self._lib.kvd_pool_drop_submit, (pid, name), lambda: None)

    def drop_pool(self, pool: Union[PoolLike, str]) -> None:
        return self._block(self.drop_pool_async(pool))

    def pools_async(self, cap: int = 1024, all: bool = False) -> Future[List[PoolInfo]]:
        """This client's pools and the shared ones (all: every client's, for
        an admin), as a list of :class:`PoolInfo`: the first cap of them."""
        out, count = (C.PoolInfo * cap)(), c_size_t(0)
        fn = self._lib.kvd_pool_list_all_submit if all else self._lib.kvd_pool_list_submit
        return self._submit(fn, (out, cap, byref(count)),
                            lambda: [_pool_info(out[i]) for i in range(min(count.value, cap))],
                            (out, count))

    def pools(self, cap: int = 1024, all: bool = False) -> List[PoolInfo]:
        """This client's pools and the shared ones (all: every client's, for
        an admin): the first cap of them."""
        return self._block(self.pools_async(cap, all))

    def pool(self, name: str) -> Pool:
        """A handle on an existing pool found by name (ENOENT if none)."""
        for p in self.pools():
            if p.name == name:
                return Pool(self, p)
        raise Error(15, f"no pool named {name!r}")

    def export_pool_async(self, pool: Union[PoolLike, str], map: bool = True) -> Future[Mapping]:
        """Export a daemon-owned pool; the future gives its :class:`Mapping`
        (map=False: the handle or descriptor only, base 0)."""
        pid, name = (0, pool.encode()) if isinstance(pool, str) else (_pool_id(pool), None)
        out = ctypes.POINTER(C.Mapping)()

        def finish() -> Mapping:
            h = _MapHandle(out)
            return Mapping(h, _pool_info(h.m.pool))

        return self._submit(self._lib.kvd_pool_export_submit,
                            (pid, name, 0 if map else C.EXPORT_NO_MAP, byref(out)), finish, (out,))

    def export_pool(self, pool: Union[PoolLike, str], map: bool = True) -> Mapping:
        return self._block(self.export_pool_async(pool, map))

    def import_pool_async(self, name: str, k_layers: Sequence[Any],
                          v_layers: Optional[Sequence[Any]] = None, *, page_size: int = 0,
                          shared: bool = False) -> Future[Pool]:
        """Like :meth:`import_pool`, returning a :class:`Future` of its result."""
        mla = v_layers is None
        vl: Sequence[Any] = v_layers if v_layers is not None else ()
        layers = [("k", t) for t in k_layers] + [("v", t) for t in vl]
        if not k_layers or (not mla and len(vl) != len(k_layers)):
            raise ValueError("k_layers must be non-empty and v_layers, if given, as long")
        regions: List[C.ImportRegion] = []
        region_key: Dict[Any, int] = {}
        refs: Dict[str, List[C.MemRef]] = {"k": [], "v": []}
        fds_to_close: List[int] = []
        host_mems: List[HostMemory] = []
        num_slots = slot_bytes = slot_stride = None
        lib = self._lib
        try:
            for which, t in layers:
                ptr, shape, item, stride0, on_cuda = _layer_geometry(t)
                rows, rb = shape[0], item
                for s in shape[1:]:
                    rb *= s
                if num_slots is None:
                    num_slots, slot_bytes, slot_stride = rows, rb, stride0
                elif (rows, rb, stride0) != (num_slots, slot_bytes, slot_stride):
                    raise ValueError(
                        f"every layer must have the same shape and row stride: "
                        f"{rows}x{rb} bytes, stride {stride0}, vs {num_slots}x{slot_bytes}, "
                        f"stride {slot_stride}")
                if on_cuda:
                    reg, off = C.ImportRegion(), c_uint64(0)
                    st = lib.kvd_import_region_from_device_ptr(ptr, byref(reg), byref(off))
                    if st != C.OK:
                        # No legacy handle: memory of the VMM API (PyTorch's
                        # expandable segments) goes as a descriptor.
                        msg = lib.kvd_client_last_error(None).decode("utf-8", "replace")
                        reg, off = C.ImportRegion(), c_uint64(0)
                        st2 = lib.kvd_import_region_from_vmm_ptr(ptr, byref(reg), byref(off))
                        if st2 != C.OK:
                            msg2 = lib.kvd_client_last_error(None).decode("utf-8", "replace")
                            raise _make_error(st, f"layer at {ptr:#x}: no legacy IPC handle "
                                                  f"({msg}), nor VMM memory ({msg2})")
                        fds_to_close.append(reg.fd)
                        key = ("vmm", ptr - off.value)
                    else:
                        # One region per allocation (its base), however
                        # many layers it holds: the daemon opens it once.
                        key = ("ipc", ptr - off.value)
                    offset = off.value
                else:
                    hm = _host_memory_of(ptr, max(1, (rows - 1) * stride0 + rb))
                    if hm is None:
                        raise ValueError("host layers must lie in a kvdock.HostMemory "
                                         "(shared pages the daemon can map)")
                    key = ("host", hm.base)
                    reg = hm.region()
                    offset = ptr - hm.base
                    host_mems.append(hm)
                if key not in region_key:
                    region_key[key] = len(regions)
                    regions.append(reg)
                refs[which].append(C.MemRef(region=region_key[key], offset=offset))
            regs = (C.ImportRegion * len(regions))(*regions)
            kref = (C.MemRef * len(refs["k"]))(*refs["k"])
            vref = None if mla else (C.MemRef * len(refs["v"]))(*refs["v"])
            bname = name.encode()
            spec = C.PoolImport(
                name=bname, num_layers=len(k_layers), num_slots=num_slots,
                slot_bytes=slot_bytes,
                slot_stride=0 if slot_stride == slot_bytes else slot_stride, mla=mla,
                page_size=page_size, shared=shared, regions=regs, num_regions=len(regions),
                k_layers=kref, v_layers=vref)
            out = C.PoolInfo()
            keep_mem = tuple(k_layers) + tuple(v_layers or ()) + tuple(host_mems)
            return self._submit(lib.kvd_pool_import_submit, (byref(spec), byref(out)),
                                lambda: Pool(self, _pool_info(out), keep_mem),
                                (spec, out, regs, kref, vref, bname))
        finally:
            for fd in fds_to_close:  # sent (duplicated) at submit; ours to close
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def import_pool(self, name: str, k_layers: Sequence[Any],
                    v_layers: Optional[Sequence[Any]] = None, *, page_size: int = 0,
                    shared: bool = False) -> Pool:
        """Make the caller's memory a pool named name, without a copy, in
        pages of page_size slots (0 or 1: unpaged); shared: other clients may
        use it.

        k_layers (and v_layers for MHA; None makes an MLA pool whose
        k_layers are the latents): one array per layer, each
        ``[num_slots, ...]`` with contiguous rows and one row stride for all.
        Either CUDA tensors (a worker's KV cache: each tensor's allocation is
        shared through its legacy CUDA IPC handle and the tensor's offset
        in it, or as a VMM descriptor for cuMemCreate memory), or numpy
        arrays / CPU tensors inside a :class:`HostMemory`.  The pool keeps
        references to them until it is dropped.

        Blocks until the reply comes (within the client's timeout); ``import_pool_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.import_pool_async(name, k_layers, v_layers, page_size=page_size,
                                                  shared=shared))

    # -- buffers and events -----------------------------------------------
    def register_buffer_async(self, nbytes: int, *, device: bool = False, name: str = "",
                              map: bool = True) -> Future[Buffer]:
        """Like :meth:`register_buffer`, returning a :class:`Future` of its result."""
        kind = C.MEM_DEVICE if device else C.MEM_HOST
        bid, out = c_uint64(0), ctypes.POINTER(C.Mapping)()
        bname = name.encode() if name else None

        def finish() -> Buffer:
            mp = Mapping(_MapHandle(out)) if out else None
            b = Buffer(self, bid.value, nbytes, _kind_name(kind), mp)
            with self._lock:
                self._buffers[b.id] = b
            return b

        return self._submit(self._lib.kvd_buffer_register_submit,
                            (nbytes, kind, bname, byref(bid), byref(out) if map else None),
                            finish, (bid, out, bname))

    def register_buffer(self, nbytes: int, *, device: bool = False, name: str = "",
                        map: bool = True) -> Buffer:
        """Register a buffer of nbytes (host memory, or device memory with
        device), labelled name (shown in listings); a :class:`Buffer`, mapped
        here unless map is False.

        Blocks until the reply comes (within the client's timeout); ``register_buffer_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.register_buffer_async(nbytes, device=device, name=name, map=map))

    def drop_buffer_async(self, buf: Union[Buffer, int]) -> Future[None]:
        """Drop the registered buffer buf (a :class:`Buffer` or its id); its
        mapping here closes."""
        bid = buf.id if isinstance(buf, Buffer) else int(buf)

        def finish() -> None:
            with self._lock:
                b = self._buffers.pop(bid, None)
            if b is not None and b.mapping is not None:
                b.mapping.close()

        return self._submit(self._lib.kvd_buffer_drop_submit, (bid,), finish)

    def drop_buffer(self, buf: Union[Buffer, int]) -> None:
        return self._block(self.drop_buffer_async(buf))

    def _drop_quietly(self, b: Buffer) -> None:
        """Drop a temporary buffer without waiting (its reply is discarded)."""
        with self._lock:
            self._buffers.pop(b.id, None)
        if b.mapping is not None:
            b.mapping.close()
        cli = self._handle_or_none()
        if not cli:
            return
        rid = c_uint64(0)
        if self._lib.kvd_buffer_drop_submit(cli, b.id, byref(rid)) == C.OK:
            self._lib.kvd_client_abandon(cli, rid.value)

    def _buffer_at(self, ptr: int, nbytes: int) -> Optional[Buffer]:
        with self._lock:
            for b in self._buffers.values():
                if b.mapping is not None and b.mapping.contains(ptr, nbytes):
                    return b
        return None

    def register_event_async(self, event: Any) -> Future[Event]:
        """Register an interprocess CUDA event: a
        ``torch.cuda.Event(interprocess=True)`` or its 64 ipc_handle() bytes.
        The future gives an :class:`Event`."""
        handle = _event_handle(event)
        eid = c_uint64(0)
        hbuf = ctypes.create_string_buffer(handle, C.IPC_HANDLE_BYTES)

        def finish() -> Event:
            ev = Event(self, eid.value, None if isinstance(event, (bytes, bytearray)) else event)
            with self._lock:
                self._events[handle] = ev
            return ev

        return self._submit(self._lib.kvd_event_register_submit, (hbuf, byref(eid)), finish,
                            (hbuf, eid))

    def register_event(self, event: Any) -> Event:
        return self._block(self.register_event_async(event))

    def drop_event_async(self, event: Union[Event, int]) -> Future[None]:
        """Drop a registered event (an :class:`Event` or its id)."""
        eid = event.id if isinstance(event, Event) else int(event)

        def finish() -> None:
            with self._lock:
                for k, e in list(self._events.items()):
                    if e.id == eid:
                        del self._events[k]

        return self._submit(self._lib.kvd_event_drop_submit, (eid,), finish)

    def drop_event(self, event: Union[Event, int]) -> None:
        return self._block(self.drop_event_async(event))

    def _event_id(self, ev: EventLike) -> int:
        if ev is None:
            return 0
        if isinstance(ev, Event):
            return ev.id
        if isinstance(ev, int):
            return ev
        handle = _event_handle(ev)
        with self._lock:
            known = self._events.get(handle)
        if known is None:
            known = self.register_event(ev)  # registered once, then reused
        return known.id

    def _sync(self, wait_event: EventLike, record_event: EventLike, reply_at_enqueue: bool,
              stream: Optional[str], max_blocks: int, copy_engine: bool,
              path: Optional[str] = None) -> C.Sync:
        if stream not in _STREAMS and not isinstance(stream, int):
            raise ValueError(f"stream must be one of {[s for s in _STREAMS if s]}")
        if path not in _PATHS:
            raise ValueError(f"path must be 'copy-engine' (or 'copy_engine'), 'kernel' or None, "
                             f"not {path!r}")
        return C.Sync(wait_event=self._event_id(wait_event),
                      record_event=self._event_id(record_event),
                      reply_at_enqueue=reply_at_enqueue,
                      stream=stream if isinstance(stream, int) else _STREAMS[stream],
                      max_blocks=max_blocks, copy_engine=copy_engine, path=_PATHS[path])

    def _data_op(self, fn: Callable[..., int], args: Any, sync: C.Sync, req: _Req) -> Future[OpResult]:
        if req.staged_cuda or (req.cuda and not sync.wait_event):
            # The daemon reads device operands on its own stream: without a
            # wait event (or after staging copies made here, which come
            # after any event the caller recorded), finish the caller's
            # stream first.
            torch = _need_torch()
            torch.cuda.current_stream().synchronize()
        out = C.OpResult()
        return self._submit(fn, (byref(args), byref(sync), byref(out)),
                            lambda: _op_result(out), (args, sync, out, req.keep), req)

    # -- data operations -------------------------------------------------
    def store_async(self, pool: PoolLike, layer: int, loc: Any, k: Any, v: Any = None, *,
                    src_stride: int = 0, wait_event: EventLike = None,
                    record_event: EventLike = None, reply_at_enqueue: bool = False,
                    stream: Optional[str] = None, max_blocks: int = 0) -> Future[OpResult]:
        """Like :meth:`store`, returning a :class:`Future` of its result."""
        req = _Req(self)
        try:
            a = C.KvStore(pool=_pool_id(pool), layer=layer, loc=req.indices(loc, "loc"),
                          k=req.data(k, "k"), v=req.data(v, "v"), src_stride=src_stride)
            sync = self._sync(wait_event, record_event, reply_at_enqueue, stream, max_blocks, False)
        except BaseException:
            req.cleanup()
            raise
        return self._data_op(self._lib.kvd_kv_store_submit, a, sync, req)

    @_sync_doc(_SYNC_DOC, _STREAM_DOC)
    def store(self, pool: PoolLike, layer: int, loc: Any, k: Any, v: Any = None, *,
              src_stride: int = 0, wait_event: EventLike = None, record_event: EventLike = None,
              reply_at_enqueue: bool = False, stream: Optional[str] = None,
              max_blocks: int = 0) -> OpResult:
        """Store per-token K (and V, for MHA pools) rows at slots loc of layer
        number layer of pool (a :class:`Pool` or its id).

        loc: int32/int64 indices (list, numpy, tensor; negative = padding).
        k, v: num_tokens rows of slot_bytes (src_stride apart): bytes, numpy
        arrays, CPU tensors (sent inline, or through a temporary buffer when
        large), arrays in registered buffers (by reference), CUDA tensors
        (by reference inside a registered device buffer, else staged).

        Blocks until the reply comes (within the client's timeout); ``store_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.store_async(pool, layer, loc, k, v, src_stride=src_stride,
                                            wait_event=wait_event, record_event=record_event,
                                            reply_at_enqueue=reply_at_enqueue, stream=stream,
                                            max_blocks=max_blocks))

    def fp8_set_async(self, pool: PoolLike, layer: int, loc: Any, k: Any, v: Any = None, *,
                      num_heads: Optional[int] = None, head_dim: Optional[int] = None,
                      src_dtype: Optional[str] = None, cache_dtype: str = "e4m3",
                      k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                      k_head_scales: Optional[Sequence[float]] = None,
                      v_head_scales: Optional[Sequence[float]] = None,
                      wait_event: EventLike = None, record_event: EventLike = None,
                      reply_at_enqueue: bool = False, stream: Optional[str] = None,
                      max_blocks: int = 0) -> Future[OpResult]:
        """Like :meth:`fp8_set`, returning a :class:`Future` of its result."""
        shape = tuple(getattr(k, "shape", ()))
        if num_heads is None or head_dim is None:
            if len(shape) != 3:
                raise ValueError("num_heads and head_dim are needed unless k is "
                                 "[num_tokens, num_heads, head_dim]")
            num_heads = shape[1] if num_heads is None else num_heads
            head_dim = shape[2] if head_dim is None else head_dim
        src = src_dtype or _dtype_name(k)
        if src not in _SRC_DTYPES:
            raise ValueError(f"src_dtype must be float32, float16 or bfloat16, not {src!r}")
        if cache_dtype not in _CACHE_DTYPES:
            raise ValueError(f"cache_dtype must be e4m3 or e5m2, not {cache_dtype!r}")
        if k_head_scales is not None or v_head_scales is not None:
            mode = C.FP8_SCALE_PER_HEAD
        elif k_scale is not None or v_scale is not None:
            mode = C.FP8_SCALE_TENSOR
        else:
            mode = C.FP8_SCALE_NONE
        khs = _floats(k_head_scales)
        vhs = _floats(v_head_scales)
        for name, hs in (("k_head_scales", khs), ("v_head_scales", vhs)):
            if hs is not None and len(hs) != num_heads:  # the C side reads num_heads
                raise ValueError(f"{name} has {len(hs)} values for {num_heads} heads")
        req = _Req(self)
        try:
            a = C.KvFp8Set(
                pool=_pool_id(pool), layer=layer, loc=req.indices(loc, "loc"),
                k=req.data(k, "k"), v=req.data(v, "v"),
                src_dtype=_SRC_DTYPES[src], cache_dtype=_CACHE_DTYPES[cache_dtype],
                num_heads=num_heads, head_dim=head_dim, scale_mode=mode,
                k_scale=1.0 if k_scale is None else k_scale,
                v_scale=1.0 if v_scale is None else v_scale,
                k_head_scales=khs, v_head_scales=vhs)
            req.keep += [khs, vhs]
            sync = self._sync(wait_event, record_event, reply_at_enqueue, stream, max_blocks, False)
        except BaseException:
            req.cleanup()
            raise
        return self._data_op(self._lib.kvd_kv_fp8_set_submit, a, sync, req)

    @_sync_doc(_SYNC_DOC, _STREAM_DOC)
    def fp8_set(self, pool: PoolLike, layer: int, loc: Any, k: Any, v: Any = None, *,
                num_heads: Optional[int] = None, head_dim: Optional[int] = None,
                src_dtype: Optional[str] = None, cache_dtype: str = "e4m3",
                k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                k_head_scales: Optional[Sequence[float]] = None,
                v_head_scales: Optional[Sequence[float]] = None, wait_event: EventLike = None,
                record_event: EventLike = None, reply_at_enqueue: bool = False,
                stream: Optional[str] = None, max_blocks: int = 0) -> OpResult:
        """Quantize k and v (MHA pools; [num_tokens, num_heads, head_dim] of
        float32, float16 or bfloat16) to FP8 (cache_dtype "e4m3" or "e5m2") into slots loc of
        layer number layer of pool, whose slot_bytes is num_heads * head_dim.  Scales: none, per tensor
        (k_scale, v_scale) or per head (k_head_scales, v_head_scales).
        num_heads, head_dim and src_dtype default from k's shape and dtype.

        Blocks until the reply comes (within the client's timeout); ``fp8_set_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.fp8_set_async(pool, layer, loc, k, v, num_heads=num_heads,
                                              head_dim=head_dim, src_dtype=src_dtype,
                                              cache_dtype=cache_dtype, k_scale=k_scale,
                                              v_scale=v_scale, k_head_scales=k_head_scales,
                                              v_head_scales=v_head_scales, wait_event=wait_event,
                                              record_event=record_event,
                                              reply_at_enqueue=reply_at_enqueue, stream=stream,
                                              max_blocks=max_blocks))

    def gather_async(self, req_to_page: Any, req_pool_indices: Any, seq_lens: Any, out: Any, *,
                     page_size: int = 1, dummy_slot: int = 0,
                     max_num_pages: Optional[int] = None, wait_event: EventLike = None,
                     record_event: EventLike = None, reply_at_enqueue: bool = False,
                     stream: Optional[str] = None, max_blocks: int = 0) -> Future[OpResult]:
        """Like :meth:`gather`, returning a :class:`Future` of its result."""
        req = _Req(self)
        try:
            tref, tshape, titem, tstride = req.bufref(req_to_page, "req_to_page")
            oref, oshape, oitem, ostride = req.bufref(out, "out")
            tdt = _dtype_name(req_to_page)
            if tdt not in ("int32", "int64") or _dtype_name(out) != tdt:
                raise ValueError("req_to_page and out must both be int32 or both int64")
            a = C.PageTableGather(
                req_to_page=tref, table_dtype=C.DTYPE_I32 if tdt == "int32" else C.DTYPE_I64,
                table_rows=tshape[0], table_cols=tshape[1], table_stride=tstride,
                req_pool_indices=req.indices(req_pool_indices, "req_pool_indices"),
                seq_lens=req.indices(seq_lens, "seq_lens"), out=oref, out_stride=ostride,
                max_num_pages=oshape[1] if max_num_pages is None else max_num_pages,
                page_size=page_size, dummy_slot=dummy_slot)
            sync = self._sync(wait_event, record_event, reply_at_enqueue, stream, max_blocks, False)
        except BaseException:
            req.cleanup()
            raise
        return self._data_op(self._lib.kvd_page_table_gather_submit, a, sync, req)

    @_sync_doc(_SYNC_DOC, _STREAM_DOC)
    def gather(self, req_to_page: Any, req_pool_indices: Any, seq_lens: Any, out: Any, *,
               page_size: int = 1, dummy_slot: int = 0, max_num_pages: Optional[int] = None,
               wait_event: EventLike = None, record_event: EventLike = None,
               reply_at_enqueue: bool = False, stream: Optional[str] = None,
               max_blocks: int = 0) -> OpResult:
        """Page-table gather with padding: for row r and column c,
        ``out[r, c] = req_to_page[req_pool_indices[r], c]`` while
        ``c < ceil(seq_lens[r] / page_size)``, else dummy_slot.

        req_to_page and out: 2-D int32/int64 arrays (same dtype) that lie in
        registered buffers (``Buffer.array()`` / ``Buffer.tensor()`` views).
        max_num_pages: the columns of out written (None: all of out's).

        Blocks until the reply comes (within the client's timeout); ``gather_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.gather_async(req_to_page, req_pool_indices, seq_lens, out,
                                             page_size=page_size, dummy_slot=dummy_slot,
                                             max_num_pages=max_num_pages, wait_event=wait_event,
                                             record_event=record_event,
                                             reply_at_enqueue=reply_at_enqueue, stream=stream,
                                             max_blocks=max_blocks))

    def transfer_async(self, src: PoolLike, dst: PoolLike, src_indices: Any, dst_indices: Any, *,
                       layer: Optional[int] = None, num_layers: int = 1,
                       wait_event: EventLike = None, record_event: EventLike = None,
                       reply_at_enqueue: bool = False, stream: Optional[str] = None,
                       max_blocks: int = 0, copy_engine: bool = False,
                       path: Optional[str] = None) -> Future[OpResult]:
        """Like :meth:`transfer`, returning a :class:`Future` of its result."""
        req = _Req(self)
        try:
            a = C.KvTransfer(src_pool=_pool_id(src), dst_pool=_pool_id(dst),
                             src=req.indices(src_indices, "src"),
                             dst=req.indices(dst_indices, "dst"),
                             all_layers=layer is None,
                             layer_begin=0 if layer is None else layer,
                             layer_count=0 if layer is None else num_layers)
            sync = self._sync(wait_event, record_event, reply_at_enqueue, stream, max_blocks,
                              copy_engine, path)
        except BaseException:
            req.cleanup()
            raise
        return self._data_op(self._lib.kvd_kv_transfer_submit, a, sync, req)

    @_sync_doc(_SYNC_DOC, _STREAM_DOC, _PATH_DOC, _COPY_ENGINE_DOC)
    def transfer(self, src: PoolLike, dst: PoolLike, src_indices: Any, dst_indices: Any, *,
                 layer: Optional[int] = None, num_layers: int = 1, wait_event: EventLike = None,
                 record_event: EventLike = None, reply_at_enqueue: bool = False,
                 stream: Optional[str] = None, max_blocks: int = 0, copy_engine: bool = False,
                 path: Optional[str] = None) -> OpResult:
        """Copy slots src_indices of pool src to slots dst_indices of pool dst
        (same slot_bytes, both MHA or both MLA): every layer (layer None, the
        default), or layers [layer, layer + num_layers).

        Blocks until the reply comes (within the client's timeout); ``transfer_async``
        is the same call returning a :class:`Future`."""
        return self._block(self.transfer_async(src, dst, src_indices, dst_indices, layer=layer,
                                               num_layers=num_layers, wait_event=wait_event,
                                               record_event=record_event,
                                               reply_at_enqueue=reply_at_enqueue, stream=stream,
                                               max_blocks=max_blocks, copy_engine=copy_engine,
                                               path=path))

    # -- the cache tier (kvdock._cache) ------------------------------------
    def create_cache_async(self, name: str, *, num_layers: int, tokens_per_block: int,
                           token_bytes: int, budget_bytes: int, mla: bool = False,
                           dtype: str = "", shared: bool = False,
                           allow_uids: Sequence[int] = (), allow_gids: Sequence[int] = (),
                           open_existing: bool = False, cluster: bool = False,
                           disk_budget: int = 0) -> Future[Cache]:
        return _cache.create_cache_async(self, name, num_layers=num_layers,
                                         tokens_per_block=tokens_per_block,
                                         token_bytes=token_bytes, budget_bytes=budget_bytes,
                                         mla=mla, dtype=dtype, shared=shared,
                                         allow_uids=allow_uids, allow_gids=allow_gids,
                                         open_existing=open_existing, cluster=cluster,
                                         disk_budget=disk_budget)

    def create_cache(self, name: str, *, num_layers: int, tokens_per_block: int,
                     token_bytes: int, budget_bytes: int, mla: bool = False, dtype: str = "",
                     shared: bool = False, allow_uids: Sequence[int] = (),
                     allow_gids: Sequence[int] = (), open_existing: bool = False,
                     cluster: bool = False, disk_budget: int = 0) -> Cache:
        """Make a cache named name of the cache tier: blocks of num_layers layers of
        tokens_per_block token rows of token_bytes, K and V (or one latent
        with mla), within budget_bytes of the daemon's host memory.  dtype
        is a label compared exactly (never interpreted).  shared: other
        users may use it (only allow_uids / allow_gids when given).
        open_existing: a cache of this name and layout is returned instead
        of EEXIST.  cluster: lookups and loads also reach the caches of
        this name and layout on the daemon's cluster peers.  disk_budget:
        bytes of blocks on disk at most (0: none), within the daemon's
        ``--disk-budget`` (ELIMIT past it); needs a daemon started with
        ``--cache-dir`` (else ENOTSUP).  Blocks then leave host memory for
        disk rather than being dropped, and the cache with its blocks comes
        back when the daemon restarts.

        Blocks until the reply comes (within the client's timeout);
        ``create_cache_async`` is the same call returning a :class:`Future`."""
        return self._block(self.create_cache_async(
            name, num_layers=num_layers, tokens_per_block=tokens_per_block,
            token_bytes=token_bytes, budget_bytes=budget_bytes, mla=mla, dtype=dtype,
            shared=shared, allow_uids=allow_uids, allow_gids=allow_gids,
            open_existing=open_existing, cluster=cluster, disk_budget=disk_budget))

    def cache(self, name: str) -> Cache:
        """A handle on a cache this client may use, by name (ENOENT if none)."""
        return _cache.cache_by_name(self, name)

    def caches_async(self, cap: int = 256) -> Future[List[CacheInfo]]:
        """The caches this client may see: the first cap of them."""
        return _cache.caches_async(self, cap)

    def caches(self, cap: int = 256) -> List[CacheInfo]:
        """The caches this client may see: the first cap of them."""
        return self._block(self.caches_async(cap))

    def drop_cache_async(self, cache: Union[Cache, int, str]) -> Future[None]:
        return _cache.drop_cache_async(self, cache)

    def drop_cache(self, cache: Union[Cache, int, str]) -> None:
        """Drop cache (a :class:`Cache`, an id or a name): owner or admin."""
        self._block(self.drop_cache_async(cache))

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed"
        return f"<kvdock.Client {self.socket_path} {self.info.backend} {state}>"


_complete_async_docs(Client)

"""The kvdock client: connection, futures, pools, buffers, events, data ops."""

from __future__ import annotations

import concurrent.futures
import ctypes
import operator
import os
import re
import threading
import weakref
from ctypes import byref, c_bool, c_size_t, c_uint8, c_uint64, c_void_p
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generator, Generic, Iterable, Iterator,
                    List, Optional, Sequence, Tuple, TypeVar, Union)

from . import _capi as C

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # pragma: no cover
    from ._cache import Cache, CacheInfo

try:  # numpy is optional: without it, bytes-like objects and tensors (no torch path uses it)
    import numpy as np
except Exception:  # pragma: no cover - ImportError where numpy is absent, or a broken install
    np = None  # type: ignore[assignment]


def _torch() -> Any:
    """torch if it imports, else None (imported on first use only)."""
    try:
        import torch  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return None
    return torch


def _is_tensor(obj: Any) -> bool:
    # Cheap test that does not import torch.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


# ---------------------------------------------------------------------------
# Errors


class Error(Exception):
    """A failed kvdock call.

    Attributes:
        code: the status code (kvdock/status.h; the daemon's reply status or a
            local code such as ECONN).
        name: the code's symbolic name, e.g. ``"EINVAL"``.
        message: what exactly went wrong: the daemon's message, or the
            client library's.
    """

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.name = C.STATUS_NAMES.get(self.code, f"E{self.code}")
        self.message = message or _strerror(self.code)
        super().__init__(f"{self.name}: {self.message}")

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_make_error, (self.code, self.message))


class Timeout(Error, TimeoutError):
    """ETIMEDOUT from a blocking call (also a builtin TimeoutError)."""


def _make_error(code: int, message: str) -> Error:
    return (Timeout if code == C.ETIMEDOUT else Error)(code, message)


def _strerror(code: int) -> str:
    try:
        return str(C.load().kvd_strerror(code).decode())
    except Exception:
        return "error"


def _check(st: int, cli: Any) -> None:
    if st != C.OK:
        msg = C.load().kvd_client_last_error(cli)
        raise _make_error(st, msg.decode("utf-8", "replace") if msg else "")


# ---------------------------------------------------------------------------
# Plain results


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int
    max_inflight: int
    max_pools: int
    max_pool_bytes: int
    max_total_pool_bytes: int
    max_inline_bytes: int


@dataclass(frozen=True)
class HelloInfo:
    """What the daemon said at hello."""

    protocol_version: int
    daemon_version: str
    backend: str  # "cpu" or "cuda"
    device_name: str
    device_ordinal: int
    limits: Limits
    client_id: int
    daemon_pid: int
    admin: bool


@dataclass(frozen=True)
class PoolInfo:
    """A pool as the daemon describes it (kvd_pool_info_t)."""

    id: int
    name: str
    kind: str  # "host", "device", "device-vmm"
    num_layers: int
    num_slots: int
    slot_bytes: int
    mla: bool
    page_size: int
    shared: bool
    imported: bool
    bytes: int
    layer_stride: int
    v_offset: int
    slot_stride: int
    owner: int
    orphaned: bool = False  # shared pool whose creator has gone: only an admin may drop it


@dataclass(frozen=True)
class OpResult:
    """What a data operation did."""

    rows: int
    skipped_oob: int
    bytes: int
    enqueued: bool
    path: str = "kernel"  # how a transfer's rows moved: "copy_engine" or "kernel"
    stored: int = 0   # cache saves: blocks stored,
    skipped: int = 0  # found there already,
    refused: int = 0  # or refused (every block held)


# how a transfer moves: Python's spelling and the daemon's and CLI's
_PATHS = {None: C.PATH_DEFAULT, "copy_engine": C.PATH_COPY_ENGINE,
          "copy-engine": C.PATH_COPY_ENGINE, "kernel": C.PATH_KERNEL}

# What every data operation's docstring says of its ordering arguments
# (appended by _sync_doc, so that help() shows them on each).
_SYNC_DOC = """\
        wait_event: an event the daemon waits on before it starts: an
            :class:`Event`, its id, or a ``torch.cuda.Event(interprocess=True)``
            (registered on first use); None: none.
        record_event: an event (the same kinds) the daemon records when the
            work is done; None: none.
        reply_at_enqueue: reply once the work and its events are enqueued on
            the device, not when it is done (order later work by record_event).
"""
_STREAM_DOC = """\
        stream: the stream class the work runs in: "reload", "write",
            "offload", "d2d", or None for the operation's own.
        max_blocks: thread-block budget of its kernel (0: the stream class's).
"""
_COPY_ENGINE_DOC = """\
        copy_engine: True is path="copy-engine".
"""
_PATH_DOC = """\
        path: how rows move between host and device memory: "copy-engine"
            (or "copy_engine"), "kernel", or None for the daemon's choice (the
            copy engines there, kernels elsewhere); the result's path says
            which ran.
"""


_BLOCKS_PARAGRAPH = re.compile(r"\n\s*Blocks until the reply comes.*?:class:`Future`\.", re.S)


def _sync_doc(*parts: str) -> Callable[[F], F]:
    """Append the shared argument descriptions to a method's docstring."""
    def deco(fn: F) -> F:
        doc = (fn.__doc__ or "").rstrip()
        extra = "\n\n        Ordering:\n" + "".join(parts).rstrip()
        m = _BLOCKS_PARAGRAPH.search(doc)  # before "Blocks until the reply ..."
        fn.__doc__ = doc[:m.start()] + extra + doc[m.start():] if m else doc + extra
        return fn
    return deco


def _complete_async_docs(cls: type) -> None:
    """Give each blocking method and its ``_async`` twin the same text: the
    twin of one that has it says what it takes and how it returns."""
    for name, fn in list(vars(cls).items()):
        if not name.endswith("_async") or not callable(fn):
            continue
        sync = vars(cls).get(name[: -len("_async")])
        if sync is None or not callable(sync):
            continue
        sdoc = (sync.__doc__ or "").strip()
        adoc = (fn.__doc__ or "").strip()
        blocks = ("\n\n        Blocks until the reply comes (within the client's timeout); "
                  f"``{name}`` is the same call returning a :class:`Future`.")
        tail = ("\n\n        Returns at once: a :class:`Future` of what "
                f":meth:`{sync.__name__}` returns.")
        if sdoc and (not adoc or adoc.startswith("Like :meth:")):
            fn.__doc__ = _BLOCKS_PARAGRAPH.sub("", sdoc) + tail
        elif adoc and not sdoc:
            sync.__doc__ = adoc + blocks

_PATH_NAMES = {C.PATH_COPY_ENGINE: "copy_engine", C.PATH_KERNEL: "kernel"}


def _kind_name(kind: int) -> str:
    return str(C.load().kvd_mem_kind_name(kind).decode())


_KINDS = {"host": C.MEM_HOST, "device": C.MEM_DEVICE, "device-vmm": C.MEM_DEVICE_VMM,
          "vmm": C.MEM_DEVICE_VMM}


def _kind_of(kind: Union[str, int]) -> int:
    if isinstance(kind, int):
        return kind
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, not {kind!r}") from None


def _pool_info(p: C.PoolInfo) -> PoolInfo:
    return PoolInfo(
        id=p.id, name=C.cstr(p.name), kind=_kind_name(p.kind), num_layers=p.num_layers,
        num_slots=p.num_slots, slot_bytes=p.slot_bytes, mla=bool(p.mla), page_size=p.page_size,
        shared=bool(p.shared), imported=bool(p.imported), bytes=p.bytes,
        layer_stride=p.layer_stride, v_offset=p.v_offset, slot_stride=p.slot_stride,
        owner=p.owner, orphaned=bool(p.orphaned))


def _op_result(r: C.OpResult) -> OpResult:
    return OpResult(rows=r.rows, skipped_oob=r.skipped_oob, bytes=r.bytes,
                    enqueued=bool(r.enqueued), path=_PATH_NAMES.get(r.path, "kernel"),
                    stored=r.stored, skipped=r.skipped, refused=r.refused)


def _struct_dict(s: ctypes.Structure) -> Dict[str, Any]:
    out = {}
    for name, _t in s._fields_:
        v = getattr(s, name)
        out[name] = C.cstr(v) if isinstance(v, bytes) else v
    return out


# ---------------------------------------------------------------------------
# Futures


class Future(Generic[T]):
    """The reply to a submitted request (concurrent.futures-style), of a
    value of type T.

    ``result(timeout)`` collects the reply (kvd_client_wait_timeout) and
    returns the operation's value or raises its :class:`Error`;
    ``concurrent.futures.TimeoutError`` when no reply came within timeout
    seconds (the request stays pending: ask again later).  Replies may be
    collected in any order.  A future dropped before it was collected
    abandons its request, so the library never writes to freed memory.
    """

    def __init__(self, client: "Client", req_id: int, finish: Callable[[], T],
                 keep: Tuple[Any, ...] = (), cleanup: Optional[Callable[[], None]] = None) -> None:
        self._client = client
        self._id = req_id
        self._finish = finish
        self._keep = keep  # output structures the library writes at wait
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._state = "pending"  # pending, done, abandoned
        self._value: Optional[T] = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["Future[T]"], None]] = []

    @property
    def request_id(self) -> int:
        """The request id the library chose."""
        return self._id

    def _collect(self, timeout: Optional[float]) -> bool:
        """Wait for the reply; False on timeout."""
        with self._lock:
            if self._state != "pending":
                return True
            cli = self._client._handle()
            ms = -1 if timeout is None else max(0, int(timeout * 1000))
            lib = C.load()
            st = lib.kvd_client_wait_timeout(cli, self._id, ms)
            msg = lib.kvd_client_last_error(cli) if st != C.OK else b""
            if st == C.ETIMEDOUT:
                # Our own deadline, or the daemon answering ETIMEDOUT?  A
                # request still pending is ours: it stays collectable.
                done = c_bool(False)
                if lib.kvd_client_poll(cli, self._id, byref(done)) == C.OK:
                    if not done.value:
                        return False
                    st = lib.kvd_client_wait_timeout(cli, self._id, 0)
                    msg = lib.kvd_client_last_error(cli) if st != C.OK else b""
            try:
                if st != C.OK:
                    raise _make_error(st, (msg or b"").decode("utf-8", "replace"))
                self._value = self._finish()
            except BaseException as e:  # noqa: BLE001 - kept for result()
                self._error = e
            self._state = "done"
            self._keep = ()
            self._release()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)
        return True

    def _release(self) -> None:
        if self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def result(self, timeout: Optional[float] = None) -> T:
        """The operation's value; raises its Error, or
        concurrent.futures.TimeoutError after timeout seconds."""
        if self._state == "abandoned":
            raise concurrent.futures.CancelledError()
        if not self._collect(timeout):
            raise concurrent.futures.TimeoutError(
                f"no reply to request {self._id} within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _collect with the state

    def __await__(self) -> Generator[Any, None, T]:
        """``await future`` in asyncio code: the result, waited for in the
        event loop's default executor (a thread), so that the loop (an
        engine's scheduler) keeps running meanwhile."""
        import asyncio

        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.result).__await__()

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The operation's error (None if it succeeded), waiting like result():
        up to timeout seconds (None: without end)."""
        if self._state == "abandoned":
            raise concurrent.futures.CancelledError()
        if not self._collect(timeout):
            raise concurrent.futures.TimeoutError(
                f"no reply to request {self._id} within {timeout} s")
        return self._error

    def done(self) -> bool:
        """Whether the reply has arrived (reads the socket without blocking)."""
        if self._state != "pending":
            return True
        done = c_bool(False)
        st = C.load().kvd_client_poll(self._client._handle(), self._id, byref(done))
        return st != C.OK or bool(done.value)

    def running(self) -> bool:
        """Whether the request is still in flight (not :meth:`done`)."""
        return not self.done()

    def cancelled(self) -> bool:
        """Whether the future was abandoned (:meth:`abandon`, :meth:`cancel`)."""
        return self._state == "abandoned"

    def cancel(self) -> bool:
        """A sent request cannot be cancelled: False (see abandon())."""
        return False

    def abandon(self) -> None:
        """Forget the request: its reply is discarded when it comes."""
        with self._lock:
            if self._state != "pending":
                return
            self._state = "abandoned"
            cli = self._client._handle_or_none()
            if cli:
                C.load().kvd_client_abandon(cli, self._id)
            # The daemon may still use operands staged for this request;
            # temporary buffers are dropped with a request queued after it.
            self._release()
            self._keep = ()

    def add_done_callback(self, fn: Callable[["Future[T]"], None]) -> None:
        """Call fn(future) once the reply has been collected (at once if it has)."""
        with self._lock:
            if self._state == "pending":
                self._callbacks.append(fn)
                return
        fn(self)

    def __del__(self) -> None:
        try:
            if self._state == "pending":
                self.abandon()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"<kvdock.Future request {self._id} {self._state}>"


def as_completed(futures: Iterable[Future[T]],
                 timeout: Optional[float] = None) -> Iterator[Future[T]]:
    """Yield futures as their replies arrive (like concurrent.futures.as_completed),
    waiting on the clients' sockets between polls; concurrent.futures.TimeoutError
    after timeout seconds."""
    import select
    import time

    pending = list(futures)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        still = []
        for f in pending:
            if f.done():
                f._collect(0)  # reply is here: collect it (results are kept)
                yield f
            else:
                still.append(f)
        pending = still
        if not pending:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise concurrent.futures.TimeoutError(f"{len(pending)} futures not done")
        fds = {f._client.fd for f in pending if f._client._handle_or_none()}
        # Another thread may read the replies for us: wake up now and then.
        select.select(list(fds), [], [], 0.05 if left is None else min(left, 0.05))


def wait_all(futures: Iterable[Future[T]], timeout: Optional[float] = None) -> List[T]:
    """Results of futures, in their order (raises the first error); each
    waited for up to timeout seconds (None: without end)."""
    return [f.result(timeout) for f in futures]


# ---------------------------------------------------------------------------
# Shared memory mapped here


class _MapHandle:
    """Owns one kvd_mapping_t; unmapped when the last view of it is gone."""

    def __init__(self, ptr: "ctypes._Pointer[C.Mapping]") -> None:
        self.ptr: Optional["ctypes._Pointer[C.Mapping]"] = ptr

    @property
    def m(self) -> C.Mapping:
        if self.ptr is None:
            raise ValueError("mapping is closed")
        return self.ptr.contents

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            try:
                C.load().kvd_mapping_destroy(byref(ptr))
            except Exception:  # noqa: BLE001
                pass


# Tensors over memory mapped here, without numpy: DLPack capsules.
#
# torch.as_tensor() of an object with __cuda_array_interface__ parses its
# typestr with numpy's C API, so it fails where numpy is not installed.  A
# DLPack capsule (the "dltensor" ABI every PyTorch release accepts) needs
# nothing but ctypes: the tensor wraps the pointer and calls our deleter
# when its storage is freed, which releases the owner (the mapping).


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DL_DELETER = ctypes.CFUNCTYPE(None, c_void_p)
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p),
                             ("deleter", _DL_DELETER)]

_DL_CPU, _DL_CUDA = 1, 2  # kDLCPU, kDLCUDA
_DL_UINT = 1  # kDLUInt
_DL_CAPSULE_NAME = b"dltensor"  # lives as long as the module (capsules keep a pointer)

# Address of each DLManagedTensor handed out -> what it keeps alive (the
# structure, its shape and strides, the owner of the memory).
# Plain dict operations, atomic under the GIL: no lock, since a deleter may
# run inside a garbage collection triggered anywhere, this module included.
_dl_live: Dict[int, Tuple[Any, ...]] = {}


def _dl_release(addr: Optional[int]) -> None:
    try:
        _dl_live.pop(addr or 0, None)
    except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


_dl_deleter = _DL_DELETER(_dl_release)  # kept for the life of the module

# Our own handle on the C API, so that the argtypes set here cannot clash
# with another library's use of ctypes.pythonapi.
_PyCapsule_New = ctypes.PyDLL(None).PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]


def _dlpack_bytes(ptr: int, shape: Sequence[int], strides: Sequence[int], cuda: bool,
                  device_id: int, owner: Any) -> Any:
    """A torch.uint8 tensor over ptr (shape, strides in bytes), on the CPU or
    on CUDA device device_id, keeping owner alive while the tensor lives;
    no copy and no numpy."""
    torch = _need_torch()
    n = len(shape)
    mt = _DLManagedTensor()
    shp = (ctypes.c_int64 * n)(*shape)
    std = (ctypes.c_int64 * n)(*strides)
    mt.dl_tensor.data = ptr or None
    mt.dl_tensor.device = _DLDevice(_DL_CUDA if cuda else _DL_CPU, device_id if cuda else 0)
    mt.dl_tensor.ndim = n
    mt.dl_tensor.dtype = _DLDataType(_DL_UINT, 8, 1)
    mt.dl_tensor.shape = shp
    mt.dl_tensor.strides = std
    mt.dl_tensor.byte_offset = 0
    mt.deleter = _dl_deleter
    addr = ctypes.addressof(mt)
    _dl_live[addr] = (mt, shp, std, owner)
    try:
        capsule = _PyCapsule_New(addr, _DL_CAPSULE_NAME, None)
        return torch.utils.dlpack.from_dlpack(capsule)
    except BaseException:
        # Not consumed, so nothing will call the deleter; or consumed and the
        # tensor already freed (a failure after the conversion), so it ran.
        # Either way no tensor holds the memory: releasing twice is harmless.
        _dl_release(addr)
        raise


class Mapping:
    """Shared memory mapped into this process: an exported pool, a
    registered buffer, or host memory made for an import.

    Host memory is seen as numpy arrays (``array()``, ``k()``, ``v()``) or
    CPU tensors (``tensor()``, ``k_tensor()``...) over the shared pages,
    device memory as CUDA tensors (through DLPack, so numpy is not needed),
    all without a copy.  The pages stay mapped while this object or any
    view made from it is alive; ``close()`` drops this object's hold.
    """

    def __init__(self, handle: _MapHandle, pool: Optional[PoolInfo] = None) -> None:
        self._h: Optional[_MapHandle] = handle
        m = handle.m
        self.base: int = m.base or 0
        self.bytes: int = m.bytes
        self.kind: str = _kind_name(m.kind)
        self.device_ordinal: int = m.device_ordinal
        self.fd: int = m.fd
        self.ipc_handle: bytes = bytes(m.ipc_handle)
        self.pool = pool
        self._cbuf: Any = None
        self._flat_tensor = None

    # -- plumbing --------------------------------------------------------
    def _handle(self) -> _MapHandle:
        if self._h is None:
            raise ValueError("mapping is closed")
        return self._h

    def close(self) -> None:
        """Drop this object's hold on the mapping (views keep it mapped)."""
        self._h = None
        self._cbuf = None
        self._flat_tensor = None

    def __enter__(self) -> "Mapping":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def is_host(self) -> bool:
        """Whether the memory is host memory (addressable from the CPU)."""
        return self.kind == "host"

    def _host_buffer(self) -> Any:
        """A ctypes array over the pages, holding the mapping alive."""
        if not self.is_host:
            raise ValueError(f"{self.kind} memory is not addressable from the CPU")
        if not self.base:
            raise ValueError("the memory is not mapped here (exported with map=False)")
        if self._cbuf is None:
            cbuf = (c_uint8 * self.bytes).from_address(self.base)
            cbuf._kvd_owner = self._handle()  # type: ignore[attr-defined]
            self._cbuf = cbuf
        return self._cbuf

    def memoryview(self) -> memoryview:
        """The host pages as a writable memoryview of bytes."""
        return memoryview(self._host_buffer()).cast("B")

    def contains(self, ptr: int, nbytes: int) -> bool:
        """Whether the nbytes at address ptr lie inside this mapping."""
        return bool(self.base) and self.base <= ptr and ptr + nbytes <= self.base + self.bytes

    # -- layers of a pool ------------------------------------------------
    def _layer_offset(self, layer: int, v: bool) -> int:
        p = self.pool
        if p is None:
            raise ValueError("not a pool mapping")
        if not 0 <= layer < p.num_layers:
            raise IndexError(f"layer {layer}: the pool has {p.num_layers}")
        if v and p.mla:
            raise ValueError("an MLA pool has no V (its latent is k())")
        return layer * p.layer_stride + (p.v_offset if v else 0)

    def _rows(self, itemsize: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        p = self.pool
        assert p is not None
        if p.slot_bytes % itemsize or p.slot_stride % itemsize:
            raise ValueError(f"slot_bytes {p.slot_bytes} / slot_stride {p.slot_stride} are not "
                             f"multiples of the element size {itemsize}")
        return (p.num_slots, p.slot_bytes // itemsize), (p.slot_stride, itemsize)

    # -- numpy -----------------------------------------------------------
    def array(self, dtype: Any = "uint8") -> "np.ndarray[Any, Any]":
        """The whole host mapping as a 1-D numpy array of dtype."""
        _need_numpy()
        dt = np.dtype(dtype)
        return np.frombuffer(self._host_buffer(), dtype=dt, count=self.bytes // dt.itemsize)

    def _np_layer(self, layer: int, v: bool, dtype: Any) -> "np.ndarray[Any, Any]":
        _need_numpy()
        dt = np.dtype(dtype)
        shape, strides = self._rows(dt.itemsize)
        return np.ndarray(shape, dtype=dt, buffer=self._host_buffer(),
                          offset=self._layer_offset(layer, v), strides=strides)

    def k(self, layer: int, dtype: Any = "uint8") -> "np.ndarray[Any, Any]":
        """Layer number layer's K (the latent for MLA) as numpy
        [num_slots, slot_bytes / itemsize] of dtype (a numpy dtype or its name)."""
        return self._np_layer(layer, False, dtype)

    def v(self, layer: int, dtype: Any = "uint8") -> "np.ndarray[Any, Any]":
        """Layer number layer's V as numpy [num_slots, slot_bytes / itemsize] of
        dtype (MHA pools)."""
        return self._np_layer(layer, True, dtype)

    def latent(self, layer: int, dtype: Any = "uint8") -> "np.ndarray[Any, Any]":
        """An MLA pool's layer number layer (its latent buffer) as numpy of dtype
        (the same as k())."""
        return self._np_layer(layer, False, dtype)

    # -- torch -----------------------------------------------------------
    def tensor(self, dtype: Any = None) -> Any:
        """The whole mapping as a 1-D torch tensor (CPU for host memory,
        CUDA for device memory) of dtype (torch.uint8 by default)."""
        torch = _need_torch()
        dtype = dtype or torch.uint8
        if self.is_host:
            flat = self._torch_flat()
            return flat.view(dtype) if dtype != torch.uint8 else flat
        return self._cuda_view(0, (self.bytes,), (1,), torch.uint8).view(dtype)

    def _torch_flat(self) -> Any:
        torch = _need_torch()
        if self._flat_tensor is None:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._flat_tensor = torch.frombuffer(self._host_buffer(), dtype=torch.uint8)
        return self._flat_tensor

    def _cuda_view(self, offset: int, shape: Tuple[int, ...], strides: Tuple[int, ...],
                   dtype: Any) -> Any:
        """A CUDA tensor of dtype over the device memory at offset (shape and
        strides in elements, the last stride 1), through DLPack (no numpy)."""
        if not self.base:
            raise ValueError("the memory is not mapped here (exported with map=False)")
        torch = _need_torch()
        item = _elsize(dtype)
        # IPC handles are opened on this process's current device (as are
        # the tensors made here), which need not be the daemon's ordinal.
        u8 = _dlpack_bytes(self.base + offset, tuple(shape[:-1]) + (shape[-1] * item,),
                           tuple(s * item for s in strides[:-1]) + (1,), True,
                           torch.cuda.current_device(), self._handle())
        return u8 if dtype == torch.uint8 else u8.view(dtype)

    def _torch_layer(self, layer: int, v: bool, dtype: Any) -> Any:
        torch = _need_torch()
        dtype = dtype or torch.uint8
        item = _elsize(dtype)
        (n, w), (ss, _) = self._rows(item)
        off = self._layer_offset(layer, v)
        if self.is_host:
            flat = self._torch_flat()
            p = self.pool
            assert p is not None
            u8 = flat.as_strided((n, p.slot_bytes), (p.slot_stride, 1), off)
            return u8.view(dtype) if dtype != torch.uint8 else u8
        return self._cuda_view(off, (n, w), (ss // item, 1), dtype)

    def k_tensor(self, layer: int, dtype: Any = None) -> Any:
        """Layer number layer's K (MLA: latent) as a tensor of dtype (a torch
        dtype; None: torch.uint8) [num_slots, slot_bytes / itemsize]: CPU over
        the shared pages for host pools, CUDA for device pools."""
        return self._torch_layer(layer, False, dtype)

    def v_tensor(self, layer: int, dtype: Any = None) -> Any:
        """Layer number layer's V as a tensor of dtype (see k_tensor)."""
        return self._torch_layer(layer, True, dtype)

    def __repr__(self) -> str:
        return f"<kvdock.Mapping {self.kind} {self.bytes} bytes at {self.base:#x}>"


# Host memory made by this process for imports: address -> its region.
_host_memories: "weakref.WeakValueDictionary[int, HostMemory]" = weakref.WeakValueDictionary()


class HostMemory(Mapping):
    """New shared host memory (a sealed memfd mapped here) whose pages can
    become an imported pool: make numpy/tensor views of it as per-layer
    K/V and pass them to :meth:`Client.import_pool`."""

    def __init__(self, nbytes: int) -> None:
        out = ctypes.POINTER(C.Mapping)()
        _check(C.load().kvd_mapping_create_host(nbytes, byref(out)), None)
        super().__init__(_MapHandle(out))
        _host_memories[self.base] = self

    def region(self) -> C.ImportRegion:
        """The memory as an import region (client.h's kvd_import_region_t)."""
        reg = C.ImportRegion()
        _check(C.load().kvd_import_region_from_mapping(self._handle().ptr, byref(reg)), None)
        return reg


def _host_memory_of(ptr: int, nbytes: int) -> Optional[HostMemory]:
    for hm in list(_host_memories.values()):
        if hm.contains(ptr, nbytes):
            return hm
    return None


# ---------------------------------------------------------------------------
# Handles of daemon objects


class Pool:
    """A pool in the daemon (created, imported or found by name)."""

    def __init__(self, client: "Client", info: PoolInfo, keep: Tuple[Any, ...] = ()) -> None:
        self.client = client
        self.info = info
        self._keep = keep  # an imported pool's memory (tensors, HostMemory)
        self._map: Optional[Mapping] = None

    @property
    def id(self) -> int:
        """The pool's id in the daemon."""
        return self.info.id

    @property
    def name(self) -> str:
        """The pool's name."""
        return self.info.name

    def map(self) -> Mapping:
        """The pool mapped here (exported once, then cached)."""
        if self._map is None:
            self._map = self.client.export_pool(self)
        return self._map

    def drop(self) -> None:
        """Drop the pool from the daemon."""
        self.client.drop_pool(self)
        if self._map is not None:
            self._map.close()
            self._map = None
        self._keep = ()

    def __repr__(self) -> str:
        i = self.info
        return (f"<kvdock.Pool {i.name!r} id {i.id} {i.kind} {i.num_layers}x{i.num_slots}x"
                f"{i.slot_bytes}{' mla' if i.mla else ''}>")


class Buffer:
    """A registered buffer: operands, index arrays, page tables.

    Arrays and tensors that lie inside a buffer's mapping (views made with
    ``array()``/``tensor()``) go to the daemon by reference, without a
    copy; so do ``ref(offset, nbytes)`` slices.
    """

    def __init__(self, client: "Client", buf_id: int, nbytes: int, kind: str,
                 mapping: Optional[Mapping]) -> None:
        self.client = client
        self.id = buf_id
        self.bytes = nbytes
        self.kind = kind
        self.mapping = mapping

    def array(self, dtype: Any = "uint8", shape: Optional[Sequence[int]] = None,
              offset: int = 0) -> "np.ndarray[Any, Any]":
        """A numpy view of a host buffer (dtype, optional shape, byte offset)."""
        m = self._mapped()
        a = m.array("uint8")[offset:]
        dt = np.dtype(dtype)
        if shape is None:
            n = len(a) // dt.itemsize
            return a[: n * dt.itemsize].view(dt)
        count = 1
        for s in shape:
            count *= int(s)
        return a[: count * dt.itemsize].view(dt).reshape(tuple(shape))

    def tensor(self, dtype: Any = None, shape: Optional[Sequence[int]] = None,
               offset: int = 0) -> Any:
        """A tensor view of dtype (None: torch.uint8) from byte offset, shaped
        shape (None: 1-D, as many elements as fit): CPU for host buffers,
        CUDA for device buffers."""
        torch = _need_torch()
        dtype = dtype or torch.uint8
        item = _elsize(dtype)
        m = self._mapped()
        flat = m.tensor(torch.uint8)[offset:]
        if shape is None:
            n = flat.numel() // item
            return flat[: n * item].view(dtype)
        count = 1
        for s in shape:
            count *= int(s)
        return flat[: count * item].view(dtype).reshape(tuple(shape))

    def ref(self, offset: int = 0, nbytes: Optional[int] = None) -> "BufRef":
        """The nbytes (None: to the end) from byte offset of this buffer, to
        pass as an operand."""
        return BufRef(self, offset, self.bytes - offset if nbytes is None else nbytes)

    def indices(self, count: int, dtype: str = "int64", offset: int = 0) -> "BufIndices":
        """count indices of dtype (int32/int64) at offset, to pass as indices."""
        return BufIndices(self, offset, count, dtype)

    def _mapped(self) -> Mapping:
        if self.mapping is None:
            raise ValueError("this buffer is not mapped here")
        return self.mapping

    def wait_value(self, offset: int, value: int, stream: Any = None) -> None:
        """Make a CUDA stream (default: torch's current one) wait until the
        uint32 at offset of this device buffer is >= value: a cache load's
        layer flag.  The wait may be queued before the daemon writes."""
        m = self._mapped()
        if m.is_host:
            raise ValueError("a stream waits on flags in a device buffer; poll a host one "
                             "(array('uint32'))")
        if not 0 <= offset <= self.bytes - 4:
            raise IndexError(f"offset {offset} is not inside the buffer's {self.bytes} bytes")
        if stream is None:
            stream = _need_torch().cuda.current_stream()
        handle = getattr(stream, "cuda_stream", stream)
        _check(C.load().kvd_stream_wait_value32(c_void_p(handle), c_void_p(m.base + offset),
                                                value), None)

    def drop(self) -> None:
        """Drop the buffer from the daemon (and unmap it here)."""
        self.client.drop_buffer(self)

    def __repr__(self) -> str:
        return f"<kvdock.Buffer id {self.id} {self.kind} {self.bytes} bytes>"


@dataclass(frozen=True)
class BufRef:
    """A byte range of a registered buffer."""

    buffer: Buffer
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BufIndices:
    """An index array held in a registered buffer."""

    buffer: Buffer
    offset: int
    count: int
    dtype: str = "int64"


class Event:
    """An interprocess CUDA event registered with the daemon."""

    def __init__(self, client: "Client", event_id: int, source: Any = None) -> None:
        self.client = client
        self.id = event_id
        self.source = source  # the torch.cuda.Event, kept alive

    def drop(self) -> None:
        """Drop the event's registration from the daemon."""
        self.client.drop_event(self)

    def __repr__(self) -> str:
        return f"<kvdock.Event id {self.id}>"


# ---------------------------------------------------------------------------
# Helpers


def _need_numpy() -> Any:
    if np is None:
        raise ImportError("numpy is needed for array views (apt-get install python3-numpy); "
                          "with PyTorch, the tensor views (tensor(), k_tensor(), v_tensor(), "
                          "Buffer.tensor()) need no numpy")
    return np


def _need_torch() -> Any:
    torch = _torch()
    if torch is None:
        raise ImportError("PyTorch is needed for tensor views")
    return torch


def _elsize(torch_dtype: Any) -> int:
    return int(_need_torch().empty((), dtype=torch_dtype).element_size())


_SRC_DTYPES = {"float32": C.DTYPE_F32, "f32": C.DTYPE_F32, "float16": C.DTYPE_F16,
               "f16": C.DTYPE_F16, "half": C.DTYPE_F16, "bfloat16": C.DTYPE_BF16,
               "bf16": C.DTYPE_BF16}
_CACHE_DTYPES = {"e4m3": C.DTYPE_E4M3, "float8_e4m3fn": C.DTYPE_E4M3, "e5m2": C.DTYPE_E5M2,
                 "float8_e5m2": C.DTYPE_E5M2}
_STREAMS = {None: C.STREAM_DEFAULT, "default": C.STREAM_DEFAULT, "reload": C.STREAM_RELOAD,
            "write": C.STREAM_WRITE, "offload": C.STREAM_OFFLOAD, "d2d": C.STREAM_D2D}


def _dtype_name(obj: Any) -> Optional[str]:
    dt = getattr(obj, "dtype", None)
    if dt is None:
        return None
    s = str(dt)
    return s[6:] if s.startswith("torch.") else s


def _host_ptr(obj: Any) -> Tuple[int, int, Any]:
    """(address, nbytes, keep) of a C-contiguous host object, copying if needed.

    bytes-like objects (bytes, bytearray, memoryview, array.array, ctypes
    arrays, mmap: anything with the buffer protocol) and CPU tensors need
    no numpy; other sequences go through numpy.asarray where it imports."""
    if _is_tensor(obj):
        if obj.is_cuda:
            raise TypeError("a CUDA tensor is not host memory")
        t = obj if obj.is_contiguous() else obj.contiguous()
        return t.data_ptr(), t.numel() * t.element_size(), t
    if np is not None and isinstance(obj, np.ndarray):
        return _array_ptr(np.ascontiguousarray(obj), obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    if mv is not None:
        if not mv.contiguous:
            mv = memoryview(mv.tobytes())
        if mv.format != "B" or mv.ndim != 1:
            try:
                mv = mv.cast("B")
            except TypeError:  # a format cast() refuses (ctypes structures...)
                mv = memoryview(mv.tobytes())
        if mv.nbytes == 0:
            return 0, 0, mv
        if mv.readonly:
            cb = ctypes.c_char_p(mv.tobytes())  # bytes: read-only buffer, keep a pointer to it
            return ctypes.cast(cb, c_void_p).value or 0, mv.nbytes, cb
        cbuf = (c_uint8 * mv.nbytes).from_buffer(mv)
        return ctypes.addressof(cbuf), mv.nbytes, cbuf
    if np is not None:
        return _array_ptr(np.ascontiguousarray(obj), obj)
    raise TypeError(f"cannot use {type(obj).__name__} as operand bytes (bytes-like objects, "
                    "tensors and, with numpy, arrays)")


def _array_ptr(a: "np.ndarray[Any, Any]", obj: Any) -> Tuple[int, int, Any]:
    # An object array holds pointers to Python objects, not data: numpy
    # makes one of anything (np.asarray(object())), so refuse it here.
    if a.dtype.hasobject:
        raise TypeError(f"cannot use {type(obj).__name__} as operand bytes (its array has "
                        "dtype object)")
    return a.__array_interface__["data"][0], a.nbytes, a


class _Req:
    """Per-request state: operands kept alive, temporary buffers to drop."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self.keep: List[Any] = []
        self.temps: List[Buffer] = []
        self.cuda = False
        self.staged_cuda = False

    # -- staging -------------------------------------------------------
    def _temp(self, nbytes: int, device: bool) -> Buffer:
        b = self.client.register_buffer(max(nbytes, 1), device=device, name="kvdock-py-staging")
        self.temps.append(b)
        return b

    def _stage_host(self, ptr: int, nbytes: int) -> Tuple[int, int]:
        b = self._temp(nbytes, device=False)
        ctypes.memmove(b._mapped().base, ptr, nbytes)
        return b.id, 0

    def _stage_cuda(self, t: Any) -> Tuple[int, int]:
        self.staged_cuda = True
        b = self._temp(t.numel() * t.element_size(), device=True)
        dst = b.tensor(t.dtype, tuple(t.shape))
        dst.copy_(t)
        return b.id, 0

    def _in_buffer(self, ptr: int, nbytes: int) -> Optional[Tuple[int, int]]:
        b = self.client._buffer_at(ptr, nbytes)
        if b is None:
            return None
        return b.id, ptr - b._mapped().base

    def cleanup(self) -> None:
        temps, self.temps = self.temps, []
        for b in temps:
            self.client._drop_quietly(b)
        self.keep = []

    # -- operands --------------------------------------------------------
    def data(self, obj: Any, what: str) -> C.Data:
        d = C.Data()
        if obj is None:
            return d
        if isinstance(obj, Buffer):
            obj = obj.ref()
        if isinstance(obj, BufRef):
            d.buffer, d.offset, d.bytes = obj.buffer.id, obj.offset, obj.nbytes
            return d
        if _is_tensor(obj) and obj.is_cuda:
            self.cuda = True
            t = obj if obj.is_contiguous() else obj.contiguous()
            self.keep.append(t)
            n = t.numel() * t.element_size()
            at = self._in_buffer(t.data_ptr(), n)
            d.buffer, d.offset = at if at is not None else self._stage_cuda(t)
            d.bytes = n
            return d
        ptr, n, keep = _host_ptr(obj)
        self.keep.append(keep)
        at = self._in_buffer(ptr, n) if n else None
        if at is not None:
            d.buffer, d.offset = at
        elif n > self.client.max_inline_bytes:
            d.buffer, d.offset = self._stage_host(ptr, n)
        else:
            d.data = ptr
        d.bytes = n
        return d

    def indices(self, obj: Any, what: str) -> C.Indices:
        ix = C.Indices()
        if obj is None:
            return ix
        if isinstance(obj, BufIndices):
            ix.buffer, ix.offset, ix.count = obj.buffer.id, obj.offset, obj.count
            ix.dtype = C.DTYPE_I32 if obj.dtype in ("int32", "i32") else C.DTYPE_I64
            return ix
        if _is_tensor(obj):
            torch = _need_torch()
            if obj.dtype not in (torch.int32, torch.int64):
                obj = obj.to(torch.int64)
            t = obj.reshape(-1)
            t = t if t.is_contiguous() else t.contiguous()
            ix.count = t.numel()
            ix.dtype = C.DTYPE_I32 if t.dtype == torch.int32 else C.DTYPE_I64
            n = t.numel() * t.element_size()
            self.keep.append(t)
            if t.is_cuda:
                self.cuda = True
                at = self._in_buffer(t.data_ptr(), n)
                ix.buffer, ix.offset = at if at is not None else self._stage_cuda(t)
                return ix
            ptr = t.data_ptr()
        else:
            if np is not None:
                a = np.asarray(obj)
                if a.dtype not in (np.int32, np.int64):
                    if a.size and a.dtype.kind not in "iu":
                        raise TypeError(f"{what}: indices must be integers, not {a.dtype}")
                    a = a.astype(np.int64)
                a = np.ascontiguousarray(a.reshape(-1))
                ix.count = a.size
                ix.dtype = C.DTYPE_I32 if a.dtype == np.int32 else C.DTYPE_I64
                n = a.nbytes
                ptr = a.__array_interface__["data"][0]
                self.keep.append(a)
            else:
                try:  # integers only, as numpy's path checks (no float truncated)
                    vals = [operator.index(x) for x in obj]
                except TypeError:
                    raise TypeError(f"{what}: indices must be a sequence of integers, not "
                                    f"{type(obj).__name__}") from None
                arr = (ctypes.c_int64 * len(vals))(*vals)
                ix.count, ix.dtype, n = len(vals), C.DTYPE_I64, 8 * len(vals)
                ptr = ctypes.addressof(arr)
                self.keep.append(arr)
        if ix.count == 0:
            ix.values = ptr or None
            return ix
        at = self._in_buffer(ptr, n)
        if at is not None:
            ix.buffer, ix.offset = at
        elif n > self.client.max_inline_bytes:  # sent as raw bytes: n of them
            ix.buffer, ix.offset = self._stage_host(ptr, n)
        else:
            ix.values = ptr
        return ix

    def bufref(self, obj: Any, what: str) -> Tuple[C.BufRef, Tuple[int, ...], int, Optional[int]]:
        """An array that must live in a registered buffer: (ref, shape, itemsize, row stride)."""
        r = C.BufRef()
        if isinstance(obj, Buffer):
            obj = obj.ref()
        if isinstance(obj, BufRef):
            r.buffer, r.offset, r.bytes = obj.buffer.id, obj.offset, obj.nbytes
            return r, (), 0, None
        if _is_tensor(obj):
            if obj.is_cuda:
                self.cuda = True
            shape, item = tuple(obj.shape), obj.element_size()
            strides = tuple(s * item for s in obj.stride())
            ptr = obj.data_ptr()
        elif np is not None and isinstance(obj, np.ndarray):
            shape, item, strides = obj.shape, obj.itemsize, obj.strides
            ptr = obj.__array_interface__["data"][0]
        else:
            raise TypeError(f"{what}: an array or tensor in a registered buffer, or a BufRef")
        if len(shape) != 2 or strides[1] != item:
            raise ValueError(f"{what}: a 2-D array with contiguous rows is needed")
        nbytes = (shape[0] - 1) * strides[0] + shape[1] * item if shape[0] else 0
        at = self._in_buffer(ptr, max(nbytes, 1))
        if at is None:
            raise ValueError(f"{what} must lie in a buffer registered with this client "
                             "(Client.register_buffer(...).array()/.tensor())")
        r.buffer, r.offset, r.bytes = at[0], at[1], nbytes
        self.keep.append(obj)
        return r, shape, item, strides[0]


# ---------------------------------------------------------------------------
# The client


PoolLike = Union[Pool, int, PoolInfo]
EventLike = Union[Event, int, Any, None]


def _pool_id(p: PoolLike) -> int:
    if isinstance(p, (Pool, PoolInfo)):
        return p.id
    if isinstance(p, int):
        return p
    raise TypeError(f"a Pool or a pool id, not {type(p).__name__}")


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
        max_clients of them)."""
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
                           open_existing: bool = False, cluster: bool = False
                           ) -> Future["Cache"]:
        from ._cache import create_cache_async
        return create_cache_async(self, name, num_layers=num_layers,
                                  tokens_per_block=tokens_per_block, token_bytes=token_bytes,
                                  budget_bytes=budget_bytes, mla=mla, dtype=dtype, shared=shared,
                                  allow_uids=allow_uids, allow_gids=allow_gids,
                                  open_existing=open_existing, cluster=cluster)

    def create_cache(self, name: str, *, num_layers: int, tokens_per_block: int,
                     token_bytes: int, budget_bytes: int, mla: bool = False, dtype: str = "",
                     shared: bool = False, allow_uids: Sequence[int] = (),
                     allow_gids: Sequence[int] = (), open_existing: bool = False,
                     cluster: bool = False) -> "Cache":
        """Make a cache named name of the cache tier: blocks of num_layers layers of
        tokens_per_block token rows of token_bytes, K and V (or one latent
        with mla), within budget_bytes of the daemon's host memory.  dtype
        is a label compared exactly (never interpreted).  shared: other
        users may use it (only allow_uids / allow_gids when given).
        open_existing: a cache of this name and layout is returned instead
        of EEXIST.  cluster: lookups and loads also reach the caches of
        this name and layout on the daemon's cluster peers.

        Blocks until the reply comes (within the client's timeout);
        ``create_cache_async`` is the same call returning a :class:`Future`."""
        return self._block(self.create_cache_async(
            name, num_layers=num_layers, tokens_per_block=tokens_per_block,
            token_bytes=token_bytes, budget_bytes=budget_bytes, mla=mla, dtype=dtype,
            shared=shared, allow_uids=allow_uids, allow_gids=allow_gids,
            open_existing=open_existing, cluster=cluster))

    def cache(self, name: str) -> "Cache":
        """A handle on a cache this client may use, by name (ENOENT if none)."""
        from ._cache import cache_by_name
        return cache_by_name(self, name)

    def caches_async(self, cap: int = 256) -> Future[List["CacheInfo"]]:
        """The caches this client may see: the first cap of them."""
        from ._cache import caches_async
        return caches_async(self, cap)

    def caches(self, cap: int = 256) -> List["CacheInfo"]:
        """The caches this client may see: the first cap of them."""
        return self._block(self.caches_async(cap))

    def drop_cache_async(self, cache: Union["Cache", int, str]) -> Future[None]:
        from ._cache import drop_cache_async
        return drop_cache_async(self, cache)

    def drop_cache(self, cache: Union["Cache", int, str]) -> None:
        """Drop cache (a :class:`Cache`, an id or a name): owner or admin."""
        self._block(self.drop_cache_async(cache))

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed"
        return f"<kvdock.Client {self.socket_path} {self.info.backend} {state}>"


_complete_async_docs(Client)


def _floats(vals: Any) -> Any:
    if vals is None:
        return None
    if _is_tensor(vals):
        vals = vals.detach().cpu().tolist()
    vals = [float(x) for x in vals]
    return (ctypes.c_float * len(vals))(*vals)


def _event_handle(event: Any) -> bytes:
    if isinstance(event, (bytes, bytearray)):
        h = bytes(event)
    elif hasattr(event, "ipc_handle"):
        h = bytes(event.ipc_handle())
    else:
        raise TypeError("an interprocess event: torch.cuda.Event(interprocess=True) or its "
                        "64-byte ipc_handle()")
    if len(h) != C.IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC event handle is {C.IPC_HANDLE_BYTES} bytes, not {len(h)}")
    return h


def _layer_geometry(t: Any) -> Tuple[int, Tuple[int, ...], int, int, bool]:
    """(address, shape, itemsize, row stride in bytes, on CUDA) of a layer array."""
    if _is_tensor(t):
        shape, item = tuple(t.shape), t.element_size()
        strides = [s * item for s in t.stride()]
        ptr, cuda = t.data_ptr(), bool(t.is_cuda)
    elif np is not None and isinstance(t, np.ndarray):
        shape, item, strides = t.shape, t.itemsize, list(t.strides)
        ptr, cuda = t.__array_interface__["data"][0], False
    else:
        raise TypeError(f"a layer must be a tensor or a numpy array, not {type(t).__name__}")
    if len(shape) < 1 or shape[0] < 1:
        raise ValueError("a layer needs at least one slot")
    # Rows must be contiguous: the dimensions after the first are packed.
    expect = item
    for dim in range(len(shape) - 1, 0, -1):
        if shape[dim] != 1 and strides[dim] != expect:
            raise ValueError("a layer's rows must be contiguous (only dim 0 may be strided)")
        expect *= shape[dim]
    stride0 = strides[0] if shape[0] > 1 else expect
    return ptr, tuple(shape), item, stride0, cuda

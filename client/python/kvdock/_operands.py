"""A request's operands: host bytes, tensors, index arrays and buffer references."""

from __future__ import annotations

import ctypes
import operator
from ctypes import c_uint8, c_void_p
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from . import _capi as C
from ._buffers import BufIndices, BufRef, Buffer
from ._util import _is_tensor, _need_torch, np

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


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


def _floats(vals: Any) -> Any:
    if vals is None:
        return None
    if _is_tensor(vals):
        vals = vals.detach().cpu().tolist()
    vals = [float(x) for x in vals]
    return (ctypes.c_float * len(vals))(*vals)


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

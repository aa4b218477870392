"""Registered buffers: operands and layer flags passed by reference."""

from __future__ import annotations

from ctypes import c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _capi as C
from ._errors import _check
from ._mapping import Mapping
from ._util import _elsize, _need_torch, np

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


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

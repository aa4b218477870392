"""Memory mapped into this process: exported pools' layers and shared host memory."""

from __future__ import annotations

import ctypes
import weakref
from ctypes import byref, c_uint8
from typing import Any, Optional, Tuple

from . import _capi as C
from ._dlpack import _dlpack_bytes
from ._errors import _check
from ._results import PoolInfo, _kind_name
from ._util import _elsize, _need_numpy, _need_torch, np


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

"""DLPack capsules: pool and buffer memory as torch tensors without a copy."""

from __future__ import annotations

import ctypes
from ctypes import c_uint64, c_void_p
from typing import Any, Dict, Optional, Sequence, Tuple

from ._util import _need_torch


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

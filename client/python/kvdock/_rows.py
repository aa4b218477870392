"""Rows copied in this process, by kvdock's kernel library.

The daemon moves host-device traffic on the copy engines, which leave
every multiprocessor to the forward pass but issue each row as one copy:
rows of a few KiB scattered one by one run at the copy engines' descriptor
rate, far below their bandwidth.  A kernel moves them at
full speed, but a kernel of the daemon's process time-slices the GPU
against the worker's, whatever its block budget.  In the worker's own
process the budget does hold: a gather of scattered rows into a
contiguous staging area on a low-priority stream within a few thread
blocks shares the multiprocessors with the forward pass for real.  The
staging area, imported as a pool, is then moved by the daemon on the copy
engines in large contiguous chunks.  :func:`copy_rows` is that gather
(and the scatter back after a reload).

libkvdock_kernels is found as libkvdock is: $KVDOCK_KERNELS_LIB (when set,
the only choice), a copy next to the package (the wheel carries one), the
system's library path, then the repository's build tree.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_int32, c_int64, c_uint32, c_void_p
from typing import Any, List, Optional, Tuple

from . import _capi as C
from ._errors import Error
from ._operands import _layer_geometry
from ._util import _is_tensor, _need_torch

KERNELS_ABI_VERSION = 1


class _KvSide(ctypes.Structure):
    _fields_ = [
        ("k", c_void_p),
        ("v", c_void_p),
        ("k_layers", c_void_p),
        ("v_layers", c_void_p),
        ("layer_stride", c_int64),
        ("slot_stride", c_int64),
        ("num_slots", c_int64),
    ]


class _TransferArgs(ctypes.Structure):
    _fields_ = [
        ("src", _KvSide),
        ("dst", _KvSide),
        ("num_layers", c_int64),
        ("src_idx", c_void_p),
        ("dst_idx", c_void_p),
        ("idx_dtype", c_int32),
        ("count", c_int64),
        ("row_bytes", c_int64),
        ("oob_count", c_void_p),
    ]


class _Launch(ctypes.Structure):
    _fields_ = [
        ("stream", c_void_p),
        ("max_blocks", c_uint32),
        ("flags", c_uint32),
    ]


_LAUNCH_COPY_ENGINE = 1
_LAUNCH_TABLES_ONE_ALLOCATION = 4


def _one_storage(tensors: List[Any]) -> bool:
    """Whether the tensors are views of one storage (one allocation): a
    2D copy over their layers may then span them."""
    ptrs = set()
    for t in tensors:
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        ptrs.add(int(s.data_ptr()))
    return len(ptrs) <= 1

_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def _candidates() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    out = []
    env = os.environ.get("KVDOCK_KERNELS_LIB")
    if env:
        out.append(env)
    out.append(os.path.join(here, f"libkvdock_kernels.so.{KERNELS_ABI_VERSION}"))
    found = ctypes.util.find_library("kvdock_kernels")
    if found:
        out.append(found)
    for build in ("build", "build-cpu", "build-gpu"):
        out.append(os.path.join(repo, build, "kernels",
                                f"libkvdock_kernels.so.{KERNELS_ABI_VERSION}"))
    return out


def kernels_library() -> ctypes.CDLL:
    """libkvdock_kernels, loaded once (OSError, saying where it looked, if
    none loads)."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("KVDOCK_KERNELS_LIB")
        for cand in _candidates():
            why = None
            if os.sep in cand and not os.path.exists(cand):
                why = "absent"
            else:
                try:
                    lib = ctypes.CDLL(cand)
                    abi = lib.kvd_kernels_abi_version
                except (OSError, AttributeError) as e:
                    why = str(e)
                else:
                    abi.restype, abi.argtypes = c_int, []
                    if abi() != KERNELS_ABI_VERSION:
                        why = f"kernels ABI {abi()}, not {KERNELS_ABI_VERSION}"
            if why is not None:
                # a library named by $KVDOCK_KERNELS_LIB is the only choice
                if env and cand == env:
                    raise OSError(f"KVDOCK_KERNELS_LIB={env} cannot be used: {why}")
                tried.append(f"{cand} ({why})")
                continue
            for name in ("kvd_cuda_kv_transfer", "kvd_cpu_kv_transfer"):
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = c_int, [POINTER(_TransferArgs), POINTER(_Launch)]
            lib.kvd_last_error_detail.restype, lib.kvd_last_error_detail.argtypes = c_char_p, []
            _lib = lib
            return lib
        raise OSError("libkvdock_kernels.so not found; set KVDOCK_KERNELS_LIB to its path. "
                      "Tried: " + "; ".join(tried))


def _layers(side: Any, what: str) -> List[Any]:
    if side is None:
        return []
    if _is_tensor(side) or hasattr(side, "__array_interface__"):
        return [side]
    layers = list(side)
    if not layers:
        raise ValueError(f"{what}: no layers")
    return layers


def _geometry(layers: List[Any], what: str) -> Tuple[List[int], int, int, int, bool]:
    """(addresses, rows, row bytes, row stride, on CUDA) shared by every layer."""
    addrs, shape0 = [], None
    for t in layers:
        ptr, shape, item, stride0, cuda = _layer_geometry(t)
        rb = item
        for s in shape[1:]:
            rb *= s
        g = (shape[0], rb, stride0, cuda)
        if shape0 is None:
            shape0 = g
        elif g != shape0:
            raise ValueError(f"{what}: every layer must have one shape, row stride and device "
                             f"({shape0[0]} rows of {shape0[1]} bytes, {shape0[2]} apart vs "
                             f"{g[0]} of {g[1]}, {g[2]} apart)")
        addrs.append(ptr)
    assert shape0 is not None
    return addrs, shape0[0], shape0[1], shape0[2], shape0[3]


def _index_tensor(rows: Any, device: Any, host: bool) -> Any:
    """rows as a contiguous int32/int64 torch tensor on device (or on the host)."""
    torch = _need_torch()
    if _is_tensor(rows):
        t = rows
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"row indices must be int32 or int64, not {t.dtype}")
    else:
        t = torch.as_tensor(list(rows) if not hasattr(rows, "__array_interface__") else rows)
        if t.dtype not in (torch.int32, torch.int64):
            t = t.to(torch.int64)
    if t.dim() != 1:
        raise ValueError(f"row indices must be one-dimensional, not of shape {tuple(t.shape)}")
    want = torch.device("cpu") if host else device
    if t.device != want:
        t = t.to(want)
    return t.contiguous()


def _host_index(rows: Any, wide: bool = False) -> Tuple[int, int, int, Any]:
    """(address, count, bytes per index, keep) of rows in host memory: a CPU
    tensor or numpy array of int32/int64 as it is, else int64 (wide: always
    int64); no numpy needed for tensors and sequences."""
    if _is_tensor(rows):
        torch = _need_torch()
        if rows.is_cuda:
            raise TypeError("row indices of a copy in host memory must be in host memory")
        if rows.dim() != 1:
            raise ValueError(f"row indices must be one-dimensional, not of shape "
                             f"{tuple(rows.shape)}")
        if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
            raise TypeError(f"row indices must be integers, not {rows.dtype}")
        t = rows
        if wide or t.dtype not in (torch.int32, torch.int64):
            t = t.to(torch.int64)
        t = t.contiguous()
        return int(t.data_ptr()), int(t.numel()), int(t.element_size()), t
    if hasattr(rows, "__array_interface__") and hasattr(rows, "dtype"):
        import numpy as np
        if rows.ndim != 1:
            raise ValueError(f"row indices must be one-dimensional, not of shape {rows.shape}")
        if rows.size and rows.dtype.kind not in "iu":
            raise TypeError(f"row indices must be integers, not {rows.dtype}")
        a = rows if not wide and rows.dtype in (np.int32, np.int64) else rows.astype(np.int64)
        a = np.ascontiguousarray(a)
        return int(a.__array_interface__["data"][0]), int(a.size), int(a.itemsize), a
    vals = [int(x) for x in rows]
    arr = (c_int64 * len(vals))(*vals)
    return ctypes.addressof(arr), len(vals), 8, arr


# Device tables of layer addresses, kept for the layer sets a worker copies
# again and again (its cache and staging area).  Each use records its
# stream, so a table dropped from here is not reused while a copy reads it.
_TABLES_MAX = 32
_tables: "collections.OrderedDict[Tuple[str, Tuple[int, ...]], Any]" = collections.OrderedDict()
_tables_lock = threading.Lock()


def _device_table(torch: Any, dev: Any, addrs: List[int]) -> Any:
    key = (str(dev), tuple(addrs))
    with _tables_lock:
        t = _tables.get(key)
        if t is not None:
            _tables.move_to_end(key)
            return t
    # uploaded on a stream of its own and waited for: before any copy's
    # stream reads it, and without waiting for the work those streams hold
    up = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(up):
        t = torch.tensor(addrs, dtype=torch.int64, device=dev)
    up.synchronize()
    with _tables_lock:
        _tables[key] = t
        while len(_tables) > _TABLES_MAX:
            _tables.popitem(last=False)
    return t


def copy_rows(src: Any, dst: Any, src_rows: Any, dst_rows: Any, *, src_v: Any = None,
              dst_v: Any = None, max_blocks: int = 0, stream: Any = None,
              copy_engine: bool = False) -> None:
    """``dst[l][dst_rows[i]] = src[l][src_rows[i]]`` for every layer l (and
    ``dst_v`` from ``src_v`` likewise), in this process.

    src, dst: one layer ``[rows, ...]`` (a tensor or numpy array with
    contiguous rows, dim 0 strided as you like) or a sequence of them, one
    per layer, every layer of a side alike; src_v / dst_v: the V layers of
    an MHA cache, or None for K only (MLA latents).  A pair with a negative
    index on either side is padding and skipped; a pair past either side's
    rows is skipped too (the kernels' rule), so check indices you did not
    make.

    CUDA tensors: kvdock's transfer kernel on ``stream`` (a
    ``torch.cuda.Stream``, a raw handle, or None for the current stream),
    returning at once; ``max_blocks`` thread blocks at most (0: as many as
    help). Beside a running forward pass on its own stream, use a
    low-priority stream and 2 to 8 blocks: the step then keeps most
    multiprocessors (tests/bench/RESULTS.md, the interference table, has
    the current cost of each budget). Row indices go to
    the tensors' device (a CPU list or tensor is copied there first, in
    the stream's order); tensors already there, like the rows themselves,
    must be ready for ``stream`` (``stream.wait_stream(...)`` after the
    work that wrote them).
    ``copy_engine=True`` moves the rows with this process's copy engines
    instead (one copy per row; indices read on the host now).

    Host memory (numpy arrays, CPU tensors): the CPU reference, at once.
    """
    ks, ds = _layers(src, "src"), _layers(dst, "dst")
    vs, dvs = _layers(src_v, "src_v"), _layers(dst_v, "dst_v")
    if not ks or not ds:
        raise ValueError("src and dst need at least one layer each")
    if bool(vs) != bool(dvs):
        raise ValueError("give both src_v and dst_v, or neither")
    if len(ks) != len(ds) or (vs and (len(vs) != len(ks) or len(dvs) != len(ks))):
        raise ValueError(f"src, dst (and src_v, dst_v) must have as many layers: "
                         f"{len(ks)}, {len(ds)}, {len(vs)}, {len(dvs)}")
    if max_blocks < 0 or max_blocks > 0xFFFFFFFF:
        raise ValueError("max_blocks: 0 to 2^32-1")
    sk, s_rows, s_rb, s_stride, s_cuda = _geometry(ks, "src")
    dk, d_rows, d_rb, d_stride, d_cuda = _geometry(ds, "dst")
    sv: List[int] = []
    dv: List[int] = []
    if vs:
        gv = _geometry(vs, "src_v")
        if gv[1:] != (s_rows, s_rb, s_stride, s_cuda):
            raise ValueError("src_v's layers must be shaped and placed like src's")
        gdv = _geometry(dvs, "dst_v")
        if gdv[1:] != (d_rows, d_rb, d_stride, d_cuda):
            raise ValueError("dst_v's layers must be shaped and placed like dst's")
        sv, dv = gv[0], gdv[0]
    if s_rb != d_rb:
        raise ValueError(f"rows of {s_rb} bytes cannot be copied into rows of {d_rb}")
    if s_cuda != d_cuda:
        raise ValueError("src and dst must both be CUDA tensors or both host memory")
    if copy_engine and not s_cuda:
        raise ValueError("copy_engine: for CUDA tensors (host memory is copied by the CPU)")
    lib = kernels_library()
    keep: List[Any] = []
    # per side: (k, v, k table, v table) addresses; tables for several layers
    sides: List[Tuple[int, Optional[int], Optional[int], Optional[int]]] = []
    if s_cuda:
        torch = _need_torch()
        dev = ks[0].device
        if stream is None:
            stream = torch.cuda.current_stream(dev)
        on = (stream if hasattr(stream, "cuda_stream")
              else torch.cuda.ExternalStream(int(stream), device=dev))
        handle = int(on.cuda_stream)
        # made on the copy's stream, so that the copy follows their uploads
        with torch.cuda.stream(on):
            si = _index_tensor(src_rows, dev, copy_engine)
            di = _index_tensor(dst_rows, dev, copy_engine)
            if si.dtype != di.dtype:
                si, di = si.to(torch.int64), di.to(torch.int64)
            keep += [si, di]

            def table(addrs: List[int]) -> Optional[int]:
                if len(ks) == 1 or not addrs:
                    return None
                if copy_engine:
                    t = torch.tensor(addrs, dtype=torch.int64)
                else:
                    t = _device_table(torch, dev, addrs)
                keep.append(t)
                return int(t.data_ptr())

            for kk, vv in ((sk, sv), (dk, dv)):
                sides.append((kk[0], vv[0] if vv else None, table(kk), table(vv)))
        idx64 = si.dtype == torch.int64
        count, d_count = int(si.numel()), int(di.numel())
        sp, dp = int(si.data_ptr()), int(di.data_ptr())
    else:
        sp, count, s_size, s_keep = _host_index(src_rows)
        dp, d_count, d_size, d_keep = _host_index(dst_rows)
        if s_size != d_size:
            sp, count, s_size, s_keep = _host_index(src_rows, wide=True)
            dp, d_count, d_size, d_keep = _host_index(dst_rows, wide=True)
        keep += [s_keep, d_keep]
        idx64 = s_size == 8
        handle = 0
        for kk, vv in ((sk, sv), (dk, dv)):
            tabs: List[Optional[int]] = []
            for addrs in (kk, vv):
                if len(ks) == 1 or not addrs:
                    tabs.append(None)
                    continue
                arr = (ctypes.c_uint64 * len(addrs))(*addrs)
                keep.append(arr)
                tabs.append(ctypes.addressof(arr))
            sides.append((kk[0], vv[0] if vv else None, tabs[0], tabs[1]))
    if count != d_count:
        raise ValueError(f"src_rows and dst_rows must be as long ({count} and {d_count})")
    if count == 0:
        return
    a = _TransferArgs()
    a.num_layers = len(ks)
    for side, (k, v, kt, vt), rows, stride in ((a.src, sides[0], s_rows, s_stride),
                                               (a.dst, sides[1], d_rows, d_stride)):
        side.k, side.v, side.k_layers, side.v_layers = k, v, kt, vt
        side.slot_stride = stride
        side.num_slots = rows
    a.src_idx, a.dst_idx = sp, dp
    a.idx_dtype = C.DTYPE_I64 if idx64 else C.DTYPE_I32
    a.count = count
    a.row_bytes = s_rb
    flags = _LAUNCH_COPY_ENGINE if copy_engine else 0
    if copy_engine and all(_one_storage(ts) for ts in (ks, vs, ds, dvs)):
        flags |= _LAUNCH_TABLES_ONE_ALLOCATION
    launch = _Launch(handle or None, max_blocks, flags)
    fn = lib.kvd_cuda_kv_transfer if s_cuda else lib.kvd_cpu_kv_transfer
    st = fn(byref(a), byref(launch))
    if s_cuda and not copy_engine:
        # index arrays and tables are read in stream order: keep them from
        # the caching allocator until the stream has passed them
        for t in keep:
            t.record_stream(on)
    if st != 0:
        detail = lib.kvd_last_error_detail().decode("utf-8", "replace")
        raise Error(st, f"copy_rows: {detail}")


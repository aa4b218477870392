"""Test harness of the Python client suites: the real kvdockd on a
temporary socket, and the kernel library's CPU reference through ctypes.

Environment (set by tests/python/CMakeLists.txt):
  KVDOCKD_PATH        the kvdockd binary
  KVDOCK_LIB          libkvdock.so (read by the kvdock package itself)
  KVDOCK_KERNELS_LIB  libkvdock_kernels.so (the fp8 reference)
  PYTHONPATH          client/python, so `import kvdock` finds the source tree
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from ctypes import c_float, c_int32, c_int64, c_void_p, POINTER
from typing import List, Optional

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def time_scale() -> int:
    """The factor of every time bound (KVD_TEST_TIME_SCALE, an integer >= 1,
    default 1; tests/common/kvt_time.h tells who raises it)."""
    raw = os.environ.get("KVD_TEST_TIME_SCALE", "1")
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if not 1 <= v <= 1000:
        raise RuntimeError(f"KVD_TEST_TIME_SCALE={raw} is not an integer from 1 to 1000")
    return v


class Daemon:
    """kvdockd --backend BACKEND on a socket in a new temporary directory."""

    def __init__(self, backend: str = "cpu", extra: Optional[List[str]] = None,
                 timeout: float = 20.0) -> None:
        path = os.environ.get("KVDOCKD_PATH")
        if not path or not os.path.exists(path):
            raise unittest.SkipTest(f"KVDOCKD_PATH is not set to a kvdockd binary ({path!r})")
        self.dir = tempfile.mkdtemp(prefix="kvdock-pytest-")
        self.socket = os.path.join(self.dir, "run", "kvdockd.sock")
        self.log = os.path.join(self.dir, "kvdockd.log")
        # no test daemon reserves more than 2 GiB unless extra says otherwise
        argv = [path, "--socket", self.socket, "--backend", backend,
                "--host-memory-budget", "2G"] + (extra or [])
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout * time_scale()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.read_log()
                self.stop()
                raise RuntimeError(f"kvdockd exited at start ({self.proc.returncode}):\n{log}")
            if self._can_connect():
                return
            time.sleep(0.01)
        log = self.read_log()
        self.stop()
        raise RuntimeError(f"kvdockd did not accept connections within "
                           f"{timeout * time_scale()} s:\n{log}")

    def _can_connect(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def read_log(self) -> str:
        try:
            with open(self.log, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        rc = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                sys.stderr.write("kvdockd did not exit on SIGTERM; killing it\n" + self.read_log())
                self.proc.kill()
                rc = self.proc.wait()  # -SIGKILL: stop_clean fails on it
        else:
            rc = self.proc.returncode
        self._logf.close()
        self.final_log = self.read_log()  # the folder goes next
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def stop_clean(self, timeout: float = 20.0) -> None:
        """stop(), and fail unless kvdockd exited 0 (a tearDownModule's end)."""
        rc = self.stop(timeout)
        if rc != 0:
            raise AssertionError(f"kvdockd exited with {rc}:\n{self.final_log}")


# ---------------------------------------------------------------------------
# The kernel library's CPU reference (kvdock/kernels.h), for fp8 set.

class Fp8SetArgs(ctypes.Structure):
    _fields_ = [
        ("k_src", c_void_p), ("v_src", c_void_p), ("src_dtype", c_int32),
        ("k_src_token_stride", c_int64), ("k_src_head_stride", c_int64),
        ("v_src_token_stride", c_int64), ("v_src_head_stride", c_int64),
        ("k_cache", c_void_p), ("v_cache", c_void_p), ("cache_dtype", c_int32),
        ("page_size", c_int64), ("k_page_stride", c_int64), ("k_slot_stride", c_int64),
        ("k_head_stride", c_int64), ("v_page_stride", c_int64), ("v_slot_stride", c_int64),
        ("v_head_stride", c_int64), ("num_slots", c_int64), ("num_heads", c_int64),
        ("head_dim", c_int64), ("loc", c_void_p), ("loc_dtype", c_int32),
        ("num_tokens", c_int64), ("scale_mode", c_int32), ("k_scale", c_float),
        ("v_scale", c_float), ("k_scale_ptr", POINTER(c_float)),
        ("v_scale_ptr", POINTER(c_float)), ("oob_count", c_void_p),
    ]


_kernels = None


def kernels() -> ctypes.CDLL:
    """libkvdock_kernels.so ($KVDOCK_KERNELS_LIB), or SkipTest."""
    global _kernels
    if _kernels is None:
        path = os.environ.get("KVDOCK_KERNELS_LIB")
        if not path or not os.path.exists(path):
            raise unittest.SkipTest(f"KVDOCK_KERNELS_LIB is not set ({path!r})")
        lib = ctypes.CDLL(path)
        lib.kvd_kernels_abi_version.restype = ctypes.c_int
        if lib.kvd_kernels_abi_version() != 1:
            raise RuntimeError("libkvdock_kernels ABI is not version 1")
        lib.kvd_cpu_fp8_set.restype = ctypes.c_int
        lib.kvd_cpu_fp8_set.argtypes = [POINTER(Fp8SetArgs), c_void_p]
        lib.kvd_last_error_detail.restype = ctypes.c_char_p
        _kernels = lib
    return _kernels


def _host_array(a):
    """(address, itemsize, shape, keep) of a C-contiguous copy-or-view of a
    numpy array or CPU tensor (numpy is not imported for tensors)."""
    if type(a).__module__.startswith("torch"):
        t = a.contiguous()
        return t.data_ptr(), t.element_size(), tuple(t.shape), t
    import numpy as np

    a = np.ascontiguousarray(a)
    return a.ctypes.data, a.itemsize, a.shape, a


def fp8_reference(pool_bytes, info, layer: int, loc, k, v, src_code: int, cache_code: int,
                  mode: int, k_scale: float = 1.0, v_scale: float = 1.0, khs=None, vhs=None,
                  page_size: int = 0) -> None:
    """kvd_cpu_fp8_set into pool_bytes (a copy of a pool's bytes: a numpy
    array, or a contiguous CPU uint8 tensor, written in place).

    k, v: numpy arrays or CPU tensors [num_tokens, num_heads, head_dim]
    holding the source elements' bytes (bfloat16 may be an int16 view);
    loc: a sequence, numpy array or tensor of slots; mode is the client's
    scale mode (0 none, 1 per tensor, 2 per head).  Tensors throughout need
    no numpy."""
    lib = kernels()
    kp, es, (T, H, Dh), kk = _host_array(k)
    vp, _, _, vk = _host_array(v)
    if type(pool_bytes).__module__.startswith("torch"):
        if not pool_bytes.is_contiguous():
            raise ValueError("pool_bytes must be a contiguous tensor (it is written in place)")
        base = pool_bytes.data_ptr()
    else:
        base = pool_bytes.ctypes.data
    page = max(page_size, 1)
    a = Fp8SetArgs()
    a.k_src, a.v_src, a.src_dtype = kp, vp, src_code
    a.k_src_token_stride = a.v_src_token_stride = H * Dh * es
    a.k_src_head_stride = a.v_src_head_stride = Dh * es
    a.k_cache = base + layer * info.layer_stride
    a.v_cache = base + layer * info.layer_stride + info.v_offset
    a.cache_dtype = cache_code
    a.page_size = page
    a.k_page_stride = a.v_page_stride = page * info.slot_stride
    a.k_slot_stride = a.v_slot_stride = info.slot_stride
    a.k_head_stride = a.v_head_stride = Dh
    a.num_slots, a.num_heads, a.head_dim = info.num_slots, H, Dh
    if hasattr(loc, "reshape"):  # numpy array or tensor
        loc = loc.reshape(-1).tolist()
    loc64 = (c_int64 * T)(*[int(x) for x in list(loc)[:T]])
    a.loc, a.loc_dtype, a.num_tokens = ctypes.addressof(loc64), 2, T
    kh = (c_float * H)(*(list(khs) if khs is not None else [1.0] * H))
    vh = (c_float * H)(*(list(vhs) if vhs is not None else [1.0] * H))
    # The client's SCALE_TENSOR is the kernels' SCALE_HOST (1); PER_HEAD is 3.
    a.scale_mode = {0: 0, 1: 1, 2: 3}[mode]
    a.k_scale, a.v_scale = k_scale, v_scale
    a.k_scale_ptr, a.v_scale_ptr = kh, vh
    st = lib.kvd_cpu_fp8_set(ctypes.byref(a), None)
    del kk, vk  # the sources stay alive until here
    if st != 0:
        raise AssertionError(f"reference fp8 set failed: {lib.kvd_last_error_detail()!r}")


def numpy_or_skip(why: str):
    """numpy, or unittest.SkipTest saying what needs it (printed by run_suite.py)."""
    try:
        import numpy
    except ImportError as e:
        raise unittest.SkipTest(f"numpy is not importable ({e}): {why}") from None
    return numpy


def torch_or_none():
    try:
        import torch
        return torch
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"note: PyTorch does not import ({e})\n")
        return None

"""Plain results: what the daemon says at hello, of a pool, of an operation."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Dict, Union

from . import _capi as C


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

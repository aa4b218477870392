"""ctypes declarations of libkvdock (client/include/kvdock/client.h).

Every structure here mirrors its C counterpart field for field; the
functions carry full argtypes/restype so that ctypes converts and checks
arguments.  Nothing in this module talks to the daemon by itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, List, Optional

#: The ABI this module was written against (KVD_CLIENT_ABI_VERSION).
CLIENT_ABI_VERSION = 8

NAME_MAX = 64
IPC_HANDLE_BYTES = 64
HIST_MAX = 64
MEMORY_KINDS_MAX = 8

# kvd_mem_kind_t
MEM_UNSPECIFIED = 0
MEM_HOST = 1
MEM_DEVICE = 2
MEM_DEVICE_VMM = 3

# kvd_backend_t
BACKEND_UNSPECIFIED = 0
BACKEND_CPU = 1
BACKEND_CUDA = 2

# kvd_stream_class_t
STREAM_DEFAULT = 0
STREAM_RELOAD = 1
STREAM_WRITE = 2
STREAM_OFFLOAD = 3
STREAM_D2D = 4
STREAM_END = 5

# kvd_copy_path_t
PATH_DEFAULT = 0
PATH_COPY_ENGINE = 1
PATH_KERNEL = 2

# kvd_fp8_scale_t
FP8_SCALE_NONE = 0
FP8_SCALE_TENSOR = 1
FP8_SCALE_PER_HEAD = 2

# kvd_dtype_t (kvdock/types.h)
DTYPE_U8 = 0
DTYPE_I32 = 1
DTYPE_I64 = 2
DTYPE_F32 = 3
DTYPE_F16 = 4
DTYPE_BF16 = 5
DTYPE_E4M3 = 6
DTYPE_E5M2 = 7

EXPORT_NO_MAP = 1 << 0

# the cache tier
CACHE_KEY_MAX = 64
CACHE_ALLOW_MAX = 16
CACHE_KEYS_MAX = 65536
CACHE_LAYER_EVENTS_MAX = 128
BLOCK_HASH_BYTES = 32

# kvdock/status.h: (name, number)
STATUS_NAMES = {
    0: "OK", 1: "EINVAL", 2: "ENULL", 3: "ERANGE", 4: "EALIGN", 5: "EDTYPE",
    6: "ESHAPE", 7: "EOVERFLOW", 8: "ENOMEM", 9: "ECUDA", 10: "ENODEV",
    11: "ENOTSUP", 12: "EPROTO", 13: "EVERSION", 14: "ETOOBIG", 15: "ENOENT",
    16: "EEXIST", 17: "EPERM", 18: "ELIMIT", 19: "EBUSY", 20: "ESHUTDOWN",
    21: "ECONN", 22: "EIO", 23: "ETIMEDOUT", 24: "EUNKNOWNOP", 25: "EINTERNAL",
}
OK = 0
EINVAL = 1
ENULL = 2
ERANGE = 3
ESHAPE = 6
ECUDA = 9
ENOTSUP = 11
ENOENT = 15
ELIMIT = 18
ECONN = 21
ETIMEDOUT = 23


class Limits(Structure):
    _fields_ = [
        ("max_frame_bytes", c_uint64),
        ("max_inflight", c_uint32),
        ("max_pools", c_uint32),
        ("max_pool_bytes", c_uint64),
        ("max_total_pool_bytes", c_uint64),
        ("max_inline_bytes", c_uint32),
    ]


class HelloInfo(Structure):
    _fields_ = [
        ("protocol_version", c_uint32),
        ("daemon_version", c_char * NAME_MAX),
        ("backend", c_int32),
        ("device_name", c_char * NAME_MAX),
        ("device_ordinal", c_int32),
        ("limits", Limits),
        ("client_id", c_uint64),
        ("daemon_pid", c_uint32),
        ("admin", c_bool),
    ]


class ClientEntry(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("name", c_char * NAME_MAX),
        ("pid", c_uint32),
        ("uid", c_uint32),
        ("inflight", c_uint32),
        ("pools", c_uint32),
        ("requests", c_uint64),
    ]


class MemoryUse(Structure):
    _fields_ = [
        ("kind", c_char * 16),
        ("used", c_uint64),
        ("limit", c_uint64),
        ("refused", c_uint64),
    ]


CLUSTER_PEERS_MAX = 64


class ClusterPeer(Structure):
    _fields_ = [
        ("address", c_char * 128),
        ("state", c_char * 16),
        ("error", c_char * 160),
        ("rtt_us", c_uint64),
        ("since_ms", c_uint64),
        ("queries", c_uint64),
        ("blocks_fetched", c_uint64),
        ("bytes_fetched", c_uint64),
        ("failures", c_uint64),
    ]


class ClusterStatus(Structure):
    _fields_ = [
        ("enabled", c_bool),
        ("node", c_char * 128),
        ("deadline_ms", c_uint32),
        ("inbound", c_uint32),
        ("blocks_fetched", c_uint64),
        ("bytes_fetched", c_uint64),
        ("blocks_served", c_uint64),
        ("bytes_served", c_uint64),
        ("refused", c_uint64),
        ("num_peers", c_uint32),
        ("peers", ClusterPeer * CLUSTER_PEERS_MAX),
    ]


DISK_SKIPPED_MAX = 16


class SkippedCache(Structure):
    _fields_ = [
        ("dir", c_char * 256),
        ("name", c_char * NAME_MAX),
        ("owner_uid", c_uint32),
        ("reason", c_char * 400),
    ]


class DiskStatus(Structure):
    _fields_ = [
        ("enabled", c_bool),
        ("direct", c_bool),
        ("cache_dir", c_char * 256),
        ("io_engine", c_char * 256),
        ("budget_bytes", c_uint64),
        ("reserved_bytes", c_uint64),
        ("used_bytes", c_uint64),
        ("fs_free_bytes", c_uint64),
        ("num_skipped", c_uint32),
        ("skipped", SkippedCache * DISK_SKIPPED_MAX),
    ]


class DaemonStatus(Structure):
    _fields_ = [
        ("daemon_version", c_char * NAME_MAX),
        ("backend", c_int32),
        ("device_name", c_char * NAME_MAX),
        ("uptime_ms", c_uint64),
        ("clients", c_uint32),
        ("pools", c_uint32),
        ("pool_bytes", c_uint64),
        ("buffers", c_uint32),
        ("events", c_uint32),
        ("inflight", c_uint32),
        ("socket_path", c_char * 256),
        ("shutting_down", c_bool),
        ("num_clients", c_size_t),
        ("host_budget", c_uint64),
        ("host_used", c_uint64),
        ("host_available", c_uint64),
        ("host_machine", c_uint64),
        ("host_kinds", MemoryUse * MEMORY_KINDS_MAX),
        ("num_host_kinds", c_uint32),
        ("device_free", c_uint64),
        ("device_total", c_uint64),
        ("device_margin", c_uint64),
        ("stream_paths", c_int32 * STREAM_END),
        ("cluster", ClusterStatus),
        ("metrics_address", c_char * 80),
        ("cache_budgets", c_uint64),
        ("disk", DiskStatus),
    ]


class OpStats(Structure):
    _fields_ = [
        ("op", c_char * 32),
        ("requests", c_uint64),
        ("errors", c_uint64),
        ("bytes", c_uint64),
        ("num_bounds", c_uint32),
        ("bounds_us", c_double * HIST_MAX),
        ("counts", c_uint64 * (HIST_MAX + 1)),
        ("sum_us", c_double),
    ]


class StreamStats(Structure):
    _fields_ = [
        ("name", c_char * 32),
        ("priority", c_int32),
        ("max_blocks", c_uint32),
        ("launches", c_uint64),
        ("bytes", c_uint64),
        ("busy_ns", c_uint64),
        ("queue_depth", c_uint32),
        ("path", c_int32),
        ("copy_engine_launches", c_uint64),
    ]


class DaemonStats(Structure):
    _fields_ = [
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("connections", c_uint64),
        ("num_ops", c_size_t),
        ("num_streams", c_size_t),
    ]


class PoolSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("kind", c_int32),
        ("num_layers", c_uint32),
        ("num_slots", c_uint64),
        ("slot_bytes", c_uint64),
        ("mla", c_bool),
        ("page_size", c_uint32),
        ("shared", c_bool),
    ]


class PoolInfo(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("name", c_char * NAME_MAX),
        ("kind", c_int32),
        ("num_layers", c_uint32),
        ("num_slots", c_uint64),
        ("slot_bytes", c_uint64),
        ("mla", c_bool),
        ("page_size", c_uint32),
        ("shared", c_bool),
        ("imported", c_bool),
        ("bytes", c_uint64),
        ("layer_stride", c_uint64),
        ("v_offset", c_uint64),
        ("slot_stride", c_uint64),
        ("owner", c_uint64),
        ("orphaned", c_bool),
    ]


class Mapping(Structure):
    _fields_ = [
        ("base", c_void_p),
        ("bytes", c_uint64),
        ("kind", c_int32),
        ("device_ordinal", c_int32),
        ("fd", c_int),
        ("ipc_handle", c_uint8 * IPC_HANDLE_BYTES),
        ("pool", PoolInfo),
        ("buffer", c_uint64),
    ]


class ImportRegion(Structure):
    _fields_ = [
        ("kind", c_int32),
        ("ipc_handle", c_uint8 * IPC_HANDLE_BYTES),
        ("fd", c_int),
        ("bytes", c_uint64),
    ]


class MemRef(Structure):
    _fields_ = [("region", c_uint32), ("offset", c_uint64)]


class PoolImport(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("num_layers", c_uint32),
        ("num_slots", c_uint64),
        ("slot_bytes", c_uint64),
        ("slot_stride", c_uint64),
        ("mla", c_bool),
        ("page_size", c_uint32),
        ("shared", c_bool),
        ("regions", POINTER(ImportRegion)),
        ("num_regions", c_uint32),
        ("k_layers", POINTER(MemRef)),
        ("v_layers", POINTER(MemRef)),
    ]


class Indices(Structure):
    _fields_ = [
        ("values", c_void_p),
        ("count", c_uint64),
        ("dtype", c_int32),
        ("buffer", c_uint64),
        ("offset", c_uint64),
    ]


class Data(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("bytes", c_uint64),
        ("buffer", c_uint64),
        ("offset", c_uint64),
    ]


class BufRef(Structure):
    _fields_ = [("buffer", c_uint64), ("offset", c_uint64), ("bytes", c_uint64)]


class Sync(Structure):
    _fields_ = [
        ("wait_event", c_uint64),
        ("record_event", c_uint64),
        ("reply_at_enqueue", c_bool),
        ("stream", c_int32),
        ("max_blocks", c_uint32),
        ("copy_engine", c_bool),
        ("path", c_int32),
    ]


class OpResult(Structure):
    _fields_ = [
        ("rows", c_uint64),
        ("skipped_oob", c_uint64),
        ("bytes", c_uint64),
        ("enqueued", c_bool),
        ("path", c_int32),
        ("stored", c_uint32),
        ("skipped", c_uint32),
        ("refused", c_uint32),
    ]


class KvStore(Structure):
    _fields_ = [
        ("pool", c_uint64),
        ("layer", c_uint32),
        ("loc", Indices),
        ("k", Data),
        ("v", Data),
        ("src_stride", c_uint64),
    ]


class KvFp8Set(Structure):
    _fields_ = [
        ("pool", c_uint64),
        ("layer", c_uint32),
        ("loc", Indices),
        ("k", Data),
        ("v", Data),
        ("src_dtype", c_int32),
        ("cache_dtype", c_int32),
        ("num_heads", c_uint32),
        ("head_dim", c_uint32),
        ("scale_mode", c_int32),
        ("k_scale", c_float),
        ("v_scale", c_float),
        ("k_head_scales", POINTER(c_float)),
        ("v_head_scales", POINTER(c_float)),
    ]


class PageTableGather(Structure):
    _fields_ = [
        ("req_to_page", BufRef),
        ("table_dtype", c_int32),
        ("table_rows", c_uint64),
        ("table_cols", c_uint64),
        ("table_stride", c_uint64),
        ("req_pool_indices", Indices),
        ("seq_lens", Indices),
        ("out", BufRef),
        ("out_stride", c_uint64),
        ("max_num_pages", c_uint64),
        ("page_size", c_uint32),
        ("dummy_slot", c_int64),
    ]


class KvTransfer(Structure):
    _fields_ = [
        ("src_pool", c_uint64),
        ("dst_pool", c_uint64),
        ("src", Indices),
        ("dst", Indices),
        ("all_layers", c_bool),
        ("layer_begin", c_uint32),
        ("layer_count", c_uint32),
    ]


class CacheLayout(Structure):
    _fields_ = [
        ("num_layers", c_uint32),
        ("mla", c_bool),
        ("tokens_per_block", c_uint32),
        ("token_bytes", c_uint64),
        ("dtype", c_char * 16),
    ]


class CacheSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("layout", CacheLayout),
        ("budget_bytes", c_uint64),
        ("shared", c_bool),
        ("allow_uids", POINTER(c_uint32)),
        ("num_allow_uids", c_uint32),
        ("allow_gids", POINTER(c_uint32)),
        ("num_allow_gids", c_uint32),
        ("open_existing", c_bool),
        ("cluster", c_bool),
        ("disk_budget_bytes", c_uint64),
    ]


class CacheDiskLevel(Structure):
    _fields_ = [
        ("enabled", c_bool),
        ("blocks", c_uint32),
        ("budget_bytes", c_uint64),
        ("used_bytes", c_uint64),
        ("hits", c_uint64),
        ("spills", c_uint64),
        ("promotions", c_uint64),
        ("reads", c_uint64),
        ("read_bytes", c_uint64),
        ("writes", c_uint64),
        ("write_bytes", c_uint64),
        ("evictions", c_uint64),
        ("checksum_failures", c_uint64),
        ("io_errors", c_uint64),
        ("no_space", c_uint64),
        ("path", c_char * 384),
    ]


class CacheInfo(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("name", c_char * NAME_MAX),
        ("layout", CacheLayout),
        ("budget_bytes", c_uint64),
        ("block_bytes", c_uint64),
        ("capacity", c_uint32),
        ("blocks", c_uint32),
        ("used_bytes", c_uint64),
        ("held_bytes", c_uint64),
        ("shared", c_bool),
        ("owner_uid", c_uint32),
        ("allow_uids", c_uint32 * CACHE_ALLOW_MAX),
        ("num_allow_uids", c_uint32),
        ("allow_gids", c_uint32 * CACHE_ALLOW_MAX),
        ("num_allow_gids", c_uint32),
        ("lookups", c_uint64),
        ("keys_asked", c_uint64),
        ("keys_hit", c_uint64),
        ("saves", c_uint64),
        ("stored", c_uint64),
        ("skipped", c_uint64),
        ("refused", c_uint64),
        ("loads", c_uint64),
        ("loaded", c_uint64),
        ("evictions", c_uint64),
        ("leases", c_uint32),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("cluster", c_bool),
        ("fetched", c_uint64),
        ("served", c_uint64),
        ("disk", CacheDiskLevel),
        ("peer_hits", c_uint64),
    ]


class CacheKeys(Structure):
    _fields_ = [
        ("keys", POINTER(c_void_p)),
        ("lens", POINTER(c_size_t)),
        ("blob", c_void_p),
        ("key_size", c_uint32),
        ("count", c_uint32),
    ]


class CacheLookupResult(Structure):
    _fields_ = [("hits", c_uint32), ("lease", c_uint64), ("lease_expires_ms", c_uint64),
                ("local_hits", c_uint32), ("waited_for", c_char * 256),
                ("disk_hits", c_uint32)]


class CacheSave(Structure):
    _fields_ = [
        ("cache", c_uint64),
        ("pool", c_uint64),
        ("keys", CacheKeys),
        ("blocks", Indices),
        ("parent", c_void_p),
        ("parent_len", c_size_t),
    ]


class CacheLoad(Structure):
    _fields_ = [
        ("cache", c_uint64),
        ("pool", c_uint64),
        ("keys", CacheKeys),
        ("lease", c_uint64),
        ("blocks", Indices),
        ("layer_events", POINTER(c_uint64)),
        ("num_layer_events", c_uint32),
        ("layer_flags", BufRef),
        ("flag_value", c_uint32),
    ]


class CacheEvictResult(Structure):
    _fields_ = [("evicted", c_uint32), ("busy", c_uint32), ("missing", c_uint32)]


# ---------------------------------------------------------------------------
# Finding and loading the library

def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("KVDOCK_LIB")
    if env:
        out.append(env)
    here = Path(__file__).resolve().parent
    for name in ("libkvdock.so", f"libkvdock.so.{CLIENT_ABI_VERSION}"):
        out.append(str(here / name))
        out.append(str(here / "lib" / name))
    found = ctypes.util.find_library("kvdock")
    if found:
        out.append(found)
    # The build tree: client/python/kvdock/ -> repo root is three levels up.
    repo = here.parent.parent.parent
    for build in ("build", "build-cpu", "build-gpu"):
        out.append(str(repo / build / "client" / "libkvdock.so"))
    return out


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def library_path() -> Optional[str]:
    """The path (or, when found through the system's library path, the
    name) of the libkvdock this process loaded; None until the first call
    that needs the library (creating a Client loads it).  It never loads
    the library itself."""
    return _lib_path


def load() -> ctypes.CDLL:
    """Load libkvdock once, from the first of: $KVDOCK_LIB (when set, the
    only choice: OSError if it is absent or cannot be loaded), a copy next
    to the package (libkvdock.so or libkvdock.so.<client ABI>, the wheel's),
    ctypes.util.find_library("kvdock") (an installed, ldconfig-known one),
    then the repository's build tree (build/, build-cpu/, build-gpu/).  A
    library of another client ABI is refused, never skipped.  OSError lists
    every path tried."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    env = os.environ.get("KVDOCK_LIB")
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            if env and cand == env:
                raise OSError(f"KVDOCK_LIB={env} does not exist")
            tried.append(f"{cand} (absent)")
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(f"{cand} ({e})")
            if env and cand == env:
                raise OSError(f"KVDOCK_LIB={env} cannot be loaded: {e}") from e
            continue
        try:
            _declare(lib)
        except AttributeError as e:
            raise OSError(f"{cand} is not a libkvdock of client ABI {CLIENT_ABI_VERSION}: "
                          f"missing symbol ({e})") from e
        abi = getattr(lib, "kvd_client_abi_version", None)
        if abi is None:
            raise OSError(f"{cand} is a libkvdock older than client ABI 2 "
                          f"(no kvd_client_abi_version); this package needs {CLIENT_ABI_VERSION}")
        abi.restype = c_int
        abi.argtypes = []
        if abi() != CLIENT_ABI_VERSION:
            raise OSError(f"{cand} has client ABI {abi()}, this package {CLIENT_ABI_VERSION}")
        _lib, _lib_path = lib, cand
        return lib
    raise OSError("libkvdock.so not found; set KVDOCK_LIB to its path. Tried: " + "; ".join(tried))


def _fn(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


def _declare(lib: ctypes.CDLL) -> None:
    P = POINTER
    cli = c_void_p
    u64p = P(c_uint64)
    # Names of missing symbols raise AttributeError here: an old library.
    _fn(lib, "kvd_strerror", c_char_p, c_int)
    _fn(lib, "kvd_err_name", c_char_p, c_int)
    _fn(lib, "kvd_mem_kind_name", c_char_p, c_int)
    _fn(lib, "kvd_backend_name", c_char_p, c_int)
    _fn(lib, "kvd_client_has_cuda", c_bool)
    _fn(lib, "kvd_client_create", c_int, c_char_p, c_char_p, P(cli))
    _fn(lib, "kvd_client_destroy", None, P(cli))
    _fn(lib, "kvd_client_info", P(HelloInfo), cli)
    _fn(lib, "kvd_client_socket_path", c_char_p, cli)
    _fn(lib, "kvd_client_fd", c_int, cli)
    _fn(lib, "kvd_client_connected", c_bool, cli)
    _fn(lib, "kvd_client_last_error", c_char_p, cli)
    _fn(lib, "kvd_client_set_timeout", None, cli, c_int)
    _fn(lib, "kvd_client_wait", c_int, cli, c_uint64)
    _fn(lib, "kvd_client_wait_timeout", c_int, cli, c_uint64, c_int)
    _fn(lib, "kvd_client_poll", c_int, cli, c_uint64, P(c_bool))
    _fn(lib, "kvd_client_pending", c_size_t, cli)
    _fn(lib, "kvd_client_abandon", c_int, cli, c_uint64)

    _fn(lib, "kvd_ping_submit", c_int, cli, c_void_p, c_size_t, u64p)
    _fn(lib, "kvd_daemon_status_submit", c_int, cli, P(DaemonStatus), P(ClientEntry), c_size_t, u64p)
    _fn(lib, "kvd_daemon_stats_submit", c_int, cli, P(DaemonStats), P(OpStats), c_size_t,
        P(StreamStats), c_size_t, u64p)
    _fn(lib, "kvd_daemon_shutdown_submit", c_int, cli, c_bool, u64p)

    _fn(lib, "kvd_pool_create_submit", c_int, cli, P(PoolSpec), P(PoolInfo), u64p)
    _fn(lib, "kvd_pool_drop_submit", c_int, cli, c_uint64, c_char_p, u64p)
    _fn(lib, "kvd_pool_list_submit", c_int, cli, P(PoolInfo), c_size_t, P(c_size_t), u64p)
    _fn(lib, "kvd_pool_list_all_submit", c_int, cli, P(PoolInfo), c_size_t, P(c_size_t), u64p)
    _fn(lib, "kvd_pool_export_submit", c_int, cli, c_uint64, c_char_p, c_uint32, P(P(Mapping)), u64p)
    _fn(lib, "kvd_mapping_destroy", None, P(P(Mapping)))
    _fn(lib, "kvd_mapping_layer", c_void_p, P(Mapping), c_uint32, c_bool)
    _fn(lib, "kvd_mapping_create_host", c_int, c_uint64, P(P(Mapping)))
    _fn(lib, "kvd_pool_import_submit", c_int, cli, P(PoolImport), P(PoolInfo), u64p)
    _fn(lib, "kvd_import_region_from_mapping", c_int, P(Mapping), P(ImportRegion))
    _fn(lib, "kvd_import_region_from_device_ptr", c_int, c_void_p, P(ImportRegion), u64p)
    _fn(lib, "kvd_import_region_from_vmm_ptr", c_int, c_void_p, P(ImportRegion), u64p)

    _fn(lib, "kvd_buffer_register_submit", c_int, cli, c_uint64, c_int32, c_char_p, u64p,
        P(P(Mapping)), u64p)
    _fn(lib, "kvd_buffer_drop_submit", c_int, cli, c_uint64, u64p)
    _fn(lib, "kvd_event_register_submit", c_int, cli, c_void_p, u64p, u64p)
    _fn(lib, "kvd_event_drop_submit", c_int, cli, c_uint64, u64p)
    _fn(lib, "kvd_event_ipc_handle", c_int, c_void_p, c_uint8 * IPC_HANDLE_BYTES)

    _fn(lib, "kvd_kv_store_submit", c_int, cli, P(KvStore), P(Sync), P(OpResult), u64p)
    _fn(lib, "kvd_kv_fp8_set_submit", c_int, cli, P(KvFp8Set), P(Sync), P(OpResult), u64p)
    _fn(lib, "kvd_page_table_gather_submit", c_int, cli, P(PageTableGather), P(Sync), P(OpResult), u64p)
    _fn(lib, "kvd_kv_transfer_submit", c_int, cli, P(KvTransfer), P(Sync), P(OpResult), u64p)

    _fn(lib, "kvd_cache_create_submit", c_int, cli, P(CacheSpec), P(CacheInfo), u64p)
    _fn(lib, "kvd_cache_drop_submit", c_int, cli, c_uint64, c_char_p, u64p)
    _fn(lib, "kvd_cache_list_submit", c_int, cli, P(CacheInfo), c_size_t, P(c_size_t), u64p)
    _fn(lib, "kvd_cache_stats_submit", c_int, cli, c_uint64, c_char_p, P(CacheInfo), u64p)
    _fn(lib, "kvd_cache_lookup_submit", c_int, cli, c_uint64, P(CacheKeys), c_bool, c_uint32,
        P(CacheLookupResult), u64p)
    _fn(lib, "kvd_cache_save_submit", c_int, cli, P(CacheSave), P(Sync), P(OpResult), u64p)
    _fn(lib, "kvd_cache_load_submit", c_int, cli, P(CacheLoad), P(Sync), P(OpResult), u64p)
    _fn(lib, "kvd_cache_evict_submit", c_int, cli, c_uint64, P(CacheKeys), c_bool,
        P(CacheEvictResult), u64p)
    _fn(lib, "kvd_cache_release_submit", c_int, cli, c_uint64, u64p)
    _fn(lib, "kvd_stream_wait_value32", c_int, c_void_p, c_void_p, c_uint32)
    _fn(lib, "kvd_block_hashes", c_int, P(c_int64), c_size_t, c_uint32, c_void_p, c_size_t,
        c_void_p, c_size_t, P(c_size_t))


def cstr(b: bytes) -> str:
    """A NUL-terminated char array field as str."""
    return b.decode("utf-8", "replace")

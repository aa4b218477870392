"""kvdock: the Python client of kvdockd, the KV-cache daemon for LLM serving.

A thin ctypes wrapper of libkvdock (no compiled extension).  Every operation
blocks (``client.store(...)``) or returns a future (``client.store_async(...)``,
``.result(timeout)``); failures raise :class:`kvdock.Error` with ``.code``,
``.name`` ("EINVAL") and ``.message`` (the daemon's words).  numpy and PyTorch
are optional: without them, operands are bytes.

Worked example (numpy, the cpu or cuda backend)::

    import numpy as np
    import kvdock

    with kvdock.Client(name="offload-svc") as cli:       # $KVDOCK_SOCKET or the default
        pool = cli.create_pool("kv-host", num_layers=2, num_slots=128,
                               slot_bytes=256, kind="host")
        m = pool.map()                                  # numpy views over shared pages
        k = np.random.randint(0, 256, (4, 256), dtype=np.uint8)
        v = np.random.randint(0, 256, (4, 256), dtype=np.uint8)
        cli.store(pool, layer=1, loc=[7, 3, 9, 0], k=k, v=v)
        assert (m.k(1)[[7, 3, 9, 0]] == k).all()        # the daemon wrote our pages
        m.v(0)[5] = 42                                  # ... and reads what we write
        other = cli.create_pool("kv-host-2", 2, 128, 256)
        futs = [cli.transfer_async(pool, other, [5], [i]) for i in range(3)]
        for f in reversed(futs):                         # collected in any order
            f.result(timeout=10)

With PyTorch, a worker imports its own KV cache (per-layer CUDA tensors),
and orders the daemon against its stream with interprocess events::

    k_cache = [torch.empty(num_slots, heads, dim, dtype=torch.bfloat16, device="cuda")
               for _ in range(layers)]
    v_cache = [torch.empty_like(t) for t in k_cache]
    gpu = cli.import_pool("worker0-kv", k_cache, v_cache)   # IPC handle + offset per tensor
    host = cli.create_pool("worker0-offload", layers, num_slots, gpu.info.slot_bytes)
    ready = torch.cuda.Event(interprocess=True)
    ready.record()                                           # after the forward pass wrote KV
    cli.transfer(gpu, host, slots, slots, wait_event=ready)  # offload, ordered after `ready`
"""

from ._cache import Cache, CacheDiskLevel, CacheEvicted, CacheInfo, CacheLookup, block_hashes
from ._capi import CLIENT_ABI_VERSION, library_path
from .connector import Connector, Load, Save
from ._rows import copy_rows
from ._buffers import BufIndices, BufRef, Buffer
from ._client import Client
from ._errors import Error, Timeout
from ._events import Event
from ._futures import Future, as_completed, wait_all
from ._mapping import HostMemory, Mapping
from ._pools import Pool
from ._results import HelloInfo, Limits, OpResult, PoolInfo

__version__ = "0.1.0"

for _cls in (BufIndices, BufRef, Buffer, Cache, CacheDiskLevel, CacheEvicted, CacheInfo, CacheLookup, Client,
             Connector, Error, Event, Future, HelloInfo, HostMemory, Limits, Load, Mapping,
             OpResult, Pool, PoolInfo, Save, Timeout):
    _cls.__module__ = __name__  # shown as kvdock.Error, not kvdock._errors.Error
del _cls

__all__ = [
    "BufIndices", "BufRef", "Buffer", "CLIENT_ABI_VERSION", "Cache", "CacheDiskLevel",
    "CacheEvicted",
    "CacheInfo", "CacheLookup", "Client", "Connector", "Error", "Event", "Future", "HelloInfo",
    "HostMemory", "Limits", "Load", "Mapping", "OpResult", "Pool", "PoolInfo", "Save", "Timeout",
    "as_completed",
    "block_hashes", "copy_rows", "library_path", "wait_all", "__version__",
]

"""Pools: a handle on a pool the client made, imported or looks at."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

from ._mapping import Mapping
from ._results import PoolInfo

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


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


# What an operation takes for a pool: a Pool, its info or its id.
PoolLike = Union[Pool, int, PoolInfo]


def _pool_id(p: PoolLike) -> int:
    if isinstance(p, (Pool, PoolInfo)):
        return p.id
    if isinstance(p, int):
        return p
    raise TypeError(f"a Pool or a pool id, not {type(p).__name__}")

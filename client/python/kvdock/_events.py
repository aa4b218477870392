"""Events: CUDA interprocess events the daemon waits on or records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from . import _capi as C

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


class Event:
    """An interprocess CUDA event registered with the daemon."""

    def __init__(self, client: "Client", event_id: int, source: Any = None) -> None:
        self.client = client
        self.id = event_id
        self.source = source  # the torch.cuda.Event, kept alive

    def drop(self) -> None:
        """Drop the event's registration from the daemon."""
        self.client.drop_event(self)

    def __repr__(self) -> str:
        return f"<kvdock.Event id {self.id}>"


# What an operation takes for an event: an Event, its id, a torch.cuda.Event
# (registered on first use) or None.
EventLike = Union[Event, int, Any, None]


def _event_handle(event: Any) -> bytes:
    if isinstance(event, (bytes, bytearray)):
        h = bytes(event)
    elif hasattr(event, "ipc_handle"):
        h = bytes(event.ipc_handle())
    else:
        raise TypeError("an interprocess event: torch.cuda.Event(interprocess=True) or its "
                        "64-byte ipc_handle()")
    if len(h) != C.IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC event handle is {C.IPC_HANDLE_BYTES} bytes, not {len(h)}")
    return h

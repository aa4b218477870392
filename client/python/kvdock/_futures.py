"""Futures: a request in flight, its reply collected on demand or awaited."""

from __future__ import annotations

import concurrent.futures
import threading
from ctypes import byref, c_bool
from typing import (TYPE_CHECKING, Any, Callable, Generator, Generic, Iterable, Iterator, List,
                    Optional, Tuple)

from . import _capi as C
from ._errors import _make_error
from ._util import T

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


# ---------------------------------------------------------------------------
# Futures


class Future(Generic[T]):
    """The reply to a submitted request (concurrent.futures-style), of a
    value of type T.

    ``result(timeout)`` collects the reply (kvd_client_wait_timeout) and
    returns the operation's value or raises its :class:`Error`;
    ``concurrent.futures.TimeoutError`` when no reply came within timeout
    seconds (the request stays pending: ask again later).  Replies may be
    collected in any order.  A future dropped before it was collected
    abandons its request, so the library never writes to freed memory.
    """

    def __init__(self, client: "Client", req_id: int, finish: Callable[[], T],
                 keep: Tuple[Any, ...] = (), cleanup: Optional[Callable[[], None]] = None) -> None:
        self._client = client
        self._id = req_id
        self._finish = finish
        self._keep = keep  # output structures the library writes at wait
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._state = "pending"  # pending, done, abandoned
        self._value: Optional[T] = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["Future[T]"], None]] = []

    @property
    def request_id(self) -> int:
        """The request id the library chose."""
        return self._id

    def _collect(self, timeout: Optional[float]) -> bool:
        """Wait for the reply; False on timeout."""
        with self._lock:
            if self._state != "pending":
                return True
            cli = self._client._handle()
            ms = -1 if timeout is None else max(0, int(timeout * 1000))
            lib = C.load()
            st = lib.kvd_client_wait_timeout(cli, self._id, ms)
            msg = lib.kvd_client_last_error(cli) if st != C.OK else b""
            if st == C.ETIMEDOUT:
                # Our own deadline, or the daemon answering ETIMEDOUT?  A
                # request still pending is ours: it stays collectable.
                done = c_bool(False)
                if lib.kvd_client_poll(cli, self._id, byref(done)) == C.OK:
                    if not done.value:
                        return False
                    st = lib.kvd_client_wait_timeout(cli, self._id, 0)
                    msg = lib.kvd_client_last_error(cli) if st != C.OK else b""
            try:
                if st != C.OK:
                    raise _make_error(st, (msg or b"").decode("utf-8", "replace"))
                self._value = self._finish()
            except BaseException as e:  # noqa: BLE001 - kept for result()
                self._error = e
            self._state = "done"
            self._keep = ()
            self._release()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)
        return True

    def _release(self) -> None:
        if self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def result(self, timeout: Optional[float] = None) -> T:
        """The operation's value; raises its Error, or
        concurrent.futures.TimeoutError after timeout seconds."""
        if self._state == "abandoned":
            raise concurrent.futures.CancelledError()
        if not self._collect(timeout):
            raise concurrent.futures.TimeoutError(
                f"no reply to request {self._id} within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _collect with the state

    def __await__(self) -> Generator[Any, None, T]:
        """``await future`` in asyncio code: the result, waited for in the
        event loop's default executor (a thread), so that the loop (an
        engine's scheduler) keeps running meanwhile."""
        import asyncio

        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.result).__await__()

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The operation's error (None if it succeeded), waiting like result():
        up to timeout seconds (None: without end)."""
        if self._state == "abandoned":
            raise concurrent.futures.CancelledError()
        if not self._collect(timeout):
            raise concurrent.futures.TimeoutError(
                f"no reply to request {self._id} within {timeout} s")
        return self._error

    def done(self) -> bool:
        """Whether the reply has arrived (reads the socket without blocking)."""
        if self._state != "pending":
            return True
        done = c_bool(False)
        st = C.load().kvd_client_poll(self._client._handle(), self._id, byref(done))
        return st != C.OK or bool(done.value)

    def running(self) -> bool:
        """Whether the request is still in flight (not :meth:`done`)."""
        return not self.done()

    def cancelled(self) -> bool:
        """Whether the future was abandoned (:meth:`abandon`, :meth:`cancel`)."""
        return self._state == "abandoned"

    def cancel(self) -> bool:
        """A sent request cannot be cancelled: False (see abandon())."""
        return False

    def abandon(self) -> None:
        """Forget the request: its reply is discarded when it comes."""
        with self._lock:
            if self._state != "pending":
                return
            self._state = "abandoned"
            cli = self._client._handle_or_none()
            if cli:
                C.load().kvd_client_abandon(cli, self._id)
            # The daemon may still use operands staged for this request;
            # temporary buffers are dropped with a request queued after it.
            self._release()
            self._keep = ()

    def add_done_callback(self, fn: Callable[["Future[T]"], None]) -> None:
        """Call fn(future) once the reply has been collected (at once if it has)."""
        with self._lock:
            if self._state == "pending":
                self._callbacks.append(fn)
                return
        fn(self)

    def __del__(self) -> None:
        try:
            if self._state == "pending":
                self.abandon()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"<kvdock.Future request {self._id} {self._state}>"


def as_completed(futures: Iterable[Future[T]],
                 timeout: Optional[float] = None) -> Iterator[Future[T]]:
    """Yield futures as their replies arrive (like concurrent.futures.as_completed),
    waiting on the clients' sockets between polls; concurrent.futures.TimeoutError
    after timeout seconds."""
    import select
    import time

    pending = list(futures)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        still = []
        for f in pending:
            if f.done():
                f._collect(0)  # reply is here: collect it (results are kept)
                yield f
            else:
                still.append(f)
        pending = still
        if not pending:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise concurrent.futures.TimeoutError(f"{len(pending)} futures not done")
        fds = {f._client.fd for f in pending if f._client._handle_or_none()}
        # Another thread may read the replies for us: wake up now and then.
        select.select(list(fds), [], [], 0.05 if left is None else min(left, 0.05))


def wait_all(futures: Iterable[Future[T]], timeout: Optional[float] = None) -> List[T]:
    """Results of futures, in their order (raises the first error); each
    waited for up to timeout seconds (None: without end)."""
    return [f.result(timeout) for f in futures]

"""Docstrings shared by the data operations, and the ``_async`` twins' texts."""

from __future__ import annotations

import re
from typing import Callable

from ._util import F

# What every data operation's docstring says of its ordering arguments
# (appended by _sync_doc, so that help() shows them on each).
_SYNC_DOC = """\
        wait_event: an event the daemon waits on before it starts: an
            :class:`Event`, its id, or a ``torch.cuda.Event(interprocess=True)``
            (registered on first use); None: none.
        record_event: an event (the same kinds) the daemon records when the
            work is done; None: none.
        reply_at_enqueue: reply once the work and its events are enqueued on
            the device, not when it is done (order later work by record_event).
"""
_STREAM_DOC = """\
        stream: the stream class the work runs in: "reload", "write",
            "offload", "d2d", or None for the operation's own.
        max_blocks: thread-block budget of its kernel (0: the stream class's).
"""
_COPY_ENGINE_DOC = """\
        copy_engine: True is path="copy-engine".
"""
_PATH_DOC = """\
        path: how rows move between host and device memory: "copy-engine"
            (or "copy_engine"), "kernel", or None for the daemon's choice (the
            copy engines there, kernels elsewhere); the result's path says
            which ran.
"""


_BLOCKS_PARAGRAPH = re.compile(r"\n\s*Blocks until the reply comes.*?:class:`Future`\.", re.S)


def _sync_doc(*parts: str) -> Callable[[F], F]:
    """Append the shared argument descriptions to a method's docstring."""
    def deco(fn: F) -> F:
        doc = (fn.__doc__ or "").rstrip()
        extra = "\n\n        Ordering:\n" + "".join(parts).rstrip()
        m = _BLOCKS_PARAGRAPH.search(doc)  # before "Blocks until the reply ..."
        fn.__doc__ = doc[:m.start()] + extra + doc[m.start():] if m else doc + extra
        return fn
    return deco


def _complete_async_docs(cls: type) -> None:
    """Give each blocking method and its ``_async`` twin the same text: the
    twin of one that has it says what it takes and how it returns."""
    for name, fn in list(vars(cls).items()):
        if not name.endswith("_async") or not callable(fn):
            continue
        sync = vars(cls).get(name[: -len("_async")])
        if sync is None or not callable(sync):
            continue
        sdoc = (sync.__doc__ or "").strip()
        adoc = (fn.__doc__ or "").strip()
        blocks = ("\n\n        Blocks until the reply comes (within the client's timeout); "
                  f"``{name}`` is the same call returning a :class:`Future`.")
        tail = ("\n\n        Returns at once: a :class:`Future` of what "
                f":meth:`{sync.__name__}` returns.")
        if sdoc and (not adoc or adoc.startswith("Like :meth:")):
            fn.__doc__ = _BLOCKS_PARAGRAPH.sub("", sdoc) + tail
        elif adoc and not sdoc:
            sync.__doc__ = adoc + blocks

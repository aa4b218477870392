"""Errors: the daemon's status codes as exceptions."""

from __future__ import annotations

from typing import Any, Tuple

from . import _capi as C


# ---------------------------------------------------------------------------
# Errors


class Error(Exception):
    """A failed kvdock call.

    Attributes:
        code: the status code (kvdock/status.h; the daemon's reply status or a
            local code such as ECONN).
        name: the code's symbolic name, e.g. ``"EINVAL"``.
        message: what exactly went wrong: the daemon's message, or the
            client library's.
    """

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.name = C.STATUS_NAMES.get(self.code, f"E{self.code}")
        self.message = message or _strerror(self.code)
        super().__init__(f"{self.name}: {self.message}")

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_make_error, (self.code, self.message))


class Timeout(Error, TimeoutError):
    """ETIMEDOUT from a blocking call (also a builtin TimeoutError)."""


def _make_error(code: int, message: str) -> Error:
    return (Timeout if code == C.ETIMEDOUT else Error)(code, message)


def _strerror(code: int) -> str:
    try:
        return str(C.load().kvd_strerror(code).decode())
    except Exception:
        return "error"


def _check(st: int, cli: Any) -> None:
    if st != C.OK:
        msg = C.load().kvd_client_last_error(cli)
        raise _make_error(st, msg.decode("utf-8", "replace") if msg else "")

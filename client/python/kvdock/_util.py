"""Optional imports (numpy, torch) and the small helpers every module shares."""

from __future__ import annotations

from typing import Any, Callable, TypeVar


__all__ = ["F", "T", "np", "_elsize", "_is_tensor", "_need_numpy", "_need_torch", "_torch"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

try:  # numpy is optional: without it, bytes-like objects and tensors (no torch path uses it)
    import numpy as np
except Exception:  # pragma: no cover - ImportError where numpy is absent, or a broken install
    np = None  # type: ignore[assignment]


def _torch() -> Any:
    """torch if it imports, else None (imported on first use only)."""
    try:
        import torch  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return None
    return torch


def _is_tensor(obj: Any) -> bool:
    # Cheap test that does not import torch.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


# ---------------------------------------------------------------------------
# Helpers


def _need_numpy() -> Any:
    if np is None:
        raise ImportError("numpy is needed for array views (apt-get install python3-numpy); "
                          "with PyTorch, the tensor views (tensor(), k_tensor(), v_tensor(), "
                          "Buffer.tensor()) need no numpy")
    return np


def _need_torch() -> Any:
    torch = _torch()
    if torch is None:
        raise ImportError("PyTorch is needed for tensor views")
    return torch


def _elsize(torch_dtype: Any) -> int:
    return int(_need_torch().empty((), dtype=torch_dtype).element_size())

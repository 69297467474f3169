"""Output allocation for every kernel launcher.

Launchers allocate outputs through ``empty``/``empty_like`` here, never ``torch.empty`` directly,
so the test suite can poison outputs (NaN / int max) and catch elements a kernel never writes.
"""

from __future__ import annotations

import torch

_poison = False


def set_poison(enabled: bool) -> bool:
    """Turn output poisoning on or off; returns the previous setting."""
    global _poison
    previous, _poison = _poison, bool(enabled)
    return previous


def poisoning() -> bool:
    """Whether outputs are being poisoned (launchers that allocate in C++ pass this on)."""
    return _poison


def poison_value(dtype: torch.dtype) -> float | int | bool:
    """The value poisoned outputs are filled with: NaN for floats, the max for integers."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def empty(shape, *, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.empty``, or a poisoned tensor while poisoning is on."""
    if _poison:
        return torch.full(tuple(shape), poison_value(dtype), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous tensor shaped like ``t`` (poisoned while poisoning is on)."""
    if _poison:
        return empty(t.shape, dtype=dtype or t.dtype, device=t.device)
    # torch.empty_like: about 1.1 us a call where ``empty(t.shape, ...)`` took 2.5
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)

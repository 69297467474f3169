"""Fused optimizers (FusedAdam, FusedAdamW).

``fusedops.optim.FusedAdam`` / ``FusedAdamW`` subclass ``torch.optim.Adam`` / ``AdamW`` (same
constructor and state_dict) and update all params of a (device, dtype) group in one kernel
launch. Loaded on first access.
"""

from __future__ import annotations

import importlib

_ATTRIBUTES = {"FusedAdam": "fusedops.optim.adam", "FusedAdamW": "fusedops.optim.adam"}

__all__ = sorted(_ATTRIBUTES)


def __getattr__(name: str):
    if name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fusedops.optim' has no attribute {name!r}")

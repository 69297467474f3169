"""Fused optimizers (FusedAdam, FusedAdamW).

``fusedops.optim.FusedAdam`` / ``FusedAdamW`` subclass ``torch.optim.Adam`` / ``AdamW`` (same
constructor and state_dict) and update all params of a (device, dtype) group in one kernel
launch. Loaded on first access.
"""

from __future__ import annotations

from fusedops._lazy import lazy_module

_ATTRIBUTES = {"FusedAdam": "fusedops.optim.adam", "FusedAdamW": "fusedops.optim.adam"}

__all__ = sorted(_ATTRIBUTES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES)

"""Fused optimizers (FusedAdam, FusedAdamW, FusedSGD), their sync-free names and the swap.

``fusedops.optim.FusedAdam`` / ``FusedAdamW`` / ``FusedSGD`` subclass ``torch.optim.Adam`` /
``AdamW`` / ``SGD`` (same constructor and state_dict) and update all params of a (device,
dtype) group in one kernel launch. ``fusedops.optim.syncfree`` names them ``Adam``, ``AdamW``
and ``SGD``; ``fuse_optimizer(optimizer)`` turns a torch Adam/AdamW/SGD instance into the fused
class in place. Loaded on first access.
"""

from __future__ import annotations

from fusedops._lazy import lazy_module

_ATTRIBUTES = {
    "FusedAdam": "fusedops.optim.adam",
    "FusedAdamW": "fusedops.optim.adam",
    "FusedSGD": "fusedops.optim.sgd",
    "fuse_optimizer": "fusedops.optim.swap",
    "unfusable_reason": "fusedops.optim.swap",
}
_SUBMODULES = ("syncfree",)

__all__ = sorted(_ATTRIBUTES) + list(_SUBMODULES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES, _SUBMODULES)

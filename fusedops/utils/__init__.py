"""Runtime utilities for training loops: ``multi_apply_multi_stream`` (a per-level head over
several CUDA streams; ``fusedops.utils.misc`` re-exports it under the seed runtime's path) and
``auto_checkpoint`` (activation checkpointing of repeated blocks to a memory budget; the model
is returned, ``checkpoint_plan(model)`` reads the plan, ``undo_checkpoint(model)`` restores it).
Names load on first access; importing this package imports nothing heavy."""

from __future__ import annotations

from fusedops._lazy import lazy_module

_ATTRIBUTES = {
    "multi_apply": "fusedops.utils.multi_stream",
    "multi_apply_multi_stream": "fusedops.utils.multi_stream",
    "auto_checkpoint": "fusedops.utils.checkpoint",
    "CheckpointPlan": "fusedops.utils.checkpoint",
    "checkpoint_plan": "fusedops.utils.checkpoint",
    "undo_checkpoint": "fusedops.utils.checkpoint",
}

__all__ = sorted(_ATTRIBUTES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES)

"""Swin: ``fused_subclass``, which the fused model classes
(``fusedops.integrations.transformers.swin``, ``fusedops.integrations.timm.swin``) are built
with. Their attention calls ``fusedops.ops.window_attention``'s ``attention_core``.

Re-exports (``__reexports__``; their earlier import path, kept): ``WindowProcess`` and
``WindowProcessReverse`` (home: ``fusedops.nn.window_process``), ``FusedSwinFmha`` (home:
``fusedops.nn.fmha``), the seed runtime's module paths.
"""

from __future__ import annotations

from fusedops.nn import _fused_class
from fusedops.nn.fmha import FusedSwinFmha
from fusedops.nn.window_process import WindowProcess, WindowProcessReverse

__all__ = ["FusedSwinFmha", "WindowProcess", "WindowProcessReverse"]
__reexports__ = __all__


def fused_subclass(original: type, recognise) -> type | str:
    """A subclass of ``original`` with the attributes ``recognise(original)`` returns (a dict,
    e.g. ``{"forward": ...}``), ``original`` itself if it is already fused, or the reason (a
    str) why it has no fused version. Same name, constructor and state_dict;
    ``isinstance(m, original)`` holds; ``_fusedops_original`` is the class it replaces."""
    if original.__dict__.get("_fusedops_fused", False):
        return original
    attributes = recognise(original)
    if isinstance(attributes, str):
        return attributes
    return _fused_class.fused_subclass(original, attributes, "fusedops' Swin window ops")

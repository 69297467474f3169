"""Hooks on ``timm`` classes (added to hooks defined elsewhere with ``contribute``). Never
imports torch or timm: the replacements are resolved when a patch is applied.
"""

from __future__ import annotations

from typing import Any

from fusedops.hooks.lib_transformers import swin_fused_class, swin_swap
from fusedops.hooks.machinery import Target, contribute, installed

# Swin (the "swin" hook): timm.models.swin_transformer's block (its ``_attn``: shift +
# partition / reverse + unshift as the fused gathers) and WindowAttention (the fused softmax).

SWIN_TIMM_CLASSES = (
    ("timm.models.swin_transformer", "SwinTransformerBlock"),
    ("timm.models.swin_transformer", "WindowAttention"),
)
_RECOGNISE_TIMM = "fusedops.nn.swin_timm:recognise"


def _swin_targets(**_: Any) -> list[Target]:
    if not installed("timm"):
        return []
    make = swin_fused_class(_RECOGNISE_TIMM)
    return [Target(module, attr, make) for module, attr in SWIN_TIMM_CLASSES]


contribute("swin", _swin_targets, swin_swap(SWIN_TIMM_CLASSES, _RECOGNISE_TIMM))

"""Hooks on ``timm`` classes (added to hooks defined elsewhere with ``contribute``). Never
imports torch or timm: the replacements are resolved when a patch is applied.
"""

from __future__ import annotations

from fusedops.hooks.lib_transformers import swin_patches
from fusedops.hooks.machinery import contribute

# Swin (the "swin" hook): timm.models.swin_transformer's block (its ``_attn``: shift +
# partition / reverse + unshift as the fused gathers) and WindowAttention (the fused softmax).

SWIN_TIMM_CLASSES = (
    ("timm.models.swin_transformer", "SwinTransformerBlock"),
    ("timm.models.swin_transformer", "WindowAttention"),
)
_SWIN = swin_patches(SWIN_TIMM_CLASSES, "fusedops.nn.swin_timm:recognise")
contribute("swin", _SWIN.targets, _SWIN.swap, package="timm")

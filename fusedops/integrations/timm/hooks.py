"""timm's contributions to the hooks. Never imports torch or timm: the replacements are
resolved when a patch is applied.
"""

from __future__ import annotations

from fusedops.hooks.machinery import contribute
from fusedops.hooks.registry import swin_patches

# Swin (the "swin" hook): timm.models.swin_transformer's block (its ``_attn``: shift +
# partition / reverse + unshift as the fused gathers) and WindowAttention (the fused softmax),
# by the fused classes of ``swin.py``.

SWIN_TIMM_CLASSES = (
    ("timm.models.swin_transformer", "SwinTransformerBlock"),
    ("timm.models.swin_transformer", "WindowAttention"),
)
_SWIN = swin_patches(SWIN_TIMM_CLASSES, "fusedops.integrations.timm.swin:recognise")
contribute("swin", _SWIN.targets, _SWIN.swap, package="timm")

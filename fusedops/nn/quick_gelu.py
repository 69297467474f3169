"""QuickGELU modules: ``fusedops.nn.QuickGELU`` (also ``QuickGelu``, the seed runtime's
spelling: ``from torchacc.runtime.nn.quick_gelu import QuickGelu`` ports as ``from
fusedops.nn.quick_gelu import QuickGelu``) and the classes the quick_gelu hook swaps in."""

from __future__ import annotations

import torch
from torch import nn

from fusedops.nn import _fused_class
from fusedops.ops.quick_gelu import quick_gelu

__all__ = ["QuickGELU", "QuickGelu"]


def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
    return quick_gelu(x)


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 * x)`` (CLIP's activation) through ``fusedops.quick_gelu``.

    Input: any shape, float16/bfloat16/float32; output: same shape and dtype.
    """

    _fusedops_fused = True
    forward = _fused_forward


#: The seed runtime's spelling of the same class.
QuickGelu = QuickGELU


class GELUAsQuickGELU(nn.GELU):
    """An ``nn.GELU`` that computes QuickGELU instead: only used when explicitly asked for
    (``enable_quick_gelu(gelu=True)``), since the two functions differ."""

    _fusedops_fused = True
    forward = _fused_forward


def fused_subclass(original: type) -> type:
    """A subclass of a user's QuickGELU class whose forward runs ``fusedops.quick_gelu``
    (same name, constructor and state_dict; ``isinstance(m, original)`` still holds)."""
    return _fused_class.fused_subclass(original, {"forward": _fused_forward}, "fusedops.quick_gelu")

"""QuickGELU modules: ``fusedops.nn.QuickGELU`` and the classes the quick_gelu hook swaps in."""

from __future__ import annotations

import torch
from torch import nn

from fusedops.ops.quick_gelu import quick_gelu

_fused_subclasses: dict[type, type] = {}


def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
    return quick_gelu(x)


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 * x)`` (CLIP's activation) through ``fusedops.quick_gelu``.

    Input: any shape, float16/bfloat16/float32; output: same shape and dtype.
    """

    _fusedops_fused = True
    forward = _fused_forward


class GELUAsQuickGELU(nn.GELU):
    """An ``nn.GELU`` that computes QuickGELU instead: only used when explicitly asked for
    (``enable_quick_gelu(gelu=True)``), since the two functions differ."""

    _fusedops_fused = True
    forward = _fused_forward


def fused_subclass(original: type) -> type:
    """A subclass of a user's QuickGELU class whose forward runs ``fusedops.quick_gelu``
    (same name, constructor and state_dict; ``isinstance(m, original)`` still holds)."""
    if original.__dict__.get("_fusedops_fused", False):
        return original
    fused = _fused_subclasses.get(original)
    if fused is None:
        fused = type(
            original.__name__,
            (original,),
            {
                "forward": _fused_forward,
                "_fusedops_fused": True,
                "__module__": original.__module__,
                "__qualname__": original.__qualname__,
                "__doc__": f"{original.__qualname__} computed by fusedops.quick_gelu.",
            },
        )
        _fused_subclasses[original] = fused
    return fused

"""``fusedops.nn.BiasDropoutAdd`` and the seed runtime's functional names."""

from __future__ import annotations

import torch
from torch import nn

from fusedops.ops.bias_dropout_add import _check_probability, bias_dropout_add, dropout_add

__all__ = ["BiasDropoutAdd", "dropout_add_fused", "dropout_add_fused_train"]


class BiasDropoutAdd(nn.Module):
    """``residual + dropout(x + bias, p)`` through ``fusedops.bias_dropout_add``: dropout in
    training mode only (``model.train()`` / ``model.eval()``); no parameters or buffers.

    forward(x, bias, residual): x (..., H) float16/bfloat16/float32, bias (H,) or None,
    residual broadcastable to x's shape; returns x's shape in residual's dtype.
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = _check_probability(p, "p")

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
    ) -> torch.Tensor:
        return bias_dropout_add(x, bias, residual, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def dropout_add_fused_train(x: torch.Tensor, to_add: torch.Tensor, drop_rate: float):
    """``to_add + dropout(x, drop_rate)`` in training mode (no bias); x (..., H) float,
    to_add broadcastable to x's shape; returns x's shape in to_add's dtype."""
    return dropout_add(x, to_add, drop_rate, training=True)


def dropout_add_fused(x: torch.Tensor, to_add: torch.Tensor, drop_rate: float):
    """``to_add + x``: the inference form of ``dropout_add_fused_train`` (drop_rate is
    checked, nothing is dropped)."""
    return dropout_add(x, to_add, drop_rate, training=False)

"""Bias-dropout-add on the CUDA extension: allocates outputs and workspaces, calls
bias_dropout_add.cu's launchers (the mask: ops/bias_dropout_add.py). The kernels read the bias
in fp32 (another dtype is converted here: H elements) and return grad_bias in fp32 (converted
back here)."""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library
from fusedops.kernels.device import multiprocessors
from fusedops.kernels.shared import philox

#: Row groups of the grad_bias reduction: enough blocks to fill the GPU, at most this many
#: partial rows (each column adds them in order at the end).
MAX_GROUPS = 1024
BLOCKS_PER_SM = 4


def _dropout_args(seed, p: float) -> tuple:
    mode = philox.dropout_mode(p, seed is not None)
    return seed, philox.keep_threshold(p), philox.dropout_scale(p), mode


def _row_groups(rows: int, cols: int, device: torch.device) -> int:
    """Row groups (blocks along rows, = partial rows) of the backward for (rows, cols)."""
    blocks_per_group = -(-cols // 1024)  # a block covers up to 1024 columns
    wanted = BLOCKS_PER_SM * multiprocessors(device) // blocks_per_group
    return max(1, min(rows, MAX_GROUPS, wanted))


def forward(x, bias, residual, seed, p: float) -> torch.Tensor:
    """residual + dropout(x + bias); x contiguous (..., H) CUDA fp16/bf16/fp32, bias (H,) or
    None, residual contiguous of x's shape; out like x in residual's dtype."""
    out = _alloc.empty_like(x, dtype=residual.dtype)
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()
    library().bias_dropout_add_forward(x, bias, residual, out, *_dropout_args(seed, p))
    return out


def backward(grad, seed, p: float, x_dtype, bias_dtype):
    """(grad_x, grad_bias): dropout(grad) in x_dtype, and its sum over the leading dims in
    bias_dtype (None without a bias); grad contiguous (..., H)."""
    grad_x = _alloc.empty_like(grad, dtype=x_dtype)
    args = _dropout_args(seed, p)
    if bias_dtype is None:
        library().bias_dropout_add_forward(grad, None, None, grad_x, *args)
        return grad_x, None
    cols = grad.shape[-1] if grad.dim() else 1
    rows = grad.numel() // cols if cols else 0
    if rows == 0:
        return grad_x, torch.zeros((cols,), dtype=bias_dtype, device=grad.device)
    f32 = {"dtype": torch.float32, "device": grad.device}
    partial = _alloc.empty((_row_groups(rows, cols, grad.device), cols), **f32)
    grad_bias = _alloc.empty((cols,), **f32)
    library().bias_dropout_add_backward(grad, grad_x, partial, grad_bias, *args)
    return grad_x, grad_bias.to(bias_dtype)

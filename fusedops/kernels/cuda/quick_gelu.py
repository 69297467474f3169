"""QuickGELU on the CUDA extension: allocates outputs, calls quick_gelu.cu's launchers."""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library


def forward(x: torch.Tensor) -> torch.Tensor:
    """y = x * sigmoid(1.702 x); x contiguous CUDA fp16/bf16/fp32, y like x."""
    y = _alloc.empty_like(x)
    library().quick_gelu_forward(x, y)
    return y


def backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dx for QuickGELU; grad and x contiguous, same shape and dtype."""
    dx = _alloc.empty_like(x)
    library().quick_gelu_backward(grad, x, dx)
    return dx

"""Swin attention softmax on the CUDA extension: allocates outputs, calls swin_softmax.cu."""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library
from fusedops.kernels.shared.swin_chunks import backward_chunks

ROWS_PER_BLOCK = 16  # about the rows one block of the backward kernel takes (its chunk estimate)


def forward(attn: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Probabilities (attn's shape and dtype); attn (B*nW, heads, N, N) contiguous CUDA, bias
    (heads, N, N) and mask (nW, N, N) or None contiguous fp32."""
    out = _alloc.empty_like(attn)
    library().swin_softmax_forward(attn, bias, mask, out)
    return out


def backward(grad: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_attn like probs, d_bias (heads, N, N) fp32); grad and probs contiguous, same
    non-empty shape."""
    d_attn = _alloc.empty_like(probs)
    windows, heads, n = probs.shape[0], probs.shape[1], probs.shape[-1]
    row_groups = -(-heads * n // ROWS_PER_BLOCK)
    chunks = backward_chunks(windows, row_groups, probs.device)
    partial = _alloc.empty((chunks, heads, n, n), dtype=torch.float32, device=probs.device)
    library().swin_softmax_backward(grad, probs, d_attn, partial)
    return d_attn, partial.sum(dim=0)

"""QuickGELU Triton kernels: one program per BLOCK elements, math in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc

ALPHA = 1.702
BLOCK = 1024


@triton.jit
def _forward_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = x / (1.0 + tl.exp(-alpha * x))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(grad_ptr, x_ptr, dx_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-alpha * x))
    dx = grad * (s + alpha * x * s * (1.0 - s))
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    """y = x * sigmoid(1.702 x); x contiguous fp16/bf16/fp32, y like x."""
    y = _alloc.empty_like(x)
    n = x.numel()
    if n:
        _forward_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, ALPHA, BLOCK=BLOCK)
    return y


def backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dx for QuickGELU; grad and x contiguous, same shape and dtype."""
    dx = _alloc.empty_like(x)
    n = x.numel()
    if n:
        _backward_kernel[(triton.cdiv(n, BLOCK),)](grad, x, dx, n, ALPHA, BLOCK=BLOCK)
    return dx

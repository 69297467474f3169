"""LayerNorm and RMSNorm on the CUDA extension: one call per direction into
layer_norm_bindings.cpp, which allocates the outputs and workspaces and calls layer_norm.cu's
launchers (same algorithm as the Triton kernels; see layer_norm.cu).

The kernels read weight and bias in fp32 or in x's dtype (one dtype for both) and write
dweight/dbias in that dtype; other parameter dtypes are converted to fp32 here, and their
gradients back. RMSNorm's y (and dy) is x's dtype or fp32 in the kernels: another ``out_dtype``
is computed as fp32 and converted here (the same bits: the kernels round their fp32 result once
to y's dtype either way), another dy dtype is converted to fp32 first.
"""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library

#: Rows up to this length (and at most 8192) are held in registers; longer rows take the looped
#: path. Read at every call, so tests can force the looped path with small rows.
MAX_REGISTER_N = 8192
#: Rows read and written 16 bytes at a time (4 fp32 / 8 fp16 or bf16 elements; the register
#: path, and since 2026-12-06 the looped path's three kernels, never run on a GPU yet)
#: where N is a multiple of that, the row tensors are 16-byte aligned and y / dy have x's dtype;
#: else one element per access. Read at every call (tests turn it off to check the one-element
#: path). On since its gpu tests (``test_cuda_cpp_op[vector-*]``, 108 cases, and the misaligned
#: and several-rows-a-block cases) passed on an H100 on 2026-11-26 (commit 5407f9f); its speed
#: against one element per access is owed (``benchmarks/tune_layer_norm.py``, rows "cuda vec16").
VECTOR_ACCESS = True


def takes_params(x, weight, bias) -> bool:
    """Whether the kernels read weight and bias as they are: absent, or one dtype for both that
    is fp32 or x's dtype."""
    dtypes = {p.dtype for p in (weight, bias) if p is not None}
    return len(dtypes) <= 1 and dtypes <= {torch.float32, x.dtype}


def _kernel_params(x, weight, bias):
    """weight and bias in a dtype the kernels read: as given where possible, else both
    converted to fp32."""
    if takes_params(x, weight, bias):
        return weight, bias
    return tuple(None if p is None else p.float().contiguous() for p in (weight, bias))


def norm_with_autograd(x, weight, bias, n: int, eps: float, rms: bool):
    """LayerNorm (RMSNorm if rms; bias None) over the trailing dims of x holding n elements,
    as one call into the extension whose autograd is in C++ (no Python in the backward): x any
    shape (CUDA fp16/bf16/fp32), weight/bias n elements as ``takes_params`` allows. Returns y
    in x's shape and dtype."""
    return library().norm(
        x, weight, bias, n, eps, rms, MAX_REGISTER_N, _alloc.poisoning(), VECTOR_ACCESS
    )


def _forward(x, weight, bias, eps: float, rms: bool, out_dtype=None, xhat_dtype=None):
    weight, bias = _kernel_params(x, weight, bias)
    out_dtype = out_dtype or x.dtype
    kernel_out = out_dtype if out_dtype in (x.dtype, torch.float32) else torch.float32
    y, mean, rstd = library().layer_norm_forward(
        x,
        weight,
        bias,
        eps,
        rms,
        MAX_REGISTER_N,
        _alloc.poisoning(),
        kernel_out,
        xhat_dtype,
        VECTOR_ACCESS,
    )
    return y.to(out_dtype), mean, rstd


def _backward(dy, x, weight, bias, mean, rstd, rms: bool, xhat_dtype=None):
    kernel_weight, kernel_bias = _kernel_params(x, weight, bias)
    if dy.dtype not in (x.dtype, torch.float32):
        dy = dy.float()
    dx, dweight, dbias = library().layer_norm_backward(
        dy,
        x,
        kernel_weight,
        kernel_bias,
        mean,
        rstd,
        rms,
        MAX_REGISTER_N,
        _alloc.poisoning(),
        xhat_dtype,
        VECTOR_ACCESS,
    )
    dweight = None if weight is None else dweight.to(weight.dtype)
    dbias = None if bias is None else dbias.to(bias.dtype)
    return dx, dweight, dbias


def layer_norm_forward(x, weight, bias, eps: float):
    """LayerNorm of the rows of x (M, N) contiguous CUDA fp16/bf16/fp32; weight, bias (N,) or
    None. Returns y (M, N) in x's dtype, mean (M,) fp32, rstd (M,) fp32."""
    return _forward(x, weight, bias, eps, rms=False)


def layer_norm_backward(dy, x, weight, bias, mean, rstd):
    """dx (like x), dweight (like weight, or None), dbias (like bias, or None)."""
    return _backward(dy, x, weight, bias, mean, rstd, rms=False)


def rms_norm_forward(x, weight, eps: float, out_dtype=None, xhat_dtype=None):
    """RMSNorm of the rows of x (M, N); weight (N,) or None. Returns y (M, N) in out_dtype
    (default x's), xhat rounded to xhat_dtype (None: not rounded) before the weight multiply,
    and rstd (M,) fp32."""
    y, _, rstd = _forward(x, weight, None, eps, True, out_dtype, xhat_dtype)
    return y, rstd


def rms_norm_backward(dy, x, weight, rstd, xhat_dtype=None):
    """dx (like x) and dweight (like weight, or None); dy (M, N) in y's dtype."""
    dx, dweight, _ = _backward(dy, x, weight, None, None, rstd, True, xhat_dtype)
    return dx, dweight

"""LayerNorm and RMSNorm on the CUDA extension: allocates outputs and workspaces, calls
layer_norm.cu's launchers (same algorithm as the Triton kernels; see layer_norm.cu).

Parameters go to the kernels in fp32 (converted here when they are not); dweight/dbias come back
in fp32 and are converted to the parameters' dtypes.
"""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library

#: Rows up to this length (and at most 8192) are held in registers; longer rows take the looped
#: path. Read at every call, so tests can force the looped path with small rows.
MAX_REGISTER_N = 8192


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float().contiguous()


def _partial_rows(x: torch.Tensor) -> int:
    """Blocks of the backward = fp32 partial rows of the dweight/dbias reduction."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    return max(1, min(x.shape[0], 2 * sms, 65535))


def _forward(x, weight, bias, eps: float, rms: bool):
    M, _ = x.shape
    y = _alloc.empty_like(x)
    mean = _alloc.empty((0 if rms else M,), dtype=torch.float32, device=x.device)
    rstd = _alloc.empty((M,), dtype=torch.float32, device=x.device)
    library().layer_norm_forward(
        x, _f32(weight), _f32(bias), y, None if rms else mean, rstd, eps, rms, MAX_REGISTER_N
    )
    return y, mean, rstd


def _backward(dy, x, weight, bias, mean, rstd, rms: bool):
    M, N = x.shape
    dx = _alloc.empty_like(x)
    has_weight, has_bias = weight is not None, bias is not None
    if M == 0:
        dweight = torch.zeros_like(weight) if has_weight else None
        dbias = torch.zeros_like(bias) if has_bias else None
        return dx, dweight, dbias
    P = _partial_rows(x)
    f32 = dict(dtype=torch.float32, device=x.device)
    dw_partial = _alloc.empty((P, N), **f32) if has_weight else None
    db_partial = _alloc.empty((P, N), **f32) if has_bias else None
    dweight = _alloc.empty((N,), **f32) if has_weight else None
    dbias = _alloc.empty((N,), **f32) if has_bias else None
    coeffs = _alloc.empty((2, M), **f32)
    library().layer_norm_backward(
        dy, x, _f32(weight), None if rms else mean, rstd, dx,
        dw_partial, db_partial, dweight, dbias, coeffs, rms, MAX_REGISTER_N,
    )  # fmt: skip
    if has_weight:
        dweight = dweight.to(weight.dtype)
    if has_bias:
        dbias = dbias.to(bias.dtype)
    return dx, dweight, dbias


def layer_norm_forward(x, weight, bias, eps: float):
    """LayerNorm of the rows of x (M, N) contiguous CUDA fp16/bf16/fp32; weight, bias (N,) or
    None. Returns y (M, N) in x's dtype, mean (M,) fp32, rstd (M,) fp32."""
    return _forward(x, weight, bias, eps, rms=False)


def layer_norm_backward(dy, x, weight, bias, mean, rstd):
    """dx (like x), dweight (like weight, or None), dbias (like bias, or None)."""
    return _backward(dy, x, weight, bias, mean, rstd, rms=False)


def rms_norm_forward(x, weight, eps: float):
    """RMSNorm of the rows of x (M, N); weight (N,) or None. Returns y, rstd (M,) fp32."""
    y, _, rstd = _forward(x, weight, None, eps, rms=True)
    return y, rstd


def rms_norm_backward(dy, x, weight, rstd):
    """dx (like x) and dweight (like weight, or None)."""
    dx, dweight, _ = _backward(dy, x, weight, None, None, rstd, rms=True)
    return dx, dweight

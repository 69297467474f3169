"""Window attention on the CUDA extension: cuBLAS batched products (torch matmuls) around the
fused softmax kernels of window_attention.cu.

Forward: ``S = q k^T`` (fp32 output), the softmax kernel adds ``S * scale + bias + mask`` and
writes P (input dtype) and lse, then ``out = P v``. Backward: ``S`` and ``dP = dO v^T`` (fp32),
the backward kernel writes P, ``dS * scale`` and the d_bias partials, then ``dv = P^T dO``,
``dq = dS k``, ``dk = dS^T q``; the partials are summed over their groups in a fixed order.
Unlike the Triton kernels this path writes the (Z, H, N, N) scores to memory.
"""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library
from fusedops.kernels.device import groups_to_fill, multiprocessors

#: Warps the backward kernel aims for per SM (each loops over windows g, g + G, ...).
WARPS_PER_SM = 32


def _scores_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for (Z, H, N, x) @ (Z, H, x, N) with an fp32 result (fp32 accumulation)."""
    if a.dtype == torch.float32:
        return torch.matmul(a, b)
    batch = a.shape[:-2]
    a3 = a.reshape(-1, *a.shape[-2:])
    b3 = b.reshape(-1, *b.shape[-2:])
    return torch.bmm(a3, b3, out_dtype=torch.float32).view(*batch, a.shape[-2], b.shape[-1])


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.float().contiguous() if t is not None else None


def _groups(q: torch.Tensor) -> int:
    """Window groups of the d_bias reduction: fixed per device and shape (same bits each run)."""
    windows, heads, n = q.shape[:3]
    if windows == 0:
        return 0
    return groups_to_fill(windows, heads * n, WARPS_PER_SM * multiprocessors(q.device))


def forward(q, k, v, bias, mask, scale):
    """(out, lse) of window attention; q, k, v (Z, H, N, d) CUDA, any strides."""
    windows, heads, n, _ = q.shape
    lse = _alloc.empty((windows, heads, n), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return _alloc.empty(q.shape, dtype=q.dtype, device=q.device), lse
    scores = _scores_f32(q, k.transpose(-1, -2))
    probs = _alloc.empty(scores.shape, dtype=q.dtype, device=q.device)
    library().window_attention_softmax_forward(
        scores, _float(bias), _float(mask), scale, probs, lse
    )
    return torch.matmul(probs, v).contiguous(), lse


def backward(dout, q, k, v, bias, mask, lse, scale, bias_grad):
    """(dq, dk, dv, dbias) of window attention (dbias None unless ``bias_grad``)."""
    windows, heads, n, _ = q.shape
    groups = _groups(q)
    bias_grad = bias_grad and bias is not None
    if q.numel() == 0:
        dbias = torch.zeros_like(bias) if bias_grad else None
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dbias
    scores = _scores_f32(q, k.transpose(-1, -2))
    dprobs = _scores_f32(dout, v.transpose(-1, -2))
    probs = _alloc.empty(scores.shape, dtype=q.dtype, device=q.device)
    dscores = _alloc.empty(scores.shape, dtype=q.dtype, device=q.device)
    partial = (
        _alloc.empty((groups, heads, n, n), dtype=torch.float32, device=q.device)
        if bias_grad
        else None
    )
    library().window_attention_softmax_backward(
        scores, dprobs, _float(bias), _float(mask), lse, scale, probs, dscores, partial, groups
    )
    dv = torch.matmul(probs.transpose(-1, -2), dout)
    dq = torch.matmul(dscores, k)
    dk = torch.matmul(dscores.transpose(-1, -2), q)
    dbias = partial.sum(dim=0).to(bias.dtype) if bias_grad else None
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dbias

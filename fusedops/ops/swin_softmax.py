"""Swin attention softmax: ``softmax(attn + bias[None] + mask[window][:, None])`` in one pass.

attn: (B*nW, heads, N, N) scores; bias: (heads, N, N) relative-position bias; mask: (nW, N, N)
or None, window b of the batch using ``mask[b % nW]`` (the windows of one image are
consecutive, as Swin lays them out). Per row, in fp32 (fp64 for fp64 inputs on the reference
backend): ``z = attn + bias + mask``, ``p = exp(z - max z) / sum exp(z - max z)``; a row whose
every entry is -inf (max -inf) gives zeros, not NaN; a row holding NaN or +inf gives NaN, as
torch.softmax (``ops/_swin.py``, the rule every backend follows). Output in attn's dtype.

Backward from the saved output p: ``dz = p * (dp - sum(dp * p))``; ``d_attn = dz`` (attn's
dtype) and ``d_bias = sum over the B*nW windows of dz`` (fp32), reduced deterministically
(per-program fp32 partial sums, then one fixed-order sum). The mask gets no gradient.

Every backend exposes ``forward(attn, bias, mask) -> probs`` with contiguous inputs, bias and
mask already in the compute dtype (fp32; fp64 with fp64 attn), and
``backward(grad, probs) -> (d_attn, d_bias)``.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): in plain eager
mode the additions and torch's softmax (``_swin.native_softmax``) with torch's autograd (form
(b)); the custom op keeps the reference's formula (no native namespace).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.ops._checks import check_same_device, check_tensor
from fusedops.ops._define import define_module_op
from fusedops.ops._dtypes import as_dtype, compute_dtype
from fusedops.ops._eager import eager_fast_path
from fusedops.ops._swin import add_window_mask, masked_softmax, native_softmax

__all__ = ["swin_attention_softmax"]

#: Largest N (window_len) each kernel backend takes (one row of N scores held in registers).
MAX_N = {"triton": 4096, "cuda": 1024}

# ------------------------------------------------------------------------------------------
# Reference (plain PyTorch): the CPU path and the test oracle.


def _ref_forward(attn, bias, mask):
    z = attn.to(compute_dtype(attn.dtype)) + bias
    if mask is not None:
        z = add_window_mask(z, mask)
    return masked_softmax(z).to(attn.dtype)


def _ref_backward(grad, probs):
    p = probs.to(compute_dtype(probs.dtype))
    g = grad.to(p.dtype)
    dz = p * (g - (p * g).sum(dim=-1, keepdim=True))
    return dz.to(probs.dtype), dz.sum(dim=0)


reference = SimpleNamespace(forward=_ref_forward, backward=_ref_backward)


def unsupported_reasons(backend: str, attn: torch.Tensor) -> list[str]:
    """Why ``backend`` cannot take the scores ``attn`` ``(B*nW, heads, N, N)`` (empty list: it
    can): each kernel holds a row of N scores in registers, up to ``MAX_N[backend]``; native and
    reference take any N."""
    limit = MAX_N.get(backend)
    if limit is not None and attn.shape[-1] > limit:
        return [f"window_len N={attn.shape[-1]} > {limit}, the {backend} kernel's limit"]
    return []


dispatch.register_op(
    "swin_attention_softmax",
    reference,
    kernels="swin_softmax",
    unsupported_reasons=unsupported_reasons,
)


# ------------------------------------------------------------------------------------------
# The custom op.


def _forward(
    attn: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, backend: str | None
) -> torch.Tensor:
    impl = dispatch.select("swin_attention_softmax", attn, backend=backend)
    if attn.numel() == 0:
        return torch.empty_like(attn)
    return impl.forward(attn, bias, mask)


def _backward_body(
    grad: torch.Tensor, probs: torch.Tensor, backend: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("swin_attention_softmax", probs, backend=backend)
    if probs.numel() == 0:  # no windows (or heads): nothing to launch, a zero bias gradient
        d_bias = probs.new_zeros(probs.shape[1:], dtype=compute_dtype(probs.dtype))
        return torch.empty_like(probs), d_bias
    return impl.backward(grad.contiguous(), probs)


def _forward_fake(attn, bias, mask, backend):
    return torch.empty_like(attn, memory_format=torch.contiguous_format)


def _backward_fake(grad, probs, backend):
    d_bias = probs.new_empty(probs.shape[1:], dtype=compute_dtype(probs.dtype))
    return torch.empty_like(probs, memory_format=torch.contiguous_format), d_bias


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


SWIN_ATTENTION_SOFTMAX = define_module_op("swin_attention_softmax", globals())


def swin_attention_softmax(
    attn: torch.Tensor,
    relative_pos_bias: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``softmax(attn + relative_pos_bias[None] + attn_mask[b % nW][:, None])`` over the last dim.

    attn: (B*nW, heads, N, N) float16/bfloat16/float32 (float64 on the reference backend).
    relative_pos_bias: (heads, N, N), any float dtype; gets a gradient (summed over windows).
    attn_mask: (nW, N, N) any float dtype, or None; nW must divide attn's first dim; no gradient
    (Swin's -100 shift mask and -inf masks both work; a fully -inf row gives zeros, a row
    holding NaN or +inf gives NaN as torch.softmax).
    Returns a contiguous tensor of attn's shape and dtype; statistics in fp32.
    """
    check_tensor(attn, "attn")
    check_tensor(relative_pos_bias, "relative_pos_bias")
    if attn.dim() != 4 or attn.shape[2] != attn.shape[3]:
        raise ValueError(f"attn must be 4-D (B*nW, heads, N, N), got shape {tuple(attn.shape)}")
    heads, n = attn.shape[1], attn.shape[2]
    if tuple(relative_pos_bias.shape) != (heads, n, n):
        raise ValueError(
            f"relative_pos_bias must have shape (heads, N, N) = {(heads, n, n)}, "
            f"got {tuple(relative_pos_bias.shape)}"
        )
    check_same_device(attn, "attn", relative_pos_bias=relative_pos_bias, attn_mask=attn_mask)
    dtype = compute_dtype(attn.dtype)
    if attn_mask is not None:
        check_tensor(attn_mask, "attn_mask")
        if attn_mask.dim() != 3 or tuple(attn_mask.shape[1:]) != (n, n) or attn_mask.shape[0] < 1:
            raise ValueError(
                f"attn_mask must have shape (nW, N, N) with N={n}, got {tuple(attn_mask.shape)}"
            )
        if attn.shape[0] % attn_mask.shape[0]:
            raise ValueError(
                f"attn has {attn.shape[0]} windows in its first dim, not a multiple of "
                f"attn_mask's nW={attn_mask.shape[0]}"
            )
        if attn_mask.requires_grad:
            raise ValueError("attn_mask requires grad, but the op gives no gradient for the mask")
        attn_mask = as_dtype(attn_mask, dtype).contiguous()
    bias = as_dtype(relative_pos_bias, dtype).contiguous()
    attn = attn.contiguous()
    if (
        eager_fast_path(attn, bias, attn_mask)
        and dispatch.pick("swin_attention_softmax", attn, backend=backend) == "native"
    ):
        # torch's softmax with torch's autograd; _safe_softmax gives fully masked rows zeros
        z = as_dtype(attn, dtype) + bias
        if attn_mask is not None:
            z = add_window_mask(z, attn_mask)
        return as_dtype(native_softmax(z), attn.dtype)
    return SWIN_ATTENTION_SOFTMAX(attn, bias, attn_mask, backend)

"""Window attention (Swin): ``softmax(q @ k^T * scale + bias + mask) @ v`` per window and head.

Shapes: q, k, v ``(Z, H, N, d)`` with ``Z = batch * nW`` windows (windows of one image
consecutive, as Swin lays them out), H heads, N tokens per window, d the head dim;
relative_pos_bias ``(H, N, N)`` shared by every window; attn_mask ``(nW, N, N)``, window ``z``
using ``attn_mask[z % nW]``. The output is ``(Z, H, N, d)`` in q's dtype.

Softmax statistics are fp32 (fp64 for fp64 inputs on the reference backend). A query row whose
scores are all -inf (fully masked: its max is -inf) gives a zero output row and zero gradients,
never NaN; its saved logsumexp is +inf so that ``exp(s - lse)`` is 0 everywhere in the
backward. A row holding a NaN or +inf score gives a NaN output row, as torch.softmax would
(``ops/_swin.py``: the rule every backend follows).

Backward: ``P = exp(S - lse)``, ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(P dP))``
(every backend takes the rowsum from P dP, not from dO * O with O rounded), ``dQ = dS K * scale``,
``dK = dS^T Q * scale`` and ``d_bias = sum over windows of dS`` (deterministic: per-program fp32
partials, then one fixed-order sum). The mask gets no gradient.

Every backend exposes ``forward(q, k, v, bias, mask, scale) -> (out, lse)`` (lse ``(Z, H, N)``)
and ``backward(dout, q, k, v, bias, mask, lse, scale, bias_grad) -> (dq, dk, dv, dbias)``
(dbias None unless ``bias_grad``; the output is not an argument, nor saved: no backend needs
it). q, k, v and dout may be strided views (last dim stride 1 for the kernels); bias and mask
are contiguous.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): in plain eager
mode matmul + torch's softmax (``_swin.native_softmax``) + matmul with torch's autograd (form
(b)); the custom op (torch.compile, export, XLA) keeps the reference's formula (matmul +
softmax: no native namespace).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.ops._checks import check_same_device, check_tensor
from fusedops.ops._define import define_module_op
from fusedops.ops._dtypes import as_dtype, compute_dtype
from fusedops.ops._eager import eager_fast_path
from fusedops.ops._swin import add_window_mask, native_softmax, shifted_exp
from fusedops.ops.swin_softmax import swin_attention_softmax

__all__ = ["window_attention"]

#: Largest window (tokens per window) the kernels take.
MAX_TOKENS = 256
#: Head dims the kernels take.
HEAD_DIMS = (16, 32, 64, 128)
#: dtypes of bias and mask the kernels read (converted to fp32 as they are read).
KERNEL_PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# ------------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch): the CPU path and the test oracle.


def _scores(q, k, bias, mask, scale, scale_q=False):
    """``q @ k^T * scale + bias + mask[z % nW]`` in the compute dtype, (Z, H, N, N);
    ``scale_q``: scaling q before the product instead, ``(q * scale) @ k^T`` (the order of
    Swin's attention modules: a (N, d) product a window where the scores are (N, N))."""
    c = compute_dtype(q.dtype)
    q, kt = as_dtype(q, c), as_dtype(k, c).transpose(-1, -2)
    s = torch.matmul(q * scale, kt) if scale_q else torch.matmul(q, kt) * scale
    if bias is not None:
        s = s + as_dtype(bias, c)
    if mask is not None:
        s = add_window_mask(s, as_dtype(mask, c))
    return s


def _ref_forward(q, k, v, bias, mask, scale):
    s = _scores(q, k, bias, mask, scale)
    p, shift, masked = shifted_exp(s)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.where(masked, 0.0, torch.matmul(p, v.to(s.dtype)) / total)
    lse = torch.where(masked, math.inf, shift + torch.log(total))
    return out.to(q.dtype), lse.squeeze(-1)


def _ref_backward(dout, q, k, v, bias, mask, lse, scale, bias_grad):
    s = _scores(q, k, bias, mask, scale)
    c = s.dtype
    p = torch.exp(s - lse.to(c)[..., None])
    do = dout.to(c)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, v.to(c).transpose(-1, -2))
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k.to(c)) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.to(c)) * scale
    dbias = ds.sum(dim=0).to(bias.dtype) if bias_grad else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias


reference = SimpleNamespace(forward=_ref_forward, backward=_ref_backward)


def unsupported_reasons(backend: str, q, k, v, bias=None, mask=None) -> list[str]:
    """Why ``backend`` cannot run window attention on these tensors (empty list: it can).

    q, k, v ``(Z, H, N, d)``; bias ``(H, N, N)`` and mask ``(nW, N, N)``, or None. Every backend
    (native and reference too) takes N in 1..``MAX_TOKENS`` and d in ``HEAD_DIMS``: the public
    function raises ValueError with these reasons, and model code (``attention_core``, the
    transformers integration) asks with "reference" (the backend with the fewest limits:
    what it refuses, every backend refuses) to know whether the op takes a call at all.
    The kernels (cuda, triton) read a bias and mask of float32/float16/bfloat16 only; q's dtype
    is dispatch's to check (``register_op``'s ``dtypes``).
    """
    n, d = q.shape[-2:]
    reasons = []
    if not 1 <= n <= MAX_TOKENS:
        reasons.append(f"q has N={n} tokens per window; window_attention takes 1 to {MAX_TOKENS}")
    if d not in HEAD_DIMS:
        reasons.append(
            f"q has head dim d={d}; window_attention takes d in {HEAD_DIMS}, not head dim {d}"
        )
    if dispatch.is_kernel(backend):
        reasons.extend(
            f"{name} has dtype {t.dtype} (the kernels read float32, float16 or bfloat16)"
            for name, t in (("relative_pos_bias", bias), ("attn_mask", mask))
            if t is not None and t.dtype not in KERNEL_PARAM_DTYPES
        )
    return reasons


dispatch.register_op(
    "window_attention",
    reference,
    kernels="window_attention",
    # Only the Triton kernel is picked automatically (issue 25): the CUDA path is unfused
    # (cuBLAS products around fused softmax kernels, the fp32 scores and dP through memory:
    # about 3x a fused kernel's traffic) and measured 0.52-1.47x SDPA fwd+bwd on an H100
    # (2026-11-24), below SDPA at some Swin shapes; shapes the Triton kernel refuses go to the
    # native op (SDPA). backend="cuda" still runs it.
    preference=("triton",),
    unsupported_reasons=unsupported_reasons,
)

# ------------------------------------------------------------------------------------------
# Custom ops: fusedops::window_attention -> (out, lse) and its backward.


def _select(q, k, v, bias, mask, backend):
    return dispatch.select("window_attention", q, k, v, bias, mask, backend=backend)


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _select(q, k, v, bias, mask, backend).forward(q, k, v, bias, mask, scale)


def _forward_fake(q, k, v, bias, mask, scale, backend=None):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:-1], dtype=compute_dtype(q.dtype))


def _backward_body(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    lse: torch.Tensor,
    scale: float,
    bias_grad: bool,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = _select(q, k, v, bias, mask, backend)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    return impl.backward(dout, q, k, v, bias, mask, lse, scale, bias_grad)


def _backward_fake(dout, q, k, v, bias, mask, lse, scale, bias_grad, backend=None):
    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    dbias = like(bias) if bias_grad and bias is not None else None
    return like(q), like(k), like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, scale, _ = inputs
    _, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, bias, mask, lse)
    ctx.scale = scale


def _grads(ctx, backward, dout, _dlse):
    q, k, v, bias, mask, lse = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    return backward(dout, q, k, v, bias, mask, lse, ctx.scale, bias_grad, ctx.backend)


WINDOW_ATTENTION = define_module_op("window_attention", globals())

# ------------------------------------------------------------------------------------------
# Public function and its input checks.


def _check_inputs(q, k, v, bias, mask) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D (windows, heads, N, d), got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected q's {tuple(q.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; expected q's {q.dtype}")
    windows, heads, n, d = q.shape
    shared = unsupported_reasons("reference", q, k, v)  # what every backend refuses
    if shared:
        raise ValueError("; ".join(shared))
    param_dtypes = (*KERNEL_PARAM_DTYPES, q.dtype)
    if bias is not None:
        check_tensor(bias, "relative_pos_bias", param_dtypes)
        if tuple(bias.shape) != (heads, n, n):
            raise ValueError(
                f"relative_pos_bias has shape {tuple(bias.shape)}; expected (heads, N, N) = "
                f"{(heads, n, n)}"
            )
    if mask is not None:
        check_tensor(mask, "attn_mask", param_dtypes)
        if mask.dim() != 3 or tuple(mask.shape[1:]) != (n, n) or mask.shape[0] < 1:
            raise ValueError(
                f"attn_mask has shape {tuple(mask.shape)}; expected (nW, N, N) with N={n}"
            )
        if windows % mask.shape[0]:
            raise ValueError(
                f"attn_mask has nW={mask.shape[0]} windows but q has {windows} (batch * nW) "
                "windows: the batch must be a multiple of nW"
            )
        if mask.requires_grad:
            raise ValueError(
                "attn_mask requires grad, but window_attention gives no gradient for it; pass a "
                "learned term as relative_pos_bias (or detach the mask)"
            )
    check_same_device(q, "q", k=k, v=v, relative_pos_bias=bias, attn_mask=mask)


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    relative_pos_bias: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Swin window attention ``softmax(q @ k^T * scale + relative_pos_bias + mask) @ v``.

    q, k, v: ``(batch * nW, heads, N, d)``, float16/bfloat16/float32 (float64 on the reference
    backend), N in 1..256, d in {16, 32, 64, 128}; strided views are fine.
    relative_pos_bias: ``(heads, N, N)`` or None; differentiable (its gradient is summed over
    windows). attn_mask: ``(nW, N, N)`` or None (e.g. Swin's -100 shift mask, or -inf); window
    ``z`` uses ``attn_mask[z % nW]``; not differentiable. Their dtype may differ from q's
    (float32 bias with bfloat16 q under autocast). scale: default ``d ** -0.5``.
    Returns ``(batch * nW, heads, N, d)`` contiguous, q's dtype; a fully masked query row gives
    zeros. Works under torch.compile (one custom op per direction) and fusedops.xla.
    backend: "cuda" | "triton" | "native" | "reference" to force one (default: the dispatch rule).
    """
    _check_inputs(q, k, v, relative_pos_bias, attn_mask)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    bias = relative_pos_bias.contiguous() if relative_pos_bias is not None else None
    mask = attn_mask.contiguous() if attn_mask is not None else None
    if (
        eager_fast_path(q, k, v, bias, mask)
        and dispatch.pick("window_attention", q, k, v, bias, mask, backend=backend) == "native"
    ):
        return _native_eager(q, k, v, bias, mask, scale)
    out, _ = WINDOW_ATTENTION(q, k, v, bias, mask, scale, backend)
    return out


def _native_eager(q, k, v, bias, mask, scale):
    """The native path in eager mode: matmul (q scaled first, as Swin's modules do),
    ``native_softmax`` (fully masked rows give 0, NaN rows NaN: the op's rule), matmul,
    differentiated by torch's autograd."""
    s = _scores(q, k, bias, mask, scale, scale_q=True)
    probs = native_softmax(s)
    return as_dtype(torch.matmul(probs, as_dtype(v, s.dtype)), q.dtype)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Swin attention ``softmax(q k^T * scale + bias + mask) v`` for model code: the Swin
    modules of the hooks (``fusedops/integrations/transformers/swin.py``,
    ``fusedops/integrations/timm/swin.py``) call it.

    q, k, v ``(batch * nW, heads, N, d)``; bias ``(heads, N, N)``, ``(1, heads, N, N)`` or None;
    mask ``(nW, N, N)`` or None, window ``z`` using ``mask[z % nW]``. Dropout with
    ``dropout_p`` on the probabilities while ``training``. Returns the output
    ``(batch * nW, heads, N, d)`` in q's dtype; with ``need_weights``, ``(output, weights)``,
    the probabilities after dropout ``(batch * nW, heads, N, N)``, as Swin's attention modules
    return them.

    Without weights or attention dropout, and where the op takes the sizes
    (``unsupported_reasons``: N <= 256, d in 16/32/64/128), ``window_attention`` (flash-style,
    one kernel per direction, the scores never in memory); otherwise the products around the
    fused Swin softmax (``swin_attention_softmax``).
    """
    if bias is not None and bias.dim() == 4:
        bias = bias.squeeze(0)
    dropout = training and dropout_p > 0
    if not (need_weights or dropout or unsupported_reasons("reference", q, k, v, bias, mask)):
        return window_attention(q, k, v, bias, mask, scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is None:  # the Swin softmax takes a bias
        bias = scores.new_zeros(scores.shape[1:])
    probs = swin_attention_softmax(scores, bias, mask)
    dropped = torch.nn.functional.dropout(probs, dropout_p, training) if dropout else probs
    out = torch.matmul(dropped, v)
    return (out, dropped) if need_weights else out

"""LayerNorm and RMSNorm over the trailing ``normalized_shape`` dims of x.

x is viewed as rows ``(M, N)``, ``N = prod(normalized_shape)``. Per row, in fp32 (fp64 for fp64
inputs on the reference backend):

- LayerNorm: ``xhat = (x - mean) * rstd``, ``rstd = 1 / sqrt(var + eps)`` (biased variance),
  ``y = xhat * weight + bias``.
- RMSNorm: ``xhat = x * rstd``, ``rstd = 1 / sqrt(mean(x^2) + eps)``, ``y = xhat * weight``.
  Two options reproduce the rounding of model libraries' RMSNorm classes (transformers'
  ``LlamaRMSNorm``, ``T5LayerNorm``): ``xhat_dtype`` rounds xhat to that dtype before the weight
  multiply (``weight * xhat.to(x.dtype)``), ``out_dtype`` stores y in that dtype (default x's;
  fp32 for a bf16 x with an fp32 weight there). The multiply itself is in fp32 either way.

Backward: ``g = dy * weight``; ``dx = (g - (xhat * mean(xhat * g) + mean(g))) * rstd`` (RMSNorm:
without ``mean(g)``); ``dweight = sum_rows(dy * xhat)``, ``dbias = sum_rows(dy)``.
The output has x's dtype (RMSNorm: ``out_dtype`` when given), dweight/dbias the dtype of
weight/bias (fp32 weight with bf16 x, as under autocast, is fine). mean and rstd are saved in fp32
for the backward. With ``xhat_dtype``, dweight sums ``dy * xhat`` with xhat rounded as in the
forward; dx treats the rounding as the identity (as autograd does through a cast); dy then has
y's dtype.

Every backend exposes ``layer_norm_forward(x, weight, bias, eps) -> (y, mean, rstd)``,
``layer_norm_backward(dy, x, weight, bias, mean, rstd) -> (dx, dweight, dbias)``,
``rms_norm_forward(x, weight, eps, out_dtype=None, xhat_dtype=None) -> (y, rstd)`` and
``rms_norm_backward(dy, x, weight, rstd, xhat_dtype=None) -> (dx, dweight)`` on contiguous 2-D x;
gradients of absent parameters are None.

Paths (``define_op``): under torch.compile/export (and modes, subclasses) the custom ops on
rows; in plain eager mode the ``eager`` hooks below: torch's op where native is picked, the
CUDA extension's op with its autograd in C++ where cuda is and takes the parameters
(``kernels/cuda/layer_norm.norm_with_autograd``), else ``_PickedNormFunction`` on the picked
backend (flattening to rows inside); the eager Functions of ``define_op`` serve the rest (the
RMSNorm rounding variants, rows of one element on native). All run the same kernels.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): in plain eager
mode ``torch.layer_norm`` / ``torch.rms_norm`` with torch's own autograd (form (b)); in the
custom ops the ``native`` namespace (form (a)): ``torch.native_layer_norm`` +
``aten.native_layer_norm_backward``, ``aten._fused_rms_norm`` + its backward (CUDA; the
reference's backward on CPU, where aten has none). The custom ops run on fp32 copies of
16-bit inputs (``_up``: statistics saved in fp32); eager LayerNorm takes the inputs as they are
where torch accepts their dtypes (``_torch_takes_as_is``): exactly the op it replaces. Rows of
one element and the RMSNorm rounding variants (``out_dtype``, ``xhat_dtype``) run the
reference's formula, the cheapest exact one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.ops._checks import FLOAT_DTYPES, check_same_device, check_tensor
from fusedops.ops._define import apply_function, define_op, lean_once_differentiable
from fusedops.ops._dtypes import as_dtype, compute_dtype
from fusedops.ops._eager import eager_fast_path

__all__ = ["layer_norm", "rms_norm"]

# ------------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch): the CPU path and the test oracle.


def _rounded(xhat, xhat_dtype):
    """xhat rounded to ``xhat_dtype`` (None: as it is), kept in its own dtype."""
    return xhat if xhat_dtype is None else xhat.to(xhat_dtype).to(xhat.dtype)


def _ref_forward(x, weight, bias, eps, rms, out_dtype=None, xhat_dtype=None):
    c = x.to(compute_dtype(x.dtype))
    if rms:
        mean = None
        rstd = torch.rsqrt(c.square().mean(dim=1) + eps)
        xhat = c * rstd[:, None]
    else:
        mean = c.mean(dim=1)
        centered = c - mean[:, None]
        rstd = torch.rsqrt(centered.square().mean(dim=1) + eps)
        xhat = centered * rstd[:, None]
    y = _rounded(xhat, xhat_dtype)
    if weight is not None:
        y = y * weight.to(c.dtype)
    if bias is not None:
        y = y + bias.to(c.dtype)
    return y.to(out_dtype or x.dtype), mean, rstd


def _ref_backward(dy, x, weight, bias, mean, rstd, rms, xhat_dtype=None):
    c = x.to(compute_dtype(x.dtype))
    g0 = dy.to(c.dtype)
    rstd = rstd.to(c.dtype)[:, None]
    xhat = c * rstd if rms else (c - mean.to(c.dtype)[:, None]) * rstd
    g = g0 * weight.to(c.dtype) if weight is not None else g0
    inner = xhat * (g * xhat).mean(dim=1, keepdim=True)
    if not rms:
        inner = inner + g.mean(dim=1, keepdim=True)
    dx = ((g - inner) * rstd).to(x.dtype)
    dweight = None
    if weight is not None:
        dweight = (g0 * _rounded(xhat, xhat_dtype)).sum(dim=0).to(weight.dtype)
    dbias = g0.sum(dim=0).to(bias.dtype) if bias is not None else None
    return dx, dweight, dbias


def _ref_layer_norm_forward(x, weight, bias, eps):
    return _ref_forward(x, weight, bias, eps, rms=False)


def _ref_layer_norm_backward(dy, x, weight, bias, mean, rstd):
    return _ref_backward(dy, x, weight, bias, mean, rstd, rms=False)


def _ref_rms_norm_forward(x, weight, eps, out_dtype=None, xhat_dtype=None):
    y, _, rstd = _ref_forward(x, weight, None, eps, True, out_dtype, xhat_dtype)
    return y, rstd


def _ref_rms_norm_backward(dy, x, weight, rstd, xhat_dtype=None):
    dx, dweight, _ = _ref_backward(dy, x, weight, None, None, rstd, True, xhat_dtype)
    return dx, dweight


reference = SimpleNamespace(
    layer_norm_forward=_ref_layer_norm_forward,
    layer_norm_backward=_ref_layer_norm_backward,
    rms_norm_forward=_ref_rms_norm_forward,
    rms_norm_backward=_ref_rms_norm_backward,
)


# ------------------------------------------------------------------------------------------
# Native implementation (PyTorch's own kernels): the automatic pick where no verified kernel
# runs. Form (b) of the native contract (docs/contract.md) in eager mode (``layer_norm`` /
# ``rms_norm`` below call ``torch.layer_norm``/``torch.rms_norm`` with torch's C++ autograd);
# this namespace, form (a), serves the custom ops (torch.compile, export, tracing). Only
# aten/torch-namespace functions: the hooks patch torch.nn classes, never these.


def _up(t):
    """t (or None) in the compute dtype. torch's CPU norm kernels keep 16-bit statistics and
    round per-term products to 16 bits; the custom ops' contract (statistics saved in fp32, the
    op's fp32 math) takes fp32 copies. The eager path runs torch's op as it is where it can
    (``_torch_takes_as_is``): the code it replaces, at its speed."""
    return None if t is None else as_dtype(t, compute_dtype(t.dtype))


def _torch_takes_as_is(x, *params) -> bool:
    """True where torch's LayerNorm takes x and the parameters as they are (the parameters in
    x's dtype, or on the CPU float32 beside 16-bit x: torch's CUDA kernel refuses that mix,
    "expected scalar type Half but found Float", H200 run of 2026-11-26). The eager native
    path then runs exactly the op it replaces, with the rounding of torch's kernel: on CPU,
    16-bit statistics and per-term 16-bit rounding of dweight/dbias (within a few units of the
    16-bit roundoff of ``sum_rows |dy * xhat|``)."""
    dtype = x.dtype
    for p in params:
        if p is not None and p.dtype != dtype:
            break
    else:
        return True
    if dtype not in (torch.float16, torch.bfloat16) or x.is_cuda or x.device.type != "cpu":
        return False
    return all(p is None or p.dtype in (dtype, torch.float32) for p in params)


def _grad_as(grad, like):
    return None if like is None or grad is None else grad.to(like.dtype)


def _native_layer_norm_forward(x, weight, bias, eps):
    if x.shape[1] == 1:  # torch's backward leaves a residue where xhat is exactly 0
        return _ref_layer_norm_forward(x, weight, bias, eps)
    y, mean, rstd = torch.native_layer_norm(_up(x), (x.shape[1],), _up(weight), _up(bias), eps)
    return y.to(x.dtype), mean.view(-1), rstd.view(-1)


def _native_layer_norm_backward(dy, x, weight, bias, mean, rstd):
    if x.shape[1] == 1:
        return _ref_layer_norm_backward(dy, x, weight, bias, mean, rstd)
    w, b = _up(weight), _up(bias)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        _up(dy), _up(x), [x.shape[1]], mean.view(-1, 1), rstd.view(-1, 1), w, b,
        [True, w is not None, b is not None],
    )  # fmt: skip
    return dx.to(x.dtype), _grad_as(dw, weight), _grad_as(db, bias)


def _plain_rms(out_dtype, xhat_dtype) -> bool:
    return out_dtype is None and xhat_dtype is None


def _native_rms_norm_forward(x, weight, eps, out_dtype=None, xhat_dtype=None):
    if not _plain_rms(out_dtype, xhat_dtype):
        # The rounding variants: the reference's formula is the cheapest exact one.
        return _ref_rms_norm_forward(x, weight, eps, out_dtype, xhat_dtype)
    y, rstd = torch.ops.aten._fused_rms_norm(_up(x), [x.shape[1]], _up(weight), eps)
    return y.to(x.dtype), rstd.view(-1)


def _native_rms_norm_backward(dy, x, weight, rstd, xhat_dtype=None):
    # A variant (out_dtype: dy in y's dtype), or a CPU tensor (aten has no CPU kernel of
    # _fused_rms_norm_backward): the reference's formula.
    if xhat_dtype is not None or dy.dtype != x.dtype or x.device.type != "cuda":
        return _ref_rms_norm_backward(dy, x, weight, rstd, xhat_dtype)
    w = _up(weight)
    dx, dw = torch.ops.aten._fused_rms_norm_backward(
        _up(dy), _up(x), [x.shape[1]], rstd.view(-1, 1), w, [True, w is not None]
    )
    return dx.to(x.dtype), _grad_as(dw, weight)


native = SimpleNamespace(
    layer_norm_forward=_native_layer_norm_forward,
    layer_norm_backward=_native_layer_norm_backward,
    rms_norm_forward=_native_rms_norm_forward,
    rms_norm_backward=_native_rms_norm_backward,
)


#: Longest row (elements) the CUDA kernels index with 32-bit offsets.
CUDA_MAX_ROW = 2**31 - 1


def unsupported_reasons(backend: str, x: torch.Tensor, row_length: int | None = None) -> list[str]:
    """Why ``backend`` cannot normalize ``x`` (empty list: it can), for layer_norm and rms_norm.

    backend: a dispatch backend name; x: the rows ``(rows, N)``; row_length: N when x is not
    yet flattened to rows (default: ``x.shape[1]`` of a 2-D x, else no limit is known). The
    CUDA kernel takes rows of at most ``CUDA_MAX_ROW`` elements; triton, native and reference
    take any. Dtypes are dispatch's (``register_op``'s ``dtypes``).
    """
    if row_length is None and x.dim() == 2:
        row_length = x.shape[1]
    if backend == "cuda" and row_length is not None and row_length > CUDA_MAX_ROW:
        return [f"rows of {row_length} elements exceed the CUDA kernel's 2^31 - 1"]
    return []


for _name in ("layer_norm", "rms_norm"):
    dispatch.register_op(
        _name,
        reference,
        kernels="layer_norm",
        unsupported_reasons=unsupported_reasons,
        native=native,
    )


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _like(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty_like(t)


# ------------------------------------------------------------------------------------------
# The bodies of the custom ops: x is 2-D (M, N) and contiguous; weight and bias are (N,) or
# None. An absent parameter's gradient is None (define_op carries it as an empty tensor).


def _layer_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.select("layer_norm", x, backend=backend).layer_norm_forward(
        x, weight, bias, eps
    )


def _layer_norm_fake(x, weight, bias, eps, backend=None):
    stats = x.new_empty((x.shape[0],), dtype=_stats_dtype(x))
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, stats.clone()


def _layer_norm_backward_body(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = dispatch.select("layer_norm", x, backend=backend)
    return impl.layer_norm_backward(dy.contiguous(), x, weight, bias, mean, rstd)


def _layer_norm_backward_fake(dy, x, weight, bias, mean, rstd, backend=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _like(weight), _like(bias)


def _layer_norm_setup_context(ctx, inputs, output):
    x, weight, bias, _, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd)


# out_dtype and xhat_dtype were appended to the schemas (after backend) for the RMSNorm classes of
# model libraries; None keeps the plain RMSNorm.
def _rms_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    backend: str | None = None,
    out_dtype: torch.dtype | None = None,
    xhat_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("rms_norm", x, backend=backend)
    return impl.rms_norm_forward(x, weight, eps, out_dtype, xhat_dtype)


def _rms_norm_fake(x, weight, eps, backend=None, out_dtype=None, xhat_dtype=None):
    stats = x.new_empty((x.shape[0],), dtype=_stats_dtype(x))
    y = torch.empty_like(x, dtype=out_dtype or x.dtype, memory_format=torch.contiguous_format)
    return y, stats


def _rms_norm_backward_body(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    backend: str | None = None,
    xhat_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = dispatch.select("rms_norm", x, backend=backend)
    return impl.rms_norm_backward(dy.contiguous(), x, weight, rstd, xhat_dtype)


def _rms_norm_backward_fake(dy, x, weight, rstd, backend=None, xhat_dtype=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _like(weight)


def _rms_norm_setup_context(ctx, inputs, output):
    x, weight, _, _, _, xhat_dtype = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)
    ctx.xhat_dtype = xhat_dtype


def _rms_norm_grads(ctx, backward, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    return backward(dy, x, weight, rstd, ctx.backend, ctx.xhat_dtype)


# ------------------------------------------------------------------------------------------
# The ops are called with x in its own shape and the parameters in normalized_shape, then the
# normalized shape as a tuple: (x, weight, bias, eps, backend, shape) and (x, weight, eps,
# backend, out_dtype, xhat_dtype, shape). ``_layer_norm_rows``/``_rms_norm_rows`` flatten them
# to the bodies' rows (inside the eager Function, where autograd records no view nodes); the
# eager hooks are the fast paths that skip the Function.


def _flatten(x, params, n):
    """x as contiguous rows (M, n) and each parameter (or None) as (n,); tensors already so
    shaped are taken as they are (a view costs about 1 us)."""
    rows = x.contiguous()
    if rows.dim() != 2 or rows.shape[1] != n:
        rows = rows.view(-1, n)
    return rows, [p if p is None or p.dim() == 1 else p.reshape(n) for p in params]


def _layer_norm_rows(x, weight, bias, eps, backend, shape):
    rows, (weight, bias) = _flatten(x, (weight, bias), math.prod(shape))
    return rows, weight, bias, eps, backend


def _rms_norm_rows(x, weight, eps, backend, out_dtype, xhat_dtype, shape):
    rows, (weight,) = _flatten(x, (weight,), math.prod(shape))
    return rows, weight, eps, backend, out_dtype, xhat_dtype


def _with_own_autograd(chosen, name, x, weight, bias, n):
    """The implementation of backend ``chosen`` when it offers the whole call with its own
    autograd (``norm_with_autograd``: the CUDA extension's op, its autograd in C++) and takes
    these inputs (``takes_params``, the op's limits), else None: then the autograd.Function,
    whose backward is Python, runs whichever backend the rule picked."""
    if not x.is_cuda:
        return None
    impl = dispatch.implementation(name, chosen)
    takes = getattr(impl, "takes_params", None)
    if takes is None or not hasattr(impl, "norm_with_autograd"):
        return None
    if unsupported_reasons(chosen, x, n) or not takes(x, weight, bias):
        return None
    return impl


class _PickedNormFunction(torch.autograd.Function):
    """LayerNorm/RMSNorm (plain) in eager mode on the implementation the forward's dispatch
    picked (a kernel backend whose autograd is not the extension's C++ op, or the reference):
    the eager Function's work with nothing per call beyond it. The implementation travels on
    ctx (the backward runs the forward's backend without asking the dispatch rule again, as
    the Function's ``ctx.backend`` does); x is flattened to rows and the parameters to (N,)
    here, where autograd records no view nodes; y is returned in x's shape (not a view, so it
    may be modified in place) and the gradients in the inputs' shapes.

    forward(ctx, x, weight, bias, eps, impl, rms, n): x (..., *normalized_shape); weight, bias
    of normalized_shape or None (bias None for RMSNorm); impl: the backend's namespace; n: the
    number of elements a row (normalized_shape's)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, impl, rms, n):
        rows, (w, b) = _flatten(x, (weight, bias), n)
        if rms:
            y, rstd = impl.rms_norm_forward(rows, w, eps)
            mean = None
        else:
            y, mean, rstd = impl.layer_norm_forward(rows, w, b, eps)
        ctx.save_for_backward(rows, w, b, mean, rstd)
        ctx.impl, ctx.rms = impl, rms
        # normalized_shape, the shape of either parameter (None: neither is given)
        given = weight if weight is not None else bias
        ctx.x_shape, ctx.param_shape = x.shape, None if given is None else given.shape
        if y.shape == x.shape:
            return y
        # a tensor of its own, not a view (see _reshaping_function in ops/_define.py)
        return torch.ops.aten._unsafe_view(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        return _picked_norm_backward(ctx, dy)


def _picked_norm_body(ctx, dy):
    rows, w, b, mean, rstd = ctx.saved_tensors
    dy = (dy if dy.shape == rows.shape else dy.reshape(rows.shape)).contiguous()
    if ctx.rms:
        dx, dw = ctx.impl.rms_norm_backward(dy, rows, w, rstd)
        db = None
    else:
        dx, dw, db = ctx.impl.layer_norm_backward(dy, rows, w, b, mean, rstd)
    if dx.shape != ctx.x_shape:
        dx = dx.view(ctx.x_shape)
    shape = ctx.param_shape
    if shape is not None and len(shape) != 1:
        dw = None if dw is None else dw.view(shape)
        db = None if db is None else db.view(shape)
    return dx, dw, db, None, None, None, None


_picked_norm_backward = lean_once_differentiable(_picked_norm_body)


def _on_kernel_backend(name, chosen, x, weight, bias, eps, rms, n):
    """y on backend ``chosen`` (not native): the CUDA extension's op with its C++ autograd
    where it takes the parameters, else ``_PickedNormFunction`` on ``chosen``'s
    implementation."""
    own = _with_own_autograd(chosen, name, x, weight, bias, n)
    if own is not None:
        return own.norm_with_autograd(x, weight, bias, n, eps, rms)
    impl = dispatch.implementation(name, chosen)
    return apply_function(_PickedNormFunction, (x, weight, bias, eps, impl, rms, n))


def _layer_norm_eager(x, weight, bias, eps, backend, shape):
    """Plain eager mode: torch's LayerNorm with torch's autograd where native is picked (form
    (b)), the extension's op with its C++ autograd where cuda is and takes the parameters,
    ``_PickedNormFunction`` elsewhere; None (the op's Function) for rows of one element on
    native."""
    n = math.prod(shape)
    chosen = dispatch.pick("layer_norm", x, backend=backend)
    if chosen == "native":
        if n == 1:
            return None
        if _torch_takes_as_is(x, weight, bias):
            # under CUDA autocast torch's layer_norm returns float32; the op's output keeps
            # x's dtype on every backend
            return as_dtype(torch.layer_norm(x, shape, weight, bias, eps), x.dtype)
        return torch.layer_norm(_up(x), shape, _up(weight), _up(bias), eps).to(x.dtype)
    return _on_kernel_backend("layer_norm", chosen, x, weight, bias, eps, False, n)


def _rms_norm_eager(x, weight, eps, backend, out_dtype, xhat_dtype, shape):
    """As _layer_norm_eager, for the plain RMSNorm (the rounding variants take the Function)."""
    if not _plain_rms(out_dtype, xhat_dtype):
        return None
    chosen = dispatch.pick("rms_norm", x, backend=backend)
    if chosen == "native":
        return as_dtype(torch.rms_norm(_up(x), shape, _up(weight), eps), x.dtype)
    return _on_kernel_backend("rms_norm", chosen, x, weight, None, eps, True, math.prod(shape))


LAYER_NORM = define_op(
    "layer_norm",
    forward=_layer_norm_forward,
    fake=_layer_norm_fake,
    backward=_layer_norm_backward_body,
    backward_fake=_layer_norm_backward_fake,
    setup_context=_layer_norm_setup_context,
    eager=_layer_norm_eager,
    reshape=_layer_norm_rows,
)

RMS_NORM = define_op(
    "rms_norm",
    forward=_rms_norm_forward,
    fake=_rms_norm_fake,
    backward=_rms_norm_backward_body,
    backward_fake=_rms_norm_backward_fake,
    setup_context=_rms_norm_setup_context,
    grads=_rms_norm_grads,
    eager=_rms_norm_eager,
    reshape=_rms_norm_rows,
)


# ------------------------------------------------------------------------------------------
# Public functions: validate once, then the op (define_op: the eager fast paths, the eager
# Function, or the custom op on rows).


def _checked_shape(x, normalized_shape, params: dict) -> tuple[int, ...]:
    """Check the inputs; return normalized_shape as a tuple."""
    # The common call (one normalized dim, parameters of it or None, one device) accepted in
    # a few checks (about 1 us); anything else, errors included, takes the full check below.
    n = normalized_shape
    if type(n) is tuple and len(n) == 1:
        n = n[0]
    if (
        type(n) is int
        and n > 0
        and isinstance(x, torch.Tensor)
        and x.dtype in FLOAT_DTYPES
        and x.dim()
        and x.shape[-1] == n
    ):
        shape, device = (n,), x.device
        for p in params.values():
            if p is not None and not (
                isinstance(p, torch.Tensor)
                and p.dtype in FLOAT_DTYPES
                and p.shape == shape
                and p.device == device
            ):
                break
        else:
            return shape
    check_tensor(x, "x")
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    # a tuple first: isinstance against the Sequence ABC costs about 1 us
    if not (type(normalized_shape) is tuple or isinstance(normalized_shape, Sequence)) or not all(
        isinstance(d, int) for d in normalized_shape
    ):
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    shape = tuple(normalized_shape)
    if not shape or len(shape) > x.dim() or x.shape[x.dim() - len(shape) :] != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} does not match the trailing dims of x with shape "
            f"{list(x.shape)}"
        )
    if math.prod(shape) == 0:
        raise ValueError(f"normalized_shape {list(shape)} has no elements")
    for name, p in params.items():
        if p is None:
            continue
        check_tensor(p, name)
        if p.shape != shape:
            raise ValueError(
                f"{name} has shape {list(p.shape)}, expected normalized_shape {list(shape)}"
            )
    check_same_device(x, "x", **params)
    return shape


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims, as ``torch.nn.functional.layer_norm``.

    x: (..., *normalized_shape), float16/bfloat16/float32 (float64 on the reference backend);
    may be non-contiguous (copied once). weight, bias: normalized_shape or None, any float dtype
    (fp32 parameters with bf16/fp16 x, as under autocast). Returns a contiguous tensor of x's
    shape and dtype; gradients for x, weight and bias in their own dtypes. Works under
    torch.compile and torch.export. backend: "cuda" | "triton" | "native" | "reference" to force
    one (default: the dispatch rule; "native" is torch's own LayerNorm).
    """
    shape = _checked_shape(x, normalized_shape, {"weight": weight, "bias": bias})
    args = (x, weight, bias, float(eps), backend, shape)
    return LAYER_NORM.call(args, eager_fast_path(x, weight, bias))


def _optional_dtype(value, name: str, x: torch.Tensor) -> torch.dtype | None:
    """A float dtype argument (None: not given), checked; None where it changes nothing
    (x's dtype for out_dtype, x's compute dtype for xhat_dtype)."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype or None, got {value!r}")
    if value not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating dtype (float16/bfloat16/float32/float64)")
    if name == "out_dtype":
        return None if value == x.dtype else value
    # rounding to the compute dtype or to float64 changes nothing
    return None if value in (compute_dtype(x.dtype), torch.float64) else value


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    backend: str | None = None,
    out_dtype: torch.dtype | None = None,
    xhat_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims, as ``torch.nn.functional.rms_norm``.

    x: (..., *normalized_shape), float16/bfloat16/float32 (float64 on the reference backend).
    weight: normalized_shape or None, any float dtype. eps: None means ``torch.finfo(x.dtype).eps``
    (as torch). Returns a contiguous tensor of x's shape and dtype. backend: as for layer_norm.
    out_dtype: y's dtype (default x's). xhat_dtype: round ``x * rstd`` to this dtype before the
    fp32 weight multiply (default: no rounding). ``rms_norm(x, (n,), w, eps,
    out_dtype=torch.promote_types(x.dtype, w.dtype), xhat_dtype=x.dtype)`` is transformers'
    ``LlamaRMSNorm``, rounding included.
    """
    shape = _checked_shape(x, normalized_shape, {"weight": weight})
    out_dtype = _optional_dtype(out_dtype, "out_dtype", x)
    xhat_dtype = _optional_dtype(xhat_dtype, "xhat_dtype", x)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    args = (x, weight, float(eps), backend, out_dtype, xhat_dtype, shape)
    return RMS_NORM.call(args, eager_fast_path(x, weight))

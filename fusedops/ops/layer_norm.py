"""LayerNorm and RMSNorm over the trailing ``normalized_shape`` dims of x.

x is viewed as rows ``(M, N)``, ``N = prod(normalized_shape)``. Per row, in fp32 (fp64 for fp64
inputs on the reference backend):

- LayerNorm: ``xhat = (x - mean) * rstd``, ``rstd = 1 / sqrt(var + eps)`` (biased variance),
  ``y = xhat * weight + bias``.
- RMSNorm: ``xhat = x * rstd``, ``rstd = 1 / sqrt(mean(x^2) + eps)``, ``y = xhat * weight``.

Backward: ``g = dy * weight``; ``dx = (g - (xhat * mean(xhat * g) + mean(g))) * rstd`` (RMSNorm:
without ``mean(g)``); ``dweight = sum_rows(dy * xhat)``, ``dbias = sum_rows(dy)``.
The output has x's dtype, dweight/dbias the dtype of weight/bias (fp32 weight with bf16 x, as
under autocast, is fine). mean and rstd are saved in fp32 for the backward.

Every backend exposes ``layer_norm_forward(x, weight, bias, eps) -> (y, mean, rstd)``,
``layer_norm_backward(dy, x, weight, bias, mean, rstd) -> (dx, dweight, dbias)``,
``rms_norm_forward(x, weight, eps) -> (y, rstd)`` and
``rms_norm_backward(dy, x, weight, rstd) -> (dx, dweight)`` on contiguous 2-D x; gradients of
absent parameters are None.

Paths: under torch.compile/export (and modes, subclasses) the custom ops below; in plain eager
mode the autograd.Functions below, or, when the CUDA backend is picked, the extension's op with
its autograd in C++ (``kernels/cuda/layer_norm.norm_with_autograd``). All run the same kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch.autograd.function import once_differentiable

from fusedops import dispatch
from fusedops.ops._checks import check_same_device, check_tensor
from fusedops.ops._eager import eager_fast_path

# ------------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch): the CPU path and the test oracle.


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _ref_forward(x, weight, bias, eps, rms):
    c = x.to(_compute_dtype(x))
    if rms:
        mean = None
        rstd = torch.rsqrt(c.square().mean(dim=1) + eps)
        xhat = c * rstd[:, None]
    else:
        mean = c.mean(dim=1)
        centered = c - mean[:, None]
        rstd = torch.rsqrt(centered.square().mean(dim=1) + eps)
        xhat = centered * rstd[:, None]
    y = xhat
    if weight is not None:
        y = y * weight.to(c.dtype)
    if bias is not None:
        y = y + bias.to(c.dtype)
    return y.to(x.dtype), mean, rstd


def _ref_backward(dy, x, weight, bias, mean, rstd, rms):
    c = x.to(_compute_dtype(x))
    g0 = dy.to(c.dtype)
    rstd = rstd.to(c.dtype)[:, None]
    xhat = c * rstd if rms else (c - mean.to(c.dtype)[:, None]) * rstd
    g = g0 * weight.to(c.dtype) if weight is not None else g0
    inner = xhat * (g * xhat).mean(dim=1, keepdim=True)
    if not rms:
        inner = inner + g.mean(dim=1, keepdim=True)
    dx = ((g - inner) * rstd).to(x.dtype)
    dweight = (g0 * xhat).sum(dim=0).to(weight.dtype) if weight is not None else None
    dbias = g0.sum(dim=0).to(bias.dtype) if bias is not None else None
    return dx, dweight, dbias


def _ref_layer_norm_forward(x, weight, bias, eps):
    return _ref_forward(x, weight, bias, eps, rms=False)


def _ref_layer_norm_backward(dy, x, weight, bias, mean, rstd):
    return _ref_backward(dy, x, weight, bias, mean, rstd, rms=False)


def _ref_rms_norm_forward(x, weight, eps):
    y, _, rstd = _ref_forward(x, weight, None, eps, rms=True)
    return y, rstd


def _ref_rms_norm_backward(dy, x, weight, rstd):
    dx, dweight, _ = _ref_backward(dy, x, weight, None, None, rstd, rms=True)
    return dx, dweight


reference = SimpleNamespace(
    layer_norm_forward=_ref_layer_norm_forward,
    layer_norm_backward=_ref_layer_norm_backward,
    rms_norm_forward=_ref_rms_norm_forward,
    rms_norm_backward=_ref_rms_norm_backward,
)


def _kernel_check(backend: str, x: torch.Tensor) -> list[str]:
    if backend == "cuda" and x.dim() == 2 and x.shape[1] >= 2**31:
        return [f"rows of {x.shape[1]} elements exceed the CUDA kernel's 2^31 - 1"]
    return []


for _name in ("layer_norm", "rms_norm"):
    dispatch.register_op(
        _name,
        reference,
        triton_module="fusedops.kernels.triton.layer_norm",
        cuda_module="fusedops.kernels.cuda.layer_norm",
        check=_kernel_check,
    )


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grad_or_empty(grad: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    # custom ops return tensors only: an absent gradient travels as an empty tensor.
    return grad if grad is not None else x.new_empty((0,))


# ------------------------------------------------------------------------------------------
# Custom ops: x is 2-D (M, N) and contiguous; weight and bias are (N,) or None.


def _layer_norm_forward(x, weight, bias, eps, backend):
    return dispatch.select("layer_norm", x, backend=backend).layer_norm_forward(
        x, weight, bias, eps
    )


def _layer_norm_backward_body(dy, x, weight, bias, mean, rstd, backend):
    impl = dispatch.select("layer_norm", x, backend=backend)
    return impl.layer_norm_backward(dy.contiguous(), x, weight, bias, mean, rstd)


def _rms_norm_forward(x, weight, eps, backend):
    return dispatch.select("rms_norm", x, backend=backend).rms_norm_forward(x, weight, eps)


def _rms_norm_backward_body(dy, x, weight, rstd, backend):
    impl = dispatch.select("rms_norm", x, backend=backend)
    return impl.rms_norm_backward(dy.contiguous(), x, weight, rstd)


@torch.library.custom_op("fusedops::layer_norm", mutates_args=())
def _layer_norm_op(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _layer_norm_forward(x, weight, bias, eps, backend)


@_layer_norm_op.register_fake
def _(x, weight, bias, eps, backend=None):
    stats = x.new_empty((x.shape[0],), dtype=_stats_dtype(x))
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, stats.clone()


@torch.library.custom_op("fusedops::layer_norm_backward", mutates_args=())
def _layer_norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dweight, dbias = _layer_norm_backward_body(dy, x, weight, bias, mean, rstd, backend)
    return dx, _grad_or_empty(dweight, x), _grad_or_empty(dbias, x)


@_layer_norm_backward_op.register_fake
def _(dy, x, weight, bias, mean, rstd, backend=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dweight = torch.empty_like(weight) if weight is not None else x.new_empty((0,))
    dbias = torch.empty_like(bias) if bias is not None else x.new_empty((0,))
    return dx, dweight, dbias


def _layer_norm_setup_context(ctx, inputs, output):
    x, weight, bias, _, backend = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    # An explicit choice made around the forward (use_backend, env) also holds for the backward.
    ctx.backend = dispatch.requested(backend)


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dweight, dbias = _layer_norm_backward_op(dy, x, weight, bias, mean, rstd, ctx.backend)
    return (
        dx,
        dweight if weight is not None else None,
        dbias if bias is not None else None,
        None,
        None,
    )


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup_context)


@torch.library.custom_op("fusedops::rms_norm", mutates_args=())
def _rms_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rms_norm_forward(x, weight, eps, backend)


@_rms_norm_op.register_fake
def _(x, weight, eps, backend=None):
    stats = x.new_empty((x.shape[0],), dtype=_stats_dtype(x))
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats


@torch.library.custom_op("fusedops::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dweight = _rms_norm_backward_body(dy, x, weight, rstd, backend)
    return dx, _grad_or_empty(dweight, x)


@_rms_norm_backward_op.register_fake
def _(dy, x, weight, rstd, backend=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, torch.empty_like(weight) if weight is not None else x.new_empty((0,))


def _rms_norm_setup_context(ctx, inputs, output):
    x, weight, _, backend = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)
    ctx.backend = dispatch.requested(backend)


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = _rms_norm_backward_op(dy, x, weight, rstd, ctx.backend)
    return dx, dweight if weight is not None else None, None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


def _flatten(x, params, n):
    """x as contiguous rows (M, n) and each parameter (or None) as (n,)."""
    rows = x.contiguous().view(-1, n)
    return rows, [None if p is None else p.reshape(n) for p in params]


def _as_output(y, shape):
    """y (rows) in x's shape as a tensor of its own: a view returned from a Function's forward
    could not be modified in place later (e.g. ``relu_``); ``_unsafe_view`` shares the storage
    without being a view to autograd."""
    return torch.ops.aten._unsafe_view(y, shape)


def _shapes(*tensors):
    return tuple(None if t is None else t.shape for t in tensors)


def _unflatten(grads, shapes):
    """Each gradient (or None) in the shape of its input."""
    return [None if g is None else g.view(shape) for g, shape in zip(grads, shapes)]


class _LayerNormFunction(torch.autograd.Function):
    """The eager path (ops/_eager.py): the custom op's bodies without its wrappers. It takes x
    and the parameters in their own shapes and returns y only: the flattening happens inside,
    where autograd records no view nodes, and no statistics outputs need zero gradients.
    Classic ``forward(ctx, ...)``: a separate setup_context makes ``apply`` bind arguments
    through ``inspect.signature`` on every call."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, backend, n):
        rows, (w, b) = _flatten(x, (weight, bias), n)
        y, mean, rstd = _layer_norm_forward(rows, w, b, eps, backend)
        ctx.save_for_backward(rows, w, b, mean, rstd)
        ctx.backend = dispatch.requested(backend)
        ctx.shapes = _shapes(x, weight, bias)
        return _as_output(y, x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        rows, w, b, mean, rstd = ctx.saved_tensors
        grads = _layer_norm_backward_body(
            dy.reshape(rows.shape), rows, w, b, mean, rstd, ctx.backend
        )
        return (*_unflatten(grads, ctx.shapes), None, None, None)


class _RMSNormFunction(torch.autograd.Function):
    """The eager path of rms_norm (as _LayerNormFunction)."""

    @staticmethod
    def forward(ctx, x, weight, eps, backend, n):
        rows, (w,) = _flatten(x, (weight,), n)
        y, rstd = _rms_norm_forward(rows, w, eps, backend)
        ctx.save_for_backward(rows, w, rstd)
        ctx.backend = dispatch.requested(backend)
        ctx.shapes = _shapes(x, weight)
        return _as_output(y, x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        rows, w, rstd = ctx.saved_tensors
        grads = _rms_norm_backward_body(dy.reshape(rows.shape), rows, w, rstd, ctx.backend)
        return (*_unflatten(grads, ctx.shapes), None, None, None)


# ------------------------------------------------------------------------------------------
# Public functions: validate once, then the eager Function, or flatten to rows and call the
# custom op.


def _cuda_extension(name, x, weight, bias, n, backend):
    """The CUDA launcher module when an eager call takes the extension's op with its autograd
    in C++ (the dispatch rule picks cuda and the kernels read the parameters as they are), else
    None: then the autograd.Function, whose backward is Python, runs whichever backend the rule
    picks."""
    if x.device.type != "cuda" or n >= 2**31:
        return None
    if dispatch.select_name(name, x, backend=backend) != "cuda":
        return None
    from fusedops.kernels.cuda import layer_norm as cuda

    if not cuda.takes_params(x, weight, bias):
        return None
    dispatch.last_used[name] = "cuda"
    return cuda


def _row_length(x, normalized_shape, params: dict) -> int:
    """Check the inputs; return N, the number of elements of normalized_shape."""
    check_tensor(x, "x")
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if not isinstance(normalized_shape, (Sequence, torch.Size)) or not all(
        isinstance(d, int) for d in normalized_shape
    ):
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    shape = tuple(normalized_shape)
    if not shape or len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} does not match the trailing dims of x with shape "
            f"{list(x.shape)}"
        )
    n = math.prod(shape)
    if n == 0:
        raise ValueError(f"normalized_shape {list(shape)} has no elements")
    for name, p in params.items():
        if p is None:
            continue
        check_tensor(p, name)
        if tuple(p.shape) != shape:
            raise ValueError(
                f"{name} has shape {list(p.shape)}, expected normalized_shape {list(shape)}"
            )
    check_same_device(x, "x", **params)
    return n


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
    torch.compile and torch.export. backend: "cuda" | "triton" | "reference" to force one.
    """
    n = _row_length(x, normalized_shape, {"weight": weight, "bias": bias})
    if eager_fast_path(x, weight, bias):
        cuda = _cuda_extension("layer_norm", x, weight, bias, n, backend)
        if cuda is not None:
            return cuda.norm_with_autograd(x, weight, bias, n, float(eps), False)
        return _LayerNormFunction.apply(x, weight, bias, float(eps), backend, n)
    rows, (weight, bias) = _flatten(x, (weight, bias), n)
    y, _, _ = _layer_norm_op(rows, weight, bias, float(eps), backend)
    return y.view(x.shape)


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims, as ``torch.nn.functional.rms_norm``.

    x: (..., *normalized_shape), float16/bfloat16/float32 (float64 on the reference backend).
    weight: normalized_shape or None, any float dtype. eps: None means ``torch.finfo(x.dtype).eps``
    (as torch). Returns a contiguous tensor of x's shape and dtype. backend: as for layer_norm.
    """
    n = _row_length(x, normalized_shape, {"weight": weight})
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    if eager_fast_path(x, weight):
        cuda = _cuda_extension("rms_norm", x, weight, None, n, backend)
        if cuda is not None:
            return cuda.norm_with_autograd(x, weight, None, n, float(eps), True)
        return _RMSNormFunction.apply(x, weight, float(eps), backend, n)
    rows, (weight,) = _flatten(x, (weight,), n)
    y, _ = _rms_norm_op(rows, weight, float(eps), backend)
    return y.view(x.shape)

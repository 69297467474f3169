"""Lowerings of reductions, sorting and matrix products."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from fusedops.xla.lower_table import (
    _HIGHEST,
    _axis,
    _dims,
    jax_dtype,
    register,
)

aten = torch.ops.aten
prims = torch.ops.prims


# -------------------------------------------------------------------------------------- reductions
@register(aten.sum.default)
def _sum_all(x, dtype=None):
    return jnp.sum(x)


@register(aten.sum.dim_IntList)
def _sum(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.mean.default)
def _mean_all(x, dtype=None):
    return jnp.mean(x)


@register(aten.mean.dim)
def _mean(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.prod.default)
def _prod_all(x, dtype=None):
    return jnp.prod(x)


@register(aten.prod.dim_int)
def _prod(x, dim, keepdim=False, dtype=None):
    return jnp.prod(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.nansum.default)
def _nansum(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.nansum(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.amax.default)
def _amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.amin.default)
def _amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.max.default)
def _max_all(x):
    return jnp.max(x)


@register(aten.min.default)
def _min_all(x):
    return jnp.min(x)


def _arg_reduce(find, x, dim, keepdim):
    """``find`` (jnp.argmax / argmin) along ``dim`` (None: over the flattened x); 0 for a 0-dim
    x, as torch."""
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if dim is None:
        index = find(x.reshape(-1))
        return index.reshape((1,) * x.ndim) if keepdim else index
    return find(x, axis=_axis(dim, x.ndim), keepdims=keepdim)


@register(aten.max.dim)
def _max_dim(x, dim, keepdim=False):
    values = jnp.max(x, axis=_dims(dim, x.ndim), keepdims=keepdim)
    return values, _arg_reduce(jnp.argmax, x, dim, keepdim)


@register(aten.min.dim)
def _min_dim(x, dim, keepdim=False):
    values = jnp.min(x, axis=_dims(dim, x.ndim), keepdims=keepdim)
    return values, _arg_reduce(jnp.argmin, x, dim, keepdim)


@register(aten.argmax.default)
def _argmax(x, dim=None, keepdim=False):
    return _arg_reduce(jnp.argmax, x, dim, keepdim)


@register(aten.argmin.default)
def _argmin(x, dim=None, keepdim=False):
    return _arg_reduce(jnp.argmin, x, dim, keepdim)


@register(aten.var.correction)
def _var(x, dim=None, *, correction=None, keepdim=False):
    ddof = 1 if correction is None else correction
    return jnp.var(x, axis=_dims(dim, x.ndim), ddof=ddof, keepdims=keepdim)


@register(aten.std.correction)
def _std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


@register(aten.var_mean.correction)
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    var = _var(x, dim, correction=correction, keepdim=keepdim)
    return var, jnp.mean(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.any.default)
def _any_all(x):
    return jnp.any(x)


@register(aten.any.dim, aten.any.dims)
def _any(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.all.default)
def _all_all(x):
    return jnp.all(x)


@register(aten.all.dim, aten.all.dims)
def _all(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.logsumexp.default)
def _logsumexp(x, dim, keepdim=False):
    return jax.scipy.special.logsumexp(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@register(aten.cumsum.default)
def _cumsum(x, dim, dtype=None):
    return x if x.ndim == 0 else jnp.cumsum(x, axis=_axis(dim, x.ndim))


@register(aten.cumprod.default)
def _cumprod(x, dim, dtype=None):
    return x if x.ndim == 0 else jnp.cumprod(x, axis=_axis(dim, x.ndim))


@register(aten.linalg_vector_norm.default)
def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.vector_norm: inf / -inf the largest / smallest |x|, 0 the count of nonzero
    elements, else ``sum(|x|^ord)^(1/ord)``."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    axis = _dims(dim, x.ndim)
    size = jnp.abs(x)
    if ord == math.inf:
        return jnp.max(size, axis=axis, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(size, axis=axis, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(size != 0, axis=axis, keepdims=keepdim).astype(size.dtype)
    if ord == 1:
        return jnp.sum(size, axis=axis, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(size * size, axis=axis, keepdims=keepdim))
    return jnp.sum(size**ord, axis=axis, keepdims=keepdim) ** (1.0 / ord)


@register(aten.sort.default, aten.sort.stable)
def _sort(x, dim=-1, descending=False, *, stable=False):
    if isinstance(dim, bool):  # sort.stable(self, *, stable, dim, descending) positional quirk
        dim, descending = descending, False
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    idx = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(x, idx, axis=dim), idx


@register(aten.topk.default)
def _topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    moved = jnp.moveaxis(x, dim, -1)
    values, idx = lax.top_k(moved if largest else -moved, k)
    values = values if largest else -values
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(idx, -1, dim)


# --------------------------------------------------------------------------------- linear algebra


@register(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.dot.default, aten.mv.default)
def _matmul(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


@register(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(x, a, b, *, beta=1, alpha=1):
    prod = jnp.matmul(a, b, precision=_HIGHEST)
    prod = prod * alpha if alpha != 1 else prod
    return prod + (x * beta if beta != 1 else x)


@register(aten.linear.default)
def _linear(x, w, b=None):
    y = jnp.matmul(x, w.T, precision=_HIGHEST)
    return y if b is None else y + b


# ------------------------------------------------------------------- scans, order statistics
def _cumulative_extreme(x, dim, better):
    """(running extreme, index of the element that set it) along dim; a later element that ties
    takes the index, and NaN, once seen, stays (ATen's cummax / cummin)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    index = jnp.broadcast_to(jnp.arange(x.shape[axis], dtype=jnp.int64).reshape(shape), x.shape)

    def combine(a, b):
        take_b = jnp.isnan(b[0]) | (~jnp.isnan(a[0]) & better(b[0], a[0]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    return lax.associative_scan(combine, (x, index), axis=axis)


@register(aten.cummax.default)
def _cummax(x, dim):
    return _cumulative_extreme(x, dim, jnp.greater_equal)


@register(aten.cummin.default)
def _cummin(x, dim):
    return _cumulative_extreme(x, dim, jnp.less_equal)


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) as ATen's logcumsumexp computes it (equal infinities stay)."""
    low, high = jnp.minimum(a, b), jnp.maximum(a, b)
    same_inf = (low == high) & ~jnp.isfinite(low)
    return jnp.where(same_inf, a, jnp.log1p(jnp.exp(low - high)) + high)


@register(aten.logcumsumexp.default)
def _logcumsumexp(x, dim):
    """A sequential scan, in ATen's order of roundings."""
    if x.ndim == 0:
        return x
    moved = jnp.moveaxis(x, _axis(dim, x.ndim), 0)

    def step(carry, row):
        out = _log_add_exp(carry, row)
        return out, out

    _, out = lax.scan(step, moved[0], moved[1:])
    out = jnp.concatenate([moved[:1], out], axis=0)
    return jnp.moveaxis(out, 0, _axis(dim, x.ndim))


def _order_statistic(x, dim, keepdim, position):
    """(value, index) of the element at sorted ``position`` (an int or an array broadcast over
    the other dims) along dim (None: over the flattened x, value only)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    order = jnp.argsort(x, axis=axis, stable=True)
    others = x.shape[:axis] + x.shape[axis + 1 :]
    position = jnp.expand_dims(jnp.broadcast_to(jnp.asarray(position), others), axis)
    index = jnp.take_along_axis(order, position.astype(order.dtype), axis=axis)
    value = jnp.take_along_axis(x, index, axis=axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index


@register(aten.kthvalue.default)
def _kthvalue(x, k, dim=-1, keepdim=False):
    return _order_statistic(x, dim, keepdim, k - 1)


@register(aten.median.dim)
def _median_dim(x, dim, keepdim=False):
    size = 1 if x.ndim == 0 else x.shape[_axis(dim, x.ndim)]
    return _order_statistic(x, dim, keepdim, (size - 1) // 2)


@register(aten.median.default)
def _median(x):
    return _median_dim(x.reshape(-1), 0)[0]


def _nan_median_position(x, axis):
    """The lower median's sorted position among the non-NaN elements (NaN sorts last)."""
    count = jnp.sum(~jnp.isnan(x), axis=axis)
    return jnp.maximum(count - 1, 0) // 2


@register(aten.nanmedian.dim)
def _nanmedian_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _order_statistic(x, dim, keepdim, _nan_median_position(x, _axis(dim, x.ndim)))


@register(aten.nanmedian.default)
def _nanmedian(x):
    return _nanmedian_dim(x.reshape(-1), 0)[0]


@register(aten.histc.default)
def _histc(x, bins=100, min=0, max=0):  # noqa: A002
    """Counts of x in ``bins`` equal bins over [min, max] (both 0: x's own range, widened by 1
    each side when it is one value); elements outside are ignored, max falls in the last bin."""
    low, high = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    if min == max == 0:
        low, high = jnp.min(x), jnp.max(x)
        same = low == high
        low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    flat = x.reshape(-1)
    inside = (flat >= low) & (flat <= high)
    position = ((flat - low) * bins / (high - low)).astype(jnp.int64)
    position = jnp.clip(position, 0, bins - 1)
    return jnp.zeros((bins,), x.dtype).at[position].add(inside.astype(x.dtype))


# ---------------------------------------------------------------------------------- distances
def _pnorm(diff, p, axis=-1):
    """The p-norm of diff along axis, with a zero gradient at zero distance (as ATen)."""
    if p == 0:
        return jnp.sum(diff != 0, axis=axis).astype(diff.dtype)
    if p == math.inf:
        return jnp.max(jnp.abs(diff), axis=axis)
    size = jnp.abs(diff)
    total = jnp.sum(size**p, axis=axis)
    safe = jnp.where(total == 0, 1, total)
    return jnp.where(total == 0, 0, safe ** (1.0 / p))


@register(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode=None):
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p)


@register(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    return jax.vjp(lambda a: _cdist_forward(a, x2, p), x1)[1](grad)[0]


@register(aten._pdist_forward.default)
def _pdist_forward(x, p=2):
    rows, cols = np.triu_indices(x.shape[0], k=1)
    return _pnorm(x[rows] - x[cols], p)


@register(aten._pdist_backward.default)
def _pdist_backward(grad, x, p, pdist):
    return jax.vjp(lambda a: _pdist_forward(a, p), x)[1](grad)[0]


@register(aten.dist.default)
def _dist(x, y, p=2):
    return _pnorm((x - y).reshape(-1), p, axis=0)

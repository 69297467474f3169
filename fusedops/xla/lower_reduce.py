"""Lowerings of reductions, sorting and matrix products."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.lower import (
    _HIGHEST,
    _axis,
    _dims,
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
        from fusedops.xla.lower import jax_dtype

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

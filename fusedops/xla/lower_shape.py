"""Lowerings of views, indexing/scatter, factories, casts and random ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from fusedops.xla.lower import (
    _dims,
    jax_dtype,
    register,
)

aten = torch.ops.aten
prims = torch.ops.prims


# ---------------------------------------------------------------------------------- shape & views
@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(x, size):
    return jnp.reshape(x, tuple(size))


@register(prims.collapse_view.default)
def _collapse_view(x, start, end):
    return jnp.reshape(x, x.shape[:start] + (-1,) + x.shape[end + 1 :])


@register(aten.permute.default)
def _permute(x, dims):
    return jnp.transpose(x, tuple(d % x.ndim for d in dims))


@register(aten.transpose.int)
def _transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1)


@register(aten.t.default)
def _t(x):
    return x.T


@register(aten.expand.default)
def _expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(x, dim=None):
    axes = _dims(dim, x.ndim) if x.ndim else ()
    return jnp.squeeze(x, axis=tuple(a for a in axes if x.shape[a] == 1))


@register(aten.unsqueeze.default)
def _unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


def _slice_bounds(size: int, start, end, step: int) -> tuple[int, int, int]:
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@register(aten.slice.Tensor)
def _slice(x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    s, e, st = _slice_bounds(x.shape[dim], start, end, step)
    return lax.slice_in_dim(x, s, e, st, axis=dim)


@register(aten.slice_scatter.default)
def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    s, e, st = _slice_bounds(x.shape[dim], start, end, step)
    index = [slice(None)] * x.ndim
    index[dim] = slice(s, e, st)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@register(aten.select.int)
def _select(x, dim, index):
    # a static slice (not jnp.take's gather), which XLA fuses into its consumers
    dim = dim % x.ndim
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@register(aten.select_scatter.default)
def _select_scatter(x, src, dim, index):
    dim = dim % x.ndim
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(src.astype(x.dtype))


@register(aten.narrow.default)
def _narrow(x, dim, start, length):
    return lax.slice_in_dim(x, start, start + length, axis=dim % x.ndim)


@register(aten.cat.default)
def _cat(tensors, dim=0):
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    return jnp.concatenate(kept, axis=dim % kept[0].ndim)


@register(aten.stack.default)
def _stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim)


@register(aten.split.Tensor)
def _split(x, split_size, dim=0):
    size = x.shape[dim]
    bounds = list(range(split_size, size, split_size))
    return tuple(jnp.split(x, bounds, axis=dim))


@register(aten.split_with_sizes.default)
def _split_with_sizes(x, split_sizes, dim=0):
    return tuple(jnp.split(x, np.cumsum(split_sizes)[:-1].tolist(), axis=dim))


@register(aten.unbind.int)
def _unbind(x, dim=0):
    return tuple(jnp.moveaxis(x, dim, 0))


@register(aten.flip.default)
def _flip(x, dims):
    return jnp.flip(x, axis=tuple(dims))


@register(aten.roll.default)
def _roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@register(aten.repeat.default)
def _repeat(x, repeats):
    lead = len(repeats) - x.ndim
    return jnp.tile(x.reshape((1,) * lead + x.shape), tuple(repeats))


@register(aten.tril.default)
def _tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@register(aten.triu.default)
def _triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@register(aten.constant_pad_nd.default)
def _constant_pad_nd(x, pad, value=0):
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


@register(aten.as_strided.default, meta=True)
def _as_strided(x, size, stride, storage_offset=None, *, meta):
    flat = x.reshape(-1)
    offset = storage_offset or 0
    index = np.full(tuple(size), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + (np.arange(n) * s).reshape(shape)
    return flat[jnp.asarray(index)]


# ------------------------------------------------------------------------------ indexing, scatter
def _grid(index, dim: int):
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


@register(aten.gather.default)
def _gather(x, dim, index, *, sparse_grad=False):
    return x[_grid(index, dim % x.ndim)]


def _fit(src, index):
    if not hasattr(src, "shape") or src.ndim == 0:
        return src
    return src[tuple(slice(0, n) for n in index.shape)]


@register(aten.scatter.src, aten.scatter.value)
def _scatter(x, dim, index, src):
    return x.at[_grid(index, dim % x.ndim)].set(_fit(src, index))


@register(aten.scatter_add.default)
def _scatter_add(x, dim, index, src):
    return x.at[_grid(index, dim % x.ndim)].add(_fit(src, index))


@register(aten.scatter_reduce.two)
def _scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    grid, src = _grid(index, dim % x.ndim), _fit(src, index)
    if reduce == "sum":
        base = x if include_self else x.at[grid].set(0)
        return base.at[grid].add(src)
    if reduce in ("amax", "amin"):
        fill = -jnp.inf if reduce == "amax" else jnp.inf
        base = x if include_self else x.at[grid].set(fill)
        return base.at[grid].max(src) if reduce == "amax" else base.at[grid].min(src)
    if reduce == "prod":
        base = x if include_self else x.at[grid].set(1)
        return base.at[grid].multiply(src)
    raise NotImplementedError(f"scatter_reduce(reduce={reduce!r})")


def _index_tuple(indices):
    return tuple(slice(None) if i is None else i for i in indices)


@register(aten.index.Tensor)
def _index(x, indices):
    return x[_index_tuple(indices)]


@register(aten.index_put.default)
def _index_put(x, indices, values, accumulate=False):
    ref = x.at[_index_tuple(indices)]
    values = values.astype(x.dtype)
    return ref.add(values) if accumulate else ref.set(values)


@register(aten.index_select.default)
def _index_select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@register(aten.index_add.default)
def _index_add(x, dim, index, source, *, alpha=1):
    idx = [slice(None)] * x.ndim
    idx[dim % x.ndim] = index
    return x.at[tuple(idx)].add(source * alpha if alpha != 1 else source)


# --------------------------------------------------------------------------- factories and casts
def _meta_dtype(meta):
    return jax_dtype(meta.dtype)


@register(
    aten.full.default,
    aten.full_like.default,
    aten.new_full.default,
    aten.scalar_tensor.default,
    meta=True,
)
def _full(*args, meta, **kwargs):
    fill = args[-1] if args else kwargs.get("fill_value", kwargs.get("s"))
    if len(args) == 1:  # scalar_tensor(s)
        fill = args[0]
    return jnp.full(tuple(meta.shape), fill, _meta_dtype(meta))


@register(
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_permuted.default,
    meta=True,
)
def _zeros(*args, meta, **kwargs):
    return jnp.zeros(tuple(meta.shape), _meta_dtype(meta))


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default, meta=True)
def _ones(*args, meta, **kwargs):
    return jnp.ones(tuple(meta.shape), _meta_dtype(meta))


@register(aten.arange.default, aten.arange.start, aten.arange.start_step, meta=True)
def _arange(*args, meta, **kwargs):
    nums = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    n = meta.shape[0]
    return (start + step * jnp.arange(n, dtype=jnp.float64)).astype(_meta_dtype(meta))


@register(aten.linspace.default, meta=True)
def _linspace(start, end, steps, **kwargs):
    return jnp.linspace(start, end, steps).astype(_meta_dtype(kwargs["meta"]))


@register(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, meta=True)
def _to_copy(x, *args, meta, **kwargs):
    return x.astype(_meta_dtype(meta))


@register(prims.convert_element_type.default)
def _convert_element_type(x, dtype):
    return x.astype(jax_dtype(dtype))


@register(aten.copy.default)
def _copy(dst, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(dst.dtype), dst.shape)


# ------------------------------------------------------------------------------------------ random
@register(aten.native_dropout.default, key=True)
def _native_dropout(x, p, train, *, key):
    if train is False or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p >= 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    mask = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(mask, x * (1.0 / (1.0 - p)), jnp.zeros((), x.dtype)), mask


@register(aten.native_dropout_backward.default)
def _native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


@register(aten.rand.default, aten.rand_like.default, meta=True, key=True)
def _rand(*args, meta, key, **kwargs):
    return jax.random.uniform(key, tuple(meta.shape), _meta_dtype(meta))


@register(aten.randn.default, aten.randn_like.default, meta=True, key=True)
def _randn(*args, meta, key, **kwargs):
    return jax.random.normal(key, tuple(meta.shape), _meta_dtype(meta))


@register(aten.bernoulli.p, meta=True, key=True)
def _bernoulli_p(x, p=0.5, *, meta, key, **kwargs):
    return jax.random.bernoulli(key, p, x.shape).astype(_meta_dtype(meta))


@register(aten.bernoulli.default, meta=True, key=True)
def _bernoulli(x, *, meta, key, **kwargs):
    return (jax.random.uniform(key, x.shape, jnp.float32) < x).astype(_meta_dtype(meta))


@register(aten.randint.low, aten.randint.low_generator, meta=True, key=True)
def _randint_low(low, high, size, *, meta, key, **kwargs):
    return jax.random.randint(key, tuple(meta.shape), low, high, _meta_dtype(meta))


@register(aten.randint.default, aten.randint.generator, meta=True, key=True)
def _randint(high, size, *, meta, key, **kwargs):
    return _randint_low(0, high, size, meta=meta, key=key)

"""Lowerings of views, indexing/scatter, factories, casts and random ops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from fusedops.xla.errors import XLATraceError
from fusedops.xla.lower_table import (
    _axis,
    _dims,
    _is_float,
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
    if isinstance(dim, (list, tuple)) and not dim:  # squeeze(t, ()) squeezes nothing
        return x
    axes = _dims(dim, x.ndim)
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
    return x.reshape(-1)[jnp.asarray(_strided_index(size, stride, storage_offset))]


# ------------------------------------------------------------------------------ indexing, scatter
def _grid(index, dim: int):
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def _along_dim(fn):
    """Wrap a gather/scatter lowering ``fn(x, dim, index, *rest)`` so a 0-dim x (and index,
    src) is handled as one element along dim 0, as torch does."""

    def lowering(x, dim, index, *args, **kwargs):
        if x.ndim > 0:
            return fn(x, dim % x.ndim, index, *args, **kwargs)
        one = lambda v: v.reshape(1) if hasattr(v, "ndim") and v.ndim == 0 else v  # noqa: E731
        return fn(x.reshape(1), 0, index.reshape(1), *map(one, args), **kwargs).reshape(())

    return lowering


@register(aten.gather.default)
@_along_dim
def _gather(x, dim, index, *, sparse_grad=False):
    return x[_grid(index, dim)]


def _fit(src, index):
    if not hasattr(src, "shape") or src.ndim == 0:
        return src
    return src[tuple(slice(0, n) for n in index.shape)]


def _one_per_row(x, dim: int, index) -> bool:
    """Whether ``index`` names one position along ``dim`` for every row of x (its shape is x's
    with 1 at ``dim``): a one-hot write, as in the decomposed ``nll_loss_backward``."""
    return index.ndim == x.ndim and index.shape == x.shape[:dim] + (1,) + x.shape[dim + 1 :]


@register(aten.scatter.src, aten.scatter.value)
@_along_dim
def _scatter(x, dim, index, src):
    src = _fit(src, index)
    if _one_per_row(x, dim, index):
        # a compare against the index, an elementwise expression XLA fuses with its users, not
        # a scatter into a materialised copy of x (a masked-LM head's [1024, 4096] one-hot
        # gradient: 4 ms to fill and scatter on the 2-core CPU)
        hit = lax.broadcasted_iota(index.dtype, x.shape, dim) == index
        return jnp.where(hit, jnp.asarray(src, x.dtype), x)
    return x.at[_grid(index, dim)].set(src)


@register(aten.scatter_add.default)
@_along_dim
def _scatter_add(x, dim, index, src):
    return x.at[_grid(index, dim)].add(_fit(src, index))


@register(aten.scatter_reduce.two)
@_along_dim
def _scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    grid, src = _grid(index, dim), _fit(src, index)
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
    if reduce == "mean":  # positions no index names keep x; integers round down, as torch
        count = jnp.zeros(x.shape, jnp.int64).at[grid].add(1)
        base = x if include_self else x.at[grid].set(0)
        total = base.at[grid].add(src)
        n = jnp.maximum(count + (1 if include_self else 0), 1).astype(x.dtype)
        mean = total / n if _is_float(x) else jnp.floor_divide(total, n)
        return jnp.where(count > 0, mean, x)
    raise NotImplementedError(f"scatter_reduce(reduce={reduce!r})")


def _index_tuple(indices):
    return tuple(slice(None) if i is None else i for i in indices)


@register(aten.index.Tensor)
def _index(x, indices):
    return x[_index_tuple(indices)]


@register(aten.index_put.default)
def _index_put(x, indices, values, accumulate=False):
    values = values.astype(x.dtype)
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype == jnp.bool_:
        return _masked_put(x, indices[0], values, accumulate)
    ref = x.at[_index_tuple(indices)]
    return ref.add(values) if accumulate else ref.set(values)


def _masked_put(x, mask, values, accumulate):
    """``x[mask] = values`` (or ``+=``) for a boolean ``mask`` over x's leading dims, with
    ``values`` broadcast over the selected elements: a static ``where``. (Values with one row
    per selected element have a data-dependent shape.)"""
    trailing = x.ndim - mask.ndim
    if values.ndim > trailing:
        lead = values.shape[: values.ndim - trailing]
        if any(d != 1 for d in lead):
            raise XLATraceError(
                "index_put with a boolean mask and one value per selected element has a "
                "data-dependent shape; use torch.where(mask, values, x)"
            )
        values = values.reshape(values.shape[values.ndim - trailing :])
    mask = mask.reshape(mask.shape + (1,) * trailing)
    if accumulate:
        return x + jnp.where(mask, values, jnp.zeros((), x.dtype))
    return jnp.where(mask, values, x)


@register(aten.index_select.default)
def _index_select(x, dim, index):
    if x.ndim == 0:  # torch: index is [0] (or 0-dim), the result x itself
        return x
    return jnp.take(x, index.reshape(-1), axis=_axis(dim, x.ndim))


def _along(x, dim, index):
    """The ``.at[]`` index selecting ``index`` (1-D) along ``dim`` of x."""
    idx = [slice(None)] * x.ndim
    idx[_axis(dim, x.ndim)] = index.reshape(-1)
    return tuple(idx)


@register(aten.index_add.default)
def _index_add(x, dim, index, source, *, alpha=1):
    source = source * alpha if alpha != 1 else source
    if x.ndim == 0:
        return x + source.reshape(())
    return x.at[_along(x, dim, index)].add(source.astype(x.dtype))


@register(aten.index_copy.default)
def _index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.reshape(()).astype(x.dtype)
    return x.at[_along(x, dim, index)].set(source.astype(x.dtype))


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(x, dim, index, value):
    value = jnp.asarray(value).astype(x.dtype)
    if x.ndim == 0:
        return value.reshape(())
    return x.at[_along(x, dim, index)].set(value)


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
    aten._efficientzerotensor.default,
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


# ----------------------------------------------------------- strided scatter, unfold, diagonals
def _strided_index(size, stride, storage_offset) -> np.ndarray:
    """Flat storage positions of ``as_strided(size, stride, storage_offset)``."""
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + (np.arange(n) * s).reshape(shape)
    return index


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(x, src, size, stride, storage_offset=None):
    """x (contiguous) with the elements of ``x.as_strided(size, stride, offset)`` set to src."""
    index = _strided_index(size, stride, storage_offset)
    flat = x.reshape(-1).at[jnp.asarray(index.reshape(-1))].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


def _unfold_index(length: int, size: int, step: int) -> np.ndarray:
    """(windows, size) positions along the unfolded dim."""
    count = (length - size) // step + 1
    return np.arange(count)[:, None] * step + np.arange(size)[None, :]


@register(aten.unfold.default)
def _unfold(x, dimension, size, step):
    """``Tensor.unfold``: windows of ``size`` every ``step`` along ``dimension``, the window
    elements as a new last dim."""
    if x.ndim == 0:
        return x.reshape(1)
    dim = _axis(dimension, x.ndim)
    index = _unfold_index(x.shape[dim], size, step)
    windows = jnp.take(x, jnp.asarray(index), axis=dim)  # (..., count, size, ...)
    return jnp.moveaxis(windows, dim + 1, -1)


@register(aten.unfold_backward.default)
def _unfold_backward(grad, input_sizes, dim, size, step):
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    return jax.vjp(lambda v: _unfold(v, dim, size, step), zeros)[1](grad)[0]


def _diagonal_index(shape, offset: int, dim1: int, dim2: int):
    """(rows, cols) positions of the diagonal ``offset`` of dims ``dim1``, ``dim2``."""
    rows, cols = shape[dim1], shape[dim2]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    k = np.arange(length)
    return k + max(-offset, 0), k + max(offset, 0)


@register(aten.diagonal.default)
def _diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _axis(dim1, x.ndim), _axis(dim2, x.ndim))


@register(aten.diagonal_scatter.default)
def _diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _axis(dim1, x.ndim), _axis(dim2, x.ndim)
    rows, cols = _diagonal_index(x.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@register(aten.diagonal_backward.default)
def _diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    return _diagonal_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, offset, dim1, dim2)


# ------------------------------------------------------------------------------------ searching
def _sorted_search(sequence, values, right: bool, sorter):
    """Insertion positions of ``values`` in ``sequence`` (1-D, or batched over leading dims)."""
    if sorter is not None:
        sequence = jnp.take_along_axis(sequence, sorter, axis=-1)
    side = "right" if right else "left"
    if sequence.ndim == 1:
        return jnp.searchsorted(sequence, values, side=side)
    search = lambda s, v: jnp.searchsorted(s, v, side=side)  # noqa: E731
    for _ in range(sequence.ndim - 1):
        search = jax.vmap(search)
    return search(sequence, values)


@register(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    found = _sorted_search(sequence, jnp.asarray(values), right, sorter)
    return found.astype(jnp.int32 if out_int32 else jnp.int64)


@register(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(values, boundaries, *, out_int32=False, right=False):
    found = _sorted_search(boundaries, jnp.asarray(values), right, None)
    return found.astype(jnp.int32 if out_int32 else jnp.int64)


# ------------------------------------------------------------------- put, index_reduce, masks
@register(aten.put.default)
def _put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    index = jnp.where(index < 0, index + flat.shape[0], index).reshape(-1)
    ref = flat.at[index]
    source = source.reshape(-1).astype(x.dtype)
    return (ref.add(source) if accumulate else ref.set(source)).reshape(x.shape)


@register(aten.index_reduce.default)
def _index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """index_reduce: scatter_reduce with ``index`` (1-D) along dim broadcast over source."""
    if x.ndim == 0:
        return _scatter_reduce(x, 0, index.reshape(()), source.reshape(()), reduce,
                               include_self=include_self)  # fmt: skip
    dim = _axis(dim, x.ndim)
    shape = [1] * source.ndim
    shape[dim] = index.shape[0]
    full = jnp.broadcast_to(index.reshape(shape), source.shape)
    return _scatter_reduce(x, dim, full, source, reduce, include_self=include_self)


@register(aten.masked_scatter.default)
def _masked_scatter(x, mask, source):
    """x with its masked elements (row-major order) replaced by source's first elements."""
    mask = jnp.broadcast_to(mask, x.shape).reshape(-1)
    position = jnp.clip(jnp.cumsum(mask) - 1, 0, max(source.size - 1, 0))
    values = source.reshape(-1)[position].astype(x.dtype)
    return jnp.where(mask, values, x.reshape(-1)).reshape(x.shape)


@register(aten.masked_scatter_backward.default, meta=True)
def _masked_scatter_backward(grad, mask, sizes, *, meta):
    """The source's gradient: the masked elements of grad in order, zeros after them."""
    mask = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    size = math.prod(sizes)
    position = jnp.where(mask, jnp.cumsum(mask) - 1, size)
    out = jnp.zeros((size + 1,), grad.dtype).at[position].add(grad.reshape(-1))
    return out[:size].reshape(tuple(sizes))


register(aten.narrow_copy.default)(_narrow)

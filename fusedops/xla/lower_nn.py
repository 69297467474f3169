"""Lowerings of convolution, pooling, normalization, softmax, losses, embedding and attention."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla import lower_depthwise
from fusedops.xla.lower_table import (
    _HIGHEST,
    _dims,
    jax_dtype,
    on_cpu,
    register,
)

aten = torch.ops.aten
prims = torch.ops.prims


# ------------------------------------------------------------------------------------ convolution
def _conv_dims(nd: int) -> lax.ConvDimensionNumbers:
    spatial = "DHW"[3 - nd :]
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


#: the most kernel taps a depthwise convolution is unrolled into (``lower_depthwise``): 9x9
_DEPTHWISE_TAPS = 81


def _depthwise_shapes(x_shape, w_shape, transposed: bool, groups: int) -> bool:
    """Whether a convolution of these shapes runs as ``lower_depthwise``'s on the CPU: every
    group reading one input channel (ConvNeXt's, MobileNet's), at most ``_DEPTHWISE_TAPS``
    taps, batched, and something to compute."""
    return (
        len(x_shape) == len(w_shape)
        and not transposed
        and groups > 1
        and groups == x_shape[1]
        and w_shape[1] == 1
        and math.prod(w_shape[2:]) <= _DEPTHWISE_TAPS
        and math.prod(x_shape) > 0
        and math.prod(w_shape) > 0
    )


def _pointwise_shapes(x_shape, w_shape, transposed: bool, groups: int, padding) -> bool:
    """Whether a convolution of these shapes runs as ``_pointwise``'s matrix products on the
    CPU: a dense 1x1 (1x1x1...) kernel without padding, batched, something to compute."""
    return (
        not transposed
        and groups == 1
        and len(x_shape) == len(w_shape)
        and all(k == 1 for k in w_shape[2:])
        and not any(padding)
        and math.prod(x_shape) > 0
        and math.prod(w_shape) > 0
    )


def xla_convolution_on_cpu(x_shape, w_shape, transposed: bool, groups: int, padding) -> bool:
    """Whether a convolution (``x_shape``, weight ``w_shape``; an unbatched x is batched first,
    as ``_convolution`` does) stays an XLA convolution on the CPU: neither unrolled by
    ``lower_depthwise`` nor ``_pointwise``'s products."""
    if len(x_shape) == len(w_shape) - 1:
        x_shape = (1, *x_shape)
    return not (
        _depthwise_shapes(x_shape, w_shape, transposed, groups)
        or _pointwise_shapes(x_shape, w_shape, transposed, groups, padding)
    )


def _cpu_depthwise(x, w, transposed: bool, groups: int) -> bool:
    return on_cpu() and _depthwise_shapes(x.shape, w.shape, transposed, groups)


def _cpu_pointwise(x, w, transposed: bool, groups: int, padding) -> bool:
    return on_cpu() and _pointwise_shapes(x.shape, w.shape, transposed, groups, padding)


def _pointwise(x, w, stride):
    """A 1x1 convolution ``[N, C, *S] x [O, C, 1...]`` -> ``[N, O, *out]`` as a matrix product
    per sample (``W @ x[n]`` over the flattened positions, every stride-th one): NCHW stays as
    it is. XLA:CPU's convolution wants the channels innermost, and the transposes it adds
    (fused with the elementwise producers of a backward's gradients, whose layout they change)
    cost more than the product (ResNet's bottlenecks: mostly 1x1 convolutions)."""
    if any(s != 1 for s in stride):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    n, c, *out = x.shape
    y = jnp.einsum("oc,ncl->nol", w.reshape(w.shape[0], c), x.reshape(n, c, -1), precision=_HIGHEST)
    return y.reshape(n, w.shape[0], *out)


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x[None]
    stride, dilation = list(stride) * (nd // len(stride)), list(dilation) * (nd // len(dilation))
    padding = list(padding) * (nd // len(padding))
    if _cpu_depthwise(x, w, transposed, groups):
        y = lower_depthwise.depthwise(x, w, stride, padding, dilation)
    elif _cpu_pointwise(x, w, transposed, groups, padding):
        y = _pointwise(x, w, stride)
    elif not transposed:
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=_conv_dims(nd),
            feature_group_count=groups,
            precision=_HIGHEST,
        )
    else:
        cin, cout_g, *k = w.shape
        w = w.reshape(groups, cin // groups, cout_g, *k)
        w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
        output_padding = list(output_padding) * (nd // max(len(output_padding), 1))
        pads = [
            (d * (kk - 1) - p, d * (kk - 1) - p + op)
            for d, kk, p, op in zip(dilation, k, padding, output_padding or [0] * nd)
        ]
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=[1] * nd,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=_conv_dims(nd),
            feature_group_count=groups,
            precision=_HIGHEST,
        )
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y[0] if unbatched else y


@register(aten.convolution.default)
def _convolution_op(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)


@register(aten.convolution_backward.default)
def _convolution_backward(
    grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask
):
    if _cpu_depthwise(x, w, transposed, groups) and grad.size > 0:
        return _depthwise_backward(grad, x, w, stride, padding, dilation, mask)

    def forward(xx, ww):
        return _convolution(
            xx, ww, None, stride, padding, dilation, transposed, output_padding, groups
        )

    _, pullback = jax.vjp(forward, x, w)
    gx, gw = pullback(grad)
    axes = (0,) + tuple(range(2, grad.ndim))
    gb = jnp.sum(grad, axis=axes) if mask[2] else None
    return (gx if mask[0] else None), (gw if mask[1] else None), gb


def _depthwise_backward(grad, x, w, stride, padding, dilation, mask):
    nd = w.ndim - 2
    stride, dilation = list(stride) * (nd // len(stride)), list(dilation) * (nd // len(dilation))
    padding = list(padding) * (nd // len(padding))
    args = (grad, x, w, stride, padding, dilation)
    gx = lower_depthwise.depthwise_input_grad(*args) if mask[0] else None
    gw = lower_depthwise.depthwise_weight_grad(*args) if mask[1] else None
    gb = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if mask[2] else None
    return gx, gw, gb


# ---------------------------------------------------------------------------------- normalization
def _bn_axes(x) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _bn_shape(x) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_train(x, weight, bias, eps):
    axes = _bn_axes(x)
    mean = jnp.mean(x, axis=axes)
    var = jnp.var(x, axis=axes)
    invstd = lax.rsqrt(var + eps)
    y = (x - mean.reshape(_bn_shape(x))) * invstd.reshape(_bn_shape(x))
    if weight is not None:
        y = y * weight.reshape(_bn_shape(x))
    if bias is not None:
        y = y + bias.reshape(_bn_shape(x))
    return y, mean, invstd, var


def _bn_eval(x, weight, bias, running_mean, running_var, eps):
    invstd = lax.rsqrt(running_var + eps)
    y = (x - running_mean.reshape(_bn_shape(x))) * invstd.reshape(_bn_shape(x))
    if weight is not None:
        y = y * weight.reshape(_bn_shape(x))
    if bias is not None:
        y = y + bias.reshape(_bn_shape(x))
    return y


@register(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        y = _bn_eval(x, weight, bias, running_mean, running_var, eps)
        empty = jnp.zeros((0,), x.dtype)
        return y, empty, empty, running_mean, running_var
    y, mean, invstd, var = _bn_train(x, weight, bias, eps)
    n = x.size // x.shape[1]
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    unbiased = var * (n / max(n - 1, 1))
    new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return y, mean, invstd, new_mean, new_var


@register(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    """(y, mean, invstd, reserve (empty), new running mean, new running var)."""
    y, mean, invstd, new_mean, new_var = _batch_norm_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return y, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    outs = _batch_norm_functional(
        x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    return outs[:3]


@register(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    y, mean, invstd, _ = _bn_train(x, weight, bias, eps)
    return y, mean, invstd


@register(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    empty = jnp.zeros((0,), x.dtype)
    return _bn_eval(x, weight, bias, running_mean, running_var, eps), empty, empty


@register(aten.native_batch_norm_backward.default)
def _batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask
):
    axes, shape = _bn_axes(x), _bn_shape(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = running_mean, lax.rsqrt(running_var + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    gb = jnp.sum(grad, axis=axes)
    gw = jnp.sum(grad * xhat, axis=axes)
    w = weight.reshape(shape) if weight is not None else 1.0
    if train:
        n = x.size // x.shape[1]
        gx = (w * invstd.reshape(shape) / n) * (
            n * grad - gb.reshape(shape) - xhat * gw.reshape(shape)
        )
    else:
        gx = grad * w * invstd.reshape(shape)
    return (gx if mask[0] else None), (gw if mask[1] else None), (gb if mask[2] else None)


@register(aten.batch_norm_backward.default)
def _batch_norm_backward_with_reserve(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, mask,
    reserve,
):  # fmt: skip
    return _batch_norm_backward(
        grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, mask
    )


@register(aten.native_layer_norm.default)
def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.var(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    n = math.prod(normalized_shape)
    xhat = (x - mean) * rstd
    g = grad * weight if weight is not None else grad
    gx = (rstd / n) * (
        n * g
        - jnp.sum(g, axis=axes, keepdims=True)
        - xhat * jnp.sum(g * xhat, axis=axes, keepdims=True)
    )
    gw = jnp.sum(grad * xhat, axis=lead) if (mask[1] and weight is not None) else None
    gb = jnp.sum(grad, axis=lead) if (mask[2] and bias is not None) else None
    return (gx if mask[0] else None), gw, gb


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    xg = x.reshape(n, group, -1)
    mean = jnp.mean(xg, axis=-1)
    rstd = lax.rsqrt(jnp.var(xg, axis=-1) + eps)
    y = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y, mean, rstd


@register(aten.native_group_norm.default)
def _native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    return _group_norm(x, weight, bias, n, c, hxw, group, eps)


@register(aten.native_group_norm_backward.default)
def _native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, mask):
    shape = (1, c) + (1,) * (x.ndim - 2)
    xg = x.reshape(n, group, -1)
    xhat = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    g = grad * weight.reshape(shape) if weight is not None else grad
    gg, hg = g.reshape(n, group, -1), (g * xhat).reshape(n, group, -1)
    gx = rstd[..., None] * (
        gg
        - jnp.mean(gg, axis=-1, keepdims=True)
        - xhat.reshape(n, group, -1) * jnp.mean(hg, axis=-1, keepdims=True)
    )
    axes = (0,) + tuple(range(2, x.ndim))
    gw = jnp.sum(grad * xhat, axis=axes) if mask[1] else None
    gb = jnp.sum(grad, axis=axes) if mask[2] else None
    return (gx.reshape(x.shape) if mask[0] else None), gw, gb


# -------------------------------------------------------------------------- softmax, losses, embed
@register(aten._softmax.default)
def _softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(x, axis=_dims(dim, x.ndim))


@register(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(x, axis=_dims(dim, x.ndim))


@register(aten._softmax_backward_data.default)
def _softmax_backward_data(grad, out, dim, input_dtype):
    return out * (grad - jnp.sum(grad * out, axis=_dims(dim, out.ndim), keepdims=True))


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad, out, dim, input_dtype):
    return grad - jnp.exp(out) * jnp.sum(grad, axis=_dims(dim, out.ndim), keepdims=True)


def _nll_parts(x, target, weight, ignore_index):
    cdim = 1 if x.ndim >= 2 else 0
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, cdim), axis=cdim).squeeze(cdim)
    w = jnp.ones((x.shape[cdim],), x.dtype) if weight is None else weight
    wt = jnp.where(valid, w[safe], 0).astype(x.dtype)
    return -picked * wt, wt


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, meta=True)
def _nll_loss_forward(x, target, weight, reduction, ignore_index, *, meta):
    losses, wt = _nll_parts(x, target, weight, ignore_index)
    total = jnp.sum(wt)
    if reduction == 0:
        return losses, jnp.zeros(tuple(meta[1].shape), x.dtype)
    if reduction == 1:
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    """The vjp of the forward's math (``_nll_parts``). Only reached by graphs that keep the op
    whole: partial_trace and xla_trace decompose it into a one-hot scatter, which
    ``lower_shape._scatter`` lowers as a compare against the class index."""

    def forward(v):
        losses, _ = _nll_parts(v, target, weight, ignore_index)
        if reduction == 0:
            return losses
        total = jnp.sum(losses)
        return total / total_weight if reduction == 1 else total

    return jax.vjp(forward, x)[1](grad)[0]


@register(aten.embedding.default)
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@register(aten.embedding_dense_backward.default)
def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat_idx = indices.reshape(-1)
    flat_grad = grad.reshape(flat_idx.shape[0], -1)
    if padding_idx >= 0:
        flat_grad = jnp.where((flat_idx == padding_idx)[:, None], 0, flat_grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat_idx].add(1)
        flat_grad = flat_grad / counts[flat_idx][:, None]
    out = jnp.zeros((num_weights, flat_grad.shape[1]), grad.dtype)
    return out.at[flat_idx].add(flat_grad)


def _bags(offsets, n: int, include_last_offset: bool):
    """The bag of each of ``n`` indices (``offsets`` are the bags' starts) and the bag count."""
    starts = offsets[:-1] if include_last_offset else offsets
    return jnp.searchsorted(starts, jnp.arange(n), side="right") - 1, starts.shape[0]


def _embedding_bag_parts(weight, indices, bag, bags, mode, per_sample_weights, padding_idx):
    """(output (bags, D), count of kept indices per bag, rows of the maxima (mode max) or
    None). Indices equal to ``padding_idx`` count for nothing; an empty bag gives zeros."""
    n = indices.shape[0]
    kept = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), jnp.bool_)
    rows = jnp.take(weight, indices, axis=0)
    count = jnp.zeros((bags,), jnp.int64).at[bag].add(kept.astype(jnp.int64))
    if mode == 2:
        masked = jnp.where(kept[:, None], rows, -jnp.inf)
        best = jnp.full((bags, weight.shape[1]), -jnp.inf, weight.dtype).at[bag].max(masked)
        first = jnp.where(kept[:, None] & (masked == best[bag]), jnp.arange(n)[:, None], n)
        first = jnp.full(best.shape, n).at[bag].min(first)
        filled = count[:, None] > 0
        best = jnp.where(filled, best, jnp.zeros((), weight.dtype))
        return best, count, jnp.where(filled, indices[jnp.minimum(first, n - 1)], 0)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    rows = jnp.where(kept[:, None], rows, jnp.zeros((), rows.dtype))
    out = jnp.zeros((bags, weight.shape[1]), weight.dtype).at[bag].add(rows)
    if mode == 1:
        out = out / jnp.maximum(count, 1)[:, None].astype(out.dtype)
    return out, count, None


@register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default, meta=True)
def _embedding_bag(
    weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
    per_sample_weights=None, include_last_offset=False, padding_idx=-1, *, meta,
):  # fmt: skip
    """(output, offset2bag, bag_size, max_indices) as ATen's CPU kernel returns them: offset2bag
    empty where ATen leaves it so, bag_size zeros for mode sum, max_indices the maxima's rows
    (mode max), bag_size (mean) or zeros (sum)."""
    bag, bags = _bags(offsets, indices.shape[0], include_last_offset)
    out, count, maxima = _embedding_bag_parts(
        weight, indices, bag, bags, mode, per_sample_weights, padding_idx
    )
    offset2bag = bag if meta[1].shape[0] == indices.shape[0] else jnp.zeros((0,), jnp.int64)
    bag_size = jnp.zeros_like(count) if mode == 0 else count
    max_indices = maxima if mode == 2 else bag_size
    return out, offset2bag, bag_size, jnp.broadcast_to(max_indices, tuple(meta[3].shape))


@register(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
    grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1,
):  # fmt: skip
    include_last = offsets.shape[0] == grad.shape[0] + 1
    bag, _ = _bags(offsets, indices.shape[0], include_last)
    return _embedding_bag_dense_backward(
        grad, indices, bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
        per_sample_weights, padding_idx,
    )  # fmt: skip


@register(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(
    grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
    mode, per_sample_weights, padding_idx=-1,
):  # fmt: skip
    """The weight's gradient: each bag's gradient to the rows it read (scaled by the sample
    weights, 1 / bag size for mode mean, 1 / the row's count with scale_grad_by_freq), or to
    the rows of its maxima (mode max)."""
    out = jnp.zeros((num_weights, grad.shape[1]), grad.dtype)
    if mode == 2:
        cols = jnp.broadcast_to(jnp.arange(grad.shape[1]), grad.shape)
        filled = (bag_size > 0)[:, None]
        return out.at[maximum_indices, cols].add(jnp.where(filled, grad, 0))
    kept = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    rows = grad[offset2bag]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(rows.dtype)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    return out.at[indices].add(jnp.where(kept[:, None], rows, 0))


@register(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    """d(per_sample_weights): each index's row dotted with its bag's gradient (mode sum)."""
    include_last = offsets.shape[0] == grad.shape[0] + 1
    bag, _ = _bags(offsets, indices.shape[0], include_last)
    rows = jnp.take(weight, indices, axis=0)
    out = jnp.sum(rows * grad[bag], axis=1)
    return jnp.where(indices != padding_idx, out, 0) if padding_idx >= 0 else out


# -------------------------------------------------------------------------------------- attention
# Softmax statistics are fp32 (or wider) whatever q's dtype, as in torch's fused kernels; the
# probabilities are cast back to v's dtype for the second product. k and v may have fewer heads
# than q (grouped-query attention): each of their heads serves q.shape[-3] // k.shape[-3] heads.
def _group(q, kv):
    """``kv`` with its heads repeated to q's head count (unchanged when they already match)."""
    if kv.ndim < 3 or kv.shape[-3] == q.shape[-3]:
        return kv
    return jnp.repeat(kv, q.shape[-3] // kv.shape[-3], axis=-3)


def _ungroup(grad, kv):
    """The gradient of ``_group(q, kv)`` (``grad``) summed back to ``kv``'s heads."""
    if grad.shape == kv.shape:
        return grad
    heads = kv.shape[-3]
    grouped = grad.reshape(*grad.shape[:-3], heads, grad.shape[-3] // heads, *grad.shape[-2:])
    return grouped.sum(axis=-3).astype(grad.dtype)


def _attention_scores(q, k, attn_mask, is_causal, scale):
    """Masked, scaled q @ k^T ([..., L, S], fp32 for 16-bit inputs) and the scale used. A
    32/64-bit q is scaled before the product (L x E multiplies instead of L x S); a 16-bit one
    is not, so the scale is applied to the fp32 scores as torch's kernels do."""
    scale = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    wide = jnp.promote_types(q.dtype, jnp.float32)
    early = wide == q.dtype
    left = q * jnp.asarray(scale, q.dtype) if early else q
    scores = jnp.matmul(
        left, jnp.swapaxes(_group(q, k), -1, -2), precision=_HIGHEST, preferred_element_type=wide
    )
    if not early:
        scores = scores * jnp.asarray(scale, wide)
    if is_causal:
        causal = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), jnp.bool_))
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(wide)
    return scores, scale


def _attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """Softmax attention: (out [..., L, Ev] in q's dtype, logsumexp [..., L] in fp32 or
    wider). A row whose keys are all masked gives out 0 and logsumexp 0, as in torch."""
    scores, _ = _attention_scores(q, k, attn_mask, is_causal, scale)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    if attn_mask is not None:  # only a mask can hide every key of a row
        row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    exps = jnp.exp(scores - row_max)
    sums = jnp.sum(exps, axis=-1, keepdims=True)
    if attn_mask is not None:
        sums = jnp.where(sums == 0, 1, sums)
    probs = (exps / sums).astype(v.dtype)
    out = jnp.matmul(probs, _group(q, v), precision=_HIGHEST).astype(q.dtype)
    return out, (row_max + jnp.log(sums))[..., 0]


def _attention_backward(grad, q, k, v, out, lse, attn_mask=None, is_causal=False, scale=None):
    """Gradients ``(dq, dk, dv, dscores)`` of ``_attention`` from its saved out and logsumexp:
    the probabilities are recomputed from lse (no second softmax) and the softmax backward uses
    rowsum(grad * out), as flash attention does. ``dscores`` (fp32) is the gradient of the
    masked scores, i.e. of an additive mask."""
    scores, scale = _attention_scores(q, k, attn_mask, is_causal, scale)
    wide = scores.dtype
    probs = jnp.exp(scores - lse[..., None].astype(wide))
    dv = jnp.matmul(jnp.swapaxes(probs.astype(v.dtype), -1, -2), grad, precision=_HIGHEST)
    dprobs = jnp.matmul(
        grad, jnp.swapaxes(_group(q, v), -1, -2), precision=_HIGHEST, preferred_element_type=wide
    )
    rowdot = jnp.sum(grad.astype(wide) * out.astype(wide), axis=-1, keepdims=True)
    dscores = probs * (dprobs - rowdot)
    dscaled = (dscores * jnp.asarray(scale, wide)).astype(q.dtype)
    dq = jnp.matmul(dscaled, _group(q, k), precision=_HIGHEST)
    dk = jnp.matmul(jnp.swapaxes(dscaled, -1, -2), q, precision=_HIGHEST)
    return dq, _ungroup(dk, k), _ungroup(dv.astype(v.dtype), v), dscores


def _no_dropout(dropout_p, op: str):
    if dropout_p:
        raise NotImplementedError(f"{op} with dropout has no exact XLA lowering")


def _with_bookkeeping(computed, meta):
    """``computed`` followed by what a fused attention op also returns for its own backward
    (rng state, sequence offsets, debug mask): zeros of the FakeTensor's shape and dtype, the
    integers and Nones as they are; no lowering reads them."""
    extra = []
    for m in meta[len(computed) :]:
        if isinstance(m, torch.Tensor):
            extra.append(jnp.zeros(tuple(m.shape), jax_dtype(m.dtype)))
        else:
            extra.append(m)
    return (*computed, *extra)


def _lse_as(lse, meta):
    """Our logsumexp ``[..., L]`` in the layout of the op's (FakeTensor ``meta``): as is,
    ``[..., L, 1]`` (cuDNN), or padded to a multiple of 32 / empty (memory-efficient)."""
    shape = tuple(meta.shape)
    if shape == lse.shape:
        return lse
    if shape == (*lse.shape, 1):
        return lse[..., None]
    extra = shape[-1] - lse.shape[-1]
    if extra < 0:
        return lse[..., : shape[-1]]
    return jnp.pad(lse, [(0, 0)] * (lse.ndim - 1) + [(0, extra)])


def _lse_from(lse, q, k, v, attn_mask, is_causal, scale):
    """The ``[..., L]`` logsumexp back from any of ``_lse_as``'s layouts, recomputed when the
    forward kept none (memory-efficient attention with ``compute_log_sumexp=False``)."""
    if lse.ndim == q.ndim:  # cuDNN's [..., L, 1]
        lse = lse[..., 0]
    if lse.shape[-1] < q.shape[-2]:
        return _attention(q, k, v, attn_mask, is_causal, scale)[1]
    return lse[..., : q.shape[-2]]


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _no_dropout(dropout_p, "flash attention")
    return _attention(q, k, v, attn_mask, is_causal, scale)


@register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_flash_cpu_backward(
    grad, q, k, v, out, lse, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    _no_dropout(dropout_p, "flash attention")
    return _attention_backward(grad, q, k, v, out, lse, attn_mask, is_causal, scale)[:3]


# CUDA's fused attention ops (what scaled_dot_product_attention picks on a GPU): the same math,
# with each op's own outputs around it
@register(aten._scaled_dot_product_flash_attention.default, meta=True)
def _sdpa_flash(
    q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None, meta
):
    _no_dropout(dropout_p, "flash attention")
    return _with_bookkeeping(_attention(q, k, v, None, is_causal, scale), meta)


@register(aten._scaled_dot_product_flash_attention_backward.default)
def _sdpa_flash_backward(
    grad, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None,
):  # fmt: skip
    _no_dropout(dropout_p, "flash attention")
    lse = _lse_from(lse, q, k, v, None, is_causal, scale)
    return _attention_backward(grad, q, k, v, out, lse, None, is_causal, scale)[:3]


@register(
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    meta=True,
)
def _sdpa_efficient_or_cudnn(
    q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
    return_debug_mask=False, *, scale=None, meta,
):  # fmt: skip
    _no_dropout(dropout_p, "memory-efficient / cuDNN attention")
    out, lse = _attention(q, k, v, attn_bias, is_causal, scale)
    lse = None if meta[1] is None else _lse_as(lse, meta[1])
    return _with_bookkeeping((out, lse), meta)


@register(aten._scaled_dot_product_efficient_attention_backward.default, meta=True)
def _sdpa_efficient_backward(
    grad, q, k, v, attn_bias, out, lse, philox_seed, philox_offset, dropout_p,
    grad_input_mask, is_causal=False, *, scale=None, meta,
):  # fmt: skip
    _no_dropout(dropout_p, "memory-efficient attention")
    lse = _lse_from(lse, q, k, v, attn_bias, is_causal, scale)
    dq, dk, dv, dscores = _attention_backward(grad, q, k, v, out, lse, attn_bias, is_causal, scale)
    wants_bias_grad = len(meta) > 3 and isinstance(meta[3], torch.Tensor)
    return dq, dk, dv, _sum_to(dscores, tuple(meta[3].shape)) if wants_bias_grad else None


def _sum_to(grad, shape: tuple):
    """The gradient of a tensor of ``shape`` broadcast to ``grad``'s shape: ``grad`` summed over
    the dims the broadcast added or expanded."""
    lead = grad.ndim - len(shape)
    expanded = tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + expanded).reshape(shape)


@register(aten._scaled_dot_product_cudnn_attention_backward.default)
def _sdpa_cudnn_backward(
    grad, q, k, v, out, lse, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k,
    max_q, max_k, dropout_p, is_causal, *, scale=None,
):  # fmt: skip
    _no_dropout(dropout_p, "cuDNN attention")
    lse = _lse_from(lse, q, k, v, attn_bias, is_causal, scale)
    return _attention_backward(grad, q, k, v, out, lse, attn_bias, is_causal, scale)[:3]

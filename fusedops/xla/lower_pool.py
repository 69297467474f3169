"""Lowerings of pooling (max, average and adaptive, 2-D and 3-D, with their backwards),
replication padding's backward and grid sampling.

Max pools return, as ATen does, the index of each maximum in its (flattened) input plane; their
backwards scatter the gradient to those indices. Average pools' backwards are ``jax.vjp`` of the
forward (exact: the forward is linear).
"""

from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from fusedops.xla.lower_table import register

aten = torch.ops.aten


# ------------------------------------------------------------------------------ windows, indices
def _window_views(x, kernel, stride, padding, dilation, ceil_mode, pad_value):
    """Every kernel offset's strided view of ``x`` (N, C, *spatial), padded with
    ``pad_value``: (the views, in row-major offset order, each (N, C, *out); the output sizes;
    the (low, high) padding per spatial dim). Kept apart, not stacked: a reduction over a list
    of views is one elementwise loop, where a stacked window axis is a strided copy first."""
    nd = len(kernel)
    spatial = x.shape[-nd:]
    out_sizes, pads = [], []
    for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        out = (size + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        out_sizes.append(out)
        pads.append((p, max((out - 1) * s + span - size - p, p)))
    cfg = [(0, 0, 0)] * (x.ndim - nd) + [(lo, hi, 0) for lo, hi in pads]
    xp = lax.pad(x, jnp.asarray(pad_value, x.dtype), cfg)
    views = []
    for offsets in np.ndindex(*kernel):
        starts = [o * d for o, d in zip(offsets, dilation)]
        view = xp
        for axis, (st, s, out) in enumerate(zip(starts, stride, out_sizes)):
            ax = x.ndim - nd + axis
            view = lax.slice_in_dim(view, st, st + (out - 1) * s + 1, s, axis=ax)
        views.append(view)
    return views, out_sizes, pads


def _pool_args(kernel, stride, padding, dilation, nd=2):
    kernel = list(kernel) * (nd // len(kernel))
    stride = list(stride or kernel) * (nd // len(stride or kernel))
    padding = list(padding) * (nd // len(padding))
    dilation = list(dilation) * (nd // len(dilation))
    return kernel, stride, padding, dilation


def _positions(spatial) -> jax.Array:
    """Each element's index in its flattened plane of shape ``spatial``."""
    return jnp.arange(math.prod(spatial), dtype=jnp.int64).reshape(tuple(spatial))


def _pick_max(windows, positions):
    """(max over the last axis, the position of its first maximum)."""
    arg = jnp.argmax(windows, axis=-1)
    index = jnp.take_along_axis(jnp.broadcast_to(positions, windows.shape), arg[..., None], -1)
    return jnp.max(windows, axis=-1), index[..., 0]


def _pick_max_of_views(views, positions):
    """``_pick_max`` of the views stacked on a last axis, without stacking them: (the
    elementwise max, the position of the first maximum), NaN counting as the largest (its first
    occurrence wins), as ``jnp.argmax``'s."""
    best, index = views[0], jnp.broadcast_to(positions[0], views[0].shape)
    for view, position in zip(views[1:], positions[1:]):
        take = (view > best) | (jnp.isnan(view) & ~jnp.isnan(best))
        best = jnp.where(take, view, best)
        index = jnp.where(take, position, index)
    return best, index


def _indices_backward(grad, x, indices, nd: int):
    """The gradient of a max pool: ``grad`` added at ``indices`` of each flattened plane."""
    planes = math.prod(x.shape[-nd:])
    flat_grad = grad.reshape(-1, math.prod(grad.shape[-nd:]))
    flat_idx = indices.reshape(flat_grad.shape)
    rows = jnp.arange(flat_grad.shape[0])[:, None]
    out = jnp.zeros((flat_grad.shape[0], planes), grad.dtype).at[rows, flat_idx].add(flat_grad)
    return out.reshape(x.shape)


# -------------------------------------------------------------------------------------- max pools
def _max_pool(x, kernel, stride, padding, dilation, ceil_mode, nd: int):
    kernel, stride, padding, dilation = _pool_args(kernel, stride, padding, dilation, nd)
    views, _, _ = _window_views(x, kernel, stride, padding, dilation, ceil_mode, -jnp.inf)
    positions, _, _ = _window_views(
        _positions(x.shape[-nd:]), kernel, stride, padding, dilation, ceil_mode, -1
    )
    return _pick_max_of_views(views, positions)


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, kernel, stride, padding, dilation, ceil_mode, 2)


@register(aten.max_pool3d_with_indices.default)
def _max_pool3d_with_indices(x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, kernel, stride, padding, dilation, ceil_mode, 3)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(
    grad, x, kernel, stride, padding, dilation, ceil_mode, indices
):
    return _indices_backward(grad, x, indices, 2)


@register(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_with_indices_backward(
    grad, x, kernel, stride, padding, dilation, ceil_mode, indices
):
    return _indices_backward(grad, x, indices, 3)


def _adaptive_bins(size: int, out: int):
    """(out, k) positions of each adaptive bin (``floor(i*size/out)`` to
    ``ceil((i+1)*size/out)``, k the widest bin) and which of them lie inside their bin."""
    starts = (np.arange(out) * size) // out
    ends = -((-(np.arange(out) + 1) * size) // out)
    width = int((ends - starts).max())
    index = starts[:, None] + np.arange(width)[None, :]
    inside = index < ends[:, None]
    return np.minimum(index, size - 1), inside


def _adaptive_max_pool(x, output_size):
    """(values, indices) of adaptive max pooling over x's last ``len(output_size)`` dims."""
    nd = len(output_size)
    spatial = x.shape[-nd:]
    base = x.ndim - nd
    values, positions = x, _positions(spatial)
    inside = np.ones((), bool)
    for axis, (size, out) in enumerate(zip(spatial, output_size)):
        index, ok = _adaptive_bins(size, out)
        flat = jnp.asarray(index.reshape(-1))
        values = jnp.take(values, flat, axis=base + 2 * axis)
        values = values.reshape(values.shape[: base + 2 * axis] + index.shape
                                + values.shape[base + 2 * axis + 1 :])  # fmt: skip
        positions = jnp.take(positions, flat, axis=2 * axis)
        positions = positions.reshape(positions.shape[: 2 * axis] + index.shape
                                      + positions.shape[2 * axis + 1 :])  # fmt: skip
        inside = inside[..., None, None] & ok.reshape((1,) * (2 * axis) + ok.shape)
    # (..., o1, k1, o2, k2, ...) -> (..., o1, o2, ..., k1 * k2 * ...)
    order = [2 * a for a in range(nd)] + [2 * a + 1 for a in range(nd)]
    values = jnp.transpose(values, list(range(base)) + [base + a for a in order])
    positions = jnp.transpose(positions, order)
    inside = np.transpose(inside, order)
    window = (-1,)
    values = values.reshape(values.shape[: base + nd] + window)
    positions = positions.reshape(positions.shape[:nd] + window)
    inside = inside.reshape(inside.shape[:nd] + window)
    values = jnp.where(jnp.asarray(inside), values, -jnp.inf)
    return _pick_max(values, positions)


@register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool_op(x, output_size):
    return _adaptive_max_pool(x, list(output_size))


@register(aten.adaptive_max_pool2d_backward.default)
def _adaptive_max_pool2d_backward(grad, x, indices):
    return _indices_backward(grad, x, indices, 2)


@register(aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_pool3d_backward(grad, x, indices):
    return _indices_backward(grad, x, indices, 3)


# ---------------------------------------------------------------------------------- average pools
def _avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    kernel, stride, padding, dilation = _pool_args(kernel, stride, padding, (1,), nd)
    views, _, pads = _window_views(x, kernel, stride, padding, dilation, ceil_mode, 0)
    total = functools.reduce(operator.add, views)
    if divisor_override:
        return total / divisor_override
    spatial = x.shape[-nd:]
    inside = np.ones(spatial, np.float32)
    if count_include_pad:  # padding counts, the extra ceil_mode overhang does not
        inside = np.pad(inside, [(p, p) for p in padding], constant_values=1)
        inside = np.pad(inside, [(0, hi - p) for (_, hi), p in zip(pads, padding)])
        counts, _, _ = _window_views(
            jnp.asarray(inside), kernel, stride, [0] * nd, dilation, False, 0
        )
    else:
        counts, _, _ = _window_views(
            jnp.asarray(inside), kernel, stride, padding, dilation, ceil_mode, 0
        )
    return total / functools.reduce(operator.add, counts).astype(x.dtype)


def _avg_pool_lowerings(nd: int):
    def forward(
        x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
        divisor_override=None,
    ):  # fmt: skip
        return _avg_pool(
            x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, nd
        )

    def backward(grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
        def pool(v):
            return forward(v, kernel, stride, padding, ceil_mode, count_include_pad,
                           divisor_override)  # fmt: skip

        return jax.vjp(pool, x)[1](grad)[0]

    return forward, backward


_avg_pool2d, _avg_pool2d_backward = _avg_pool_lowerings(2)
_avg_pool3d, _avg_pool3d_backward = _avg_pool_lowerings(3)
register(aten.avg_pool2d.default)(_avg_pool2d)
register(aten.avg_pool2d_backward.default)(_avg_pool2d_backward)
register(aten.avg_pool3d.default)(_avg_pool3d)
register(aten.avg_pool3d_backward.default)(_avg_pool3d_backward)


def _adaptive_avg_pool(x, output_size):
    nd = len(output_size)
    for axis, out in enumerate(output_size):
        ax = x.ndim - nd + axis
        size = x.shape[ax]
        pieces = []
        for i in range(out):
            start, end = (i * size) // out, -(-((i + 1) * size) // out)
            pieces.append(
                jnp.mean(lax.slice_in_dim(x, start, end, axis=ax), axis=ax, keepdims=True)
            )
        x = jnp.concatenate(pieces, axis=ax)
    return x


@register(
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten._adaptive_avg_pool3d.default,
)
def _adaptive_avg_pool_op(x, output_size):
    return _adaptive_avg_pool(x, list(output_size))


def _adaptive_avg_pool_backward(nd: int):
    def backward(grad, x):
        size = grad.shape[-nd:]
        return jax.vjp(lambda v: _adaptive_avg_pool(v, list(size)), x)[1](grad)[0]

    return backward


register(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_pool_backward(2))
register(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_pool_backward(3))


# ------------------------------------------------------------------------- replication padding
def _replication_pad(x, padding):
    """``F.pad(x, padding, mode="replicate")``: padding lists (left, right) pairs from the last
    dim backwards; negative amounts crop."""
    nd = len(padding) // 2
    grow = [(0, 0)] * (x.ndim - nd) + [
        (max(padding[2 * i], 0), max(padding[2 * i + 1], 0)) for i in reversed(range(nd))
    ]
    y = jnp.pad(x, grow, mode="edge")
    for i in range(nd):
        ax = x.ndim - 1 - i
        lo, hi = -min(padding[2 * i], 0), -min(padding[2 * i + 1], 0)
        if lo or hi:
            y = lax.slice_in_dim(y, lo, y.shape[ax] - hi, axis=ax)
    return y


@register(
    aten.replication_pad1d_backward.default,
    aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
)
def _replication_pad_backward(grad, x, padding):
    return jax.vjp(lambda v: _replication_pad(v, padding), x)[1](grad)[0]


# ---------------------------------------------------------------------------------- grid sampling
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size: int, align_corners: bool):
    """Grid coordinates in [-1, 1] -> pixel coordinates."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low: int, twice_high: int):
    """``coord`` reflected into [twice_low / 2, twice_high / 2]."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinates(coord, size: int, padding_mode: int, align_corners: bool):
    """Pixel coordinates moved inside the image by the padding mode (zeros: unchanged)."""
    if padding_mode == _ZEROS:
        return coord
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
    return jnp.clip(coord, 0, size - 1)


def _read(image, iy, ix):
    """image[n, :, iy, ix] for integer pixel positions (N, T, Ho, Wo) (T taps), 0 outside the
    image: (N, C, T, Ho, Wo), one gather for all taps."""
    h, w = image.shape[-2:]
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    iy, ix = jnp.clip(iy, 0, h - 1), jnp.clip(ix, 0, w - 1)
    values = jax.vmap(lambda im, yy, xx: im[:, yy, xx])(image, iy, ix)
    return jnp.where(inside[:, None], values, jnp.zeros((), image.dtype))


def _cubic_weights(t, a: float = -0.75):
    """The four cubic-convolution weights of taps -1, 0, 1, 2 at fraction t."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _taps(image, ys, xs, weights):
    """sum over taps of image at (ys[t], xs[t]) (float pixel positions, integral values) times
    weights[t] (each (N, Ho, Wo))."""
    iy = jnp.stack(ys, axis=1).astype(jnp.int64)
    ix = jnp.stack(xs, axis=1).astype(jnp.int64)
    values = _read(image, iy, ix)
    return jnp.sum(values * jnp.stack(weights, axis=1)[:, None], axis=2)


def _grid_sample(image, grid, interpolation_mode, padding_mode, align_corners):
    """``F.grid_sample`` on (N, C, H, W) with grid (N, Ho, Wo, 2): (N, C, Ho, Wo)."""
    h, w = image.shape[-2:]
    gx, gy = grid[..., 0], grid[..., 1]
    if interpolation_mode == _BICUBIC:
        ix, iy = _unnormalize(gx, w, align_corners), _unnormalize(gy, h, align_corners)
        x0, y0 = jnp.floor(ix), jnp.floor(iy)
        wx, wy = _cubic_weights(ix - x0), _cubic_weights(iy - y0)
        pad = lambda c, size: _pad_coordinates(c, size, padding_mode, align_corners)  # noqa: E731
        rows = [pad(y0 - 1 + j, h) for j in range(4)]
        cols = [pad(x0 - 1 + i, w) for i in range(4)]
        pairs = [(j, i) for j in range(4) for i in range(4)]
        return _taps(
            image, [rows[j] for j, _ in pairs], [cols[i] for _, i in pairs],
            [wy[j] * wx[i] for j, i in pairs],
        )  # fmt: skip
    ix = _pad_coordinates(_unnormalize(gx, w, align_corners), w, padding_mode, align_corners)
    iy = _pad_coordinates(_unnormalize(gy, h, align_corners), h, padding_mode, align_corners)
    if interpolation_mode == _NEAREST:
        return _taps(image, [jnp.round(iy)], [jnp.round(ix)], [jnp.ones_like(ix)])
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    x1, y1 = x0 + 1, y0 + 1
    return _taps(
        image, [y0, y0, y1, y1], [x0, x1, x0, x1],
        [(x1 - ix) * (y1 - iy), (ix - x0) * (y1 - iy), (x1 - ix) * (iy - y0),
         (ix - x0) * (iy - y0)],
    )  # fmt: skip


@register(aten.grid_sampler_2d.default)
def _grid_sampler_2d(image, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(image, grid, interpolation_mode, padding_mode, align_corners)


@register(aten.grid_sampler_2d_backward.default)
def _grid_sampler_2d_backward(
    grad, image, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    def forward(im, g):
        return _grid_sample(im, g, interpolation_mode, padding_mode, align_corners)

    d_image, d_grid = jax.vjp(forward, image, grid)[1](grad)
    return (
        d_image if output_mask[0] else jnp.zeros_like(image),
        d_grid if output_mask[1] else jnp.zeros_like(grid),
    )

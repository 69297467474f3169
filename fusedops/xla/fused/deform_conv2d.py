"""deform_conv2d in XLA with fusedops' semantics (ops/deform_conv2d.py): gather-based im2col
(bilinear corners with torchvision's rules), the weight product at full precision, math in fp32
for 16-bit inputs; the backward is ``jax.vjp`` of the forward (exact: the same expression)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.lower_table import register, upcast

fusedops = torch.ops.fusedops


def _forward(input, offset, mask, weight, bias, stride, padding, dilation):
    b, cin, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    _, g2k, h_out, w_out = offset.shape
    k, groups, wg = kh * kw, g2k // (2 * kh * kw), cin // cin_g
    c = input.dtype
    off = offset.reshape(b, groups, k, 2, h_out, w_out)
    ki, kj = jnp.arange(kh).repeat(kw), jnp.tile(jnp.arange(kw), kh)
    base_y = ki[:, None, None] * dilation[0] + (jnp.arange(h_out) * stride[0] - padding[0])[:, None]
    base_x = kj[:, None, None] * dilation[1] + (jnp.arange(w_out) * stride[1] - padding[1])[None]
    y = (base_y.astype(c) + off[:, :, :, 0]).reshape(b, groups, k * h_out * w_out)
    x = (base_x.astype(c) + off[:, :, :, 1]).reshape(b, groups, k * h_out * w_out)
    inside = (y > -1) & (y < h) & (x > -1) & (x < w)
    y0, x0 = jnp.floor(y), jnp.floor(x)
    ly, lx = y - y0, x - x0
    flat = input.reshape(b, groups, cin // groups, h * w)
    cols = 0
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0.astype(jnp.int32) + dy, x0.astype(jnp.int32) + dx
            ok = inside & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            index = jnp.clip(yy, 0, h - 1) * w + jnp.clip(xx, 0, w - 1)
            values = jnp.take_along_axis(flat, index[:, :, None, :], axis=3)
            cols = cols + values * jnp.where(ok, wy * wx, 0)[:, :, None, :]
    if mask is not None:
        cols = cols * mask.reshape(b, groups, 1, k * h_out * w_out)
    cols = cols.reshape(b, wg, cin_g * k, h_out * w_out)
    wmat = weight.reshape(wg, cout // wg, cin_g * k)
    out = jnp.einsum("gok,bgkl->bgol", wmat, cols, precision=lax.Precision.HIGHEST)
    out = out.reshape(b, cout, h_out, w_out)
    return out if bias is None else out + bias[:, None, None]


def _compute(*tensors):
    """The arguments in fusedops' compute dtype (fp32 for 16-bit, as is otherwise)."""
    return [None if t is None else upcast(t) for t in tensors]


@register(fusedops.deform_conv2d.default)
def deform_conv2d(
    input, offset, mask, weight, bias, stride, padding, dilation, deterministic, backend=None
):
    out = _forward(*_compute(input, offset, mask, weight, bias), stride, padding, dilation)
    return out.astype(input.dtype)


@register(fusedops.deform_conv2d_backward.default)
def deform_conv2d_backward(
    grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic, backend=None
):
    originals = (input, offset, mask, weight, bias)
    present = [i for i, t in enumerate(originals) if t is not None]
    args = _compute(*originals)

    def run(*leaves):
        full = list(args)
        for i, t in zip(present, leaves):
            full[i] = t
        return _forward(*full, stride, padding, dilation)

    out, vjp = jax.vjp(run, *[args[i] for i in present])
    found = dict(zip(present, vjp(grad.astype(out.dtype))))
    empty = jnp.zeros((0,), dtype=input.dtype)
    return tuple(found[i].astype(originals[i].dtype) if i in found else empty for i in range(5))


def samples(name):
    """Arguments of ``fusedops::deform_conv2d`` for the lowering test: DCNv2 with bias and two
    offset groups, DCNv1 with weight groups and stride 2, bf16."""
    from fusedops.testing import random_tensor as r

    return [
        (r((2, 4, 5, 6)), r((2, 36, 5, 6)), r((2, 18, 5, 6), low=0.0, high=1.0),
         r((3, 4, 3, 3)), r((3,)), [1, 1], [1, 1], [1, 1], False),
        (r((1, 4, 6, 5)), r((1, 8, 4, 2)), None, r((4, 2, 2, 2)), None,
         [2, 2], [1, 0], [1, 2], False),
        (r((1, 2, 4, 4), torch.bfloat16), r((1, 8, 3, 3), torch.bfloat16),
         r((1, 4, 3, 3), torch.bfloat16, low=0.0, high=1.0), r((2, 2, 2, 2), torch.bfloat16),
         r((2,), torch.bfloat16), [1, 1], [0, 0], [1, 1], True),
    ]  # fmt: skip

"""LayerNorm / RMSNorm in XLA: the ``fusedops::layer_norm``, ``rms_norm`` ops and their backwards.

Same math and dtypes as ``fusedops.ops.layer_norm``'s reference: x is rows ``(M, N)``; the
statistics (mean, rstd) are computed and returned in fp32 (fp64 for fp64 x); y has x's dtype,
dweight/dbias the dtypes of weight/bias. A backward op returns an empty ``(0,)`` tensor for the
gradient of an absent weight or bias, as the custom ops do.

``_forward`` / ``_backward`` hold the math once for both norms (``rms`` selects RMSNorm); the
registered functions only map each op's arguments onto them, so a variant that adds arguments
to an op adds them to its registered function.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.lower_table import compute_dtype, jax_dtype, register

fusedops = torch.ops.fusedops


def _rounded(xhat, xhat_dtype):
    """xhat rounded to the torch dtype ``xhat_dtype`` (None: as it is), in its own dtype."""
    return xhat if xhat_dtype is None else xhat.astype(jax_dtype(xhat_dtype)).astype(xhat.dtype)


def _forward(x, weight, bias, eps, rms: bool, out_dtype=None, xhat_dtype=None):
    """(y in x's dtype or the torch dtype ``out_dtype``, mean or None, rstd) of rows x,
    statistics in the compute dtype; ``xhat_dtype``: xhat rounded to it before the weight."""
    c = x.astype(compute_dtype(x.dtype))
    if rms:
        mean = None
        rstd = lax.rsqrt(jnp.mean(c * c, axis=1) + eps)
        xhat = c * rstd[:, None]
    else:
        mean = jnp.mean(c, axis=1)
        centered = c - mean[:, None]
        rstd = lax.rsqrt(jnp.mean(centered * centered, axis=1) + eps)
        xhat = centered * rstd[:, None]
    y = _rounded(xhat, xhat_dtype)
    if weight is not None:
        y = y * weight.astype(c.dtype)
    if bias is not None:
        y = y + bias.astype(c.dtype)
    return y.astype(x.dtype if out_dtype is None else jax_dtype(out_dtype)), mean, rstd


def _grad_or_empty(grad, like, dy):
    """``grad`` in ``like``'s dtype, or an empty ``(0,)`` array of dy's dtype when ``like`` (the
    parameter) is absent (the op's: define_op's empty tensor is like the incoming gradient)."""
    return jnp.zeros((0,), dy.dtype) if like is None else grad.astype(like.dtype)


def _backward(dy, x, weight, bias, mean, rstd, rms: bool, xhat_dtype=None):
    """(dx, dweight, dbias) of rows x; an absent parameter's gradient is an empty array."""
    c = x.astype(compute_dtype(x.dtype))
    g0 = dy.astype(c.dtype)
    rstd = rstd.astype(c.dtype)[:, None]
    xhat = c * rstd if rms else (c - mean.astype(c.dtype)[:, None]) * rstd
    g = g0 * weight.astype(c.dtype) if weight is not None else g0
    inner = xhat * jnp.mean(g * xhat, axis=1, keepdims=True)
    if not rms:
        inner = inner + jnp.mean(g, axis=1, keepdims=True)
    dx = ((g - inner) * rstd).astype(x.dtype)
    dweight = None if weight is None else jnp.sum(g0 * _rounded(xhat, xhat_dtype), axis=0)
    dweight = _grad_or_empty(dweight, weight, dy)
    dbias = _grad_or_empty(jnp.sum(g0, axis=0) if bias is not None else None, bias, dy)
    return dx, dweight, dbias


@register(fusedops.layer_norm.default)
def layer_norm(x, weight, bias, eps, backend=None):
    return _forward(x, weight, bias, eps, rms=False)


@register(fusedops.layer_norm_backward.default)
def layer_norm_backward(dy, x, weight, bias, mean, rstd, backend=None):
    return _backward(dy, x, weight, bias, mean, rstd, rms=False)


@register(fusedops.rms_norm.default)
def rms_norm(x, weight, eps, backend=None, out_dtype=None, xhat_dtype=None):
    y, _, rstd = _forward(x, weight, None, eps, True, out_dtype, xhat_dtype)
    return y, rstd


@register(fusedops.rms_norm_backward.default)
def rms_norm_backward(dy, x, weight, rstd, backend=None, xhat_dtype=None):
    dx, dweight, _ = _backward(dy, x, weight, None, None, rstd, True, xhat_dtype)
    return dx, dweight

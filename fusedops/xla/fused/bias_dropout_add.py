"""Bias-dropout-add in XLA: the same Philox words as every other backend
(``kernels/shared/philox.py`` in jax int64 arithmetic), so a seed gives the same mask in an XLA
program as in eager torch with ``portable_mask=True`` (the op's ``portable`` argument is not
read here: XLA has only the Philox mask).

The seed is the op's ``int64[2]`` input (x64 is on inside fusedops' XLA programs); in a traced
region it comes from ``torch.randint``, lowered with the region's random key.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from fusedops.kernels.shared import philox
from fusedops.xla.lower_table import compute_dtype, jax_dtype, register

fusedops = torch.ops.fusedops


def _dropout(v, seed, p: float):
    mode = philox.dropout_mode(p, seed is not None)
    if mode == philox.KEEP:
        return v
    if mode == philox.DROP:
        return jnp.zeros_like(v)
    n = math.prod(v.shape)
    counters = jnp.arange(-(-n // 4), dtype=jnp.int64)
    words = philox.dropout_words(seed.astype(jnp.int64), counters, n, jnp.stack)
    keep = (words >= philox.keep_threshold(p)).reshape(v.shape)
    return jnp.where(keep, v * philox.dropout_scale(p), jnp.zeros((), v.dtype))


@register(fusedops.bias_dropout_add.default)
def bias_dropout_add(x, bias, residual, seed, p, backend=None, portable=True):
    dtypes = [x.dtype, residual.dtype] + ([] if bias is None else [bias.dtype])
    compute = compute_dtype(*dtypes)
    v = x.astype(compute)
    if bias is not None:
        v = v + bias.astype(compute)
    return (residual.astype(compute) + _dropout(v, seed, p)).astype(residual.dtype)


@register(fusedops.bias_dropout_add_backward.default)
def bias_dropout_add_backward(grad, seed, p, x_dtype, bias_dtype, backend=None, portable=True):
    x_type = jax_dtype(x_dtype)
    bias_type = None if bias_dtype is None else jax_dtype(bias_dtype)
    compute = compute_dtype(grad.dtype, x_type, bias_type)
    g = _dropout(grad.astype(compute), seed, p)
    if bias_type is None:
        return g.astype(x_type), jnp.zeros((0,), grad.dtype)
    leading = tuple(range(grad.ndim - 1))
    return g.astype(x_type), g.sum(axis=leading).reshape(-1).astype(bias_type)


def samples(name):
    """Arguments of ``fusedops::bias_dropout_add`` for the lowering test: random masks (seeded),
    an fp32 residual stream under bf16 x, no bias, p = 0 and p = 1 (no seed)."""
    from fusedops.testing import random_tensor as r

    def seed():
        return torch.randint(0, 2**62, (2,), dtype=torch.int64)

    return [
        (r((6, 16)), r((16,)), r((6, 16)), seed(), 0.3),
        (r((5, 24), torch.bfloat16), r((24,), torch.bfloat16), r((5, 24)), seed(), 0.5),
        (r((3, 7)), None, r((3, 7)), seed(), 0.1),
        (r((4, 8)), r((8,)), r((4, 8)), None, 0.0),
        (r((4, 8)), r((8,)), r((4, 8)), None, 1.0),
    ]

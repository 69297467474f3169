"""Window attention in XLA, forward and backward, with fusedops' semantics (ops/window_attention):
scores and statistics in fp32 for 16-bit inputs, window z reading ``mask[z % nW]``, a fully
masked row giving zeros with logsumexp +inf (NaN for a row holding NaN or +inf, ``_swin.py``),
d_bias summed over windows."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.fused._swin import add_window_mask, shifted_exp
from fusedops.xla.lower_table import register, upcast

fusedops = torch.ops.fusedops


def _product(spec, a, b):
    """einsum at full precision (no TF32 on a GPU), as the kernels compute."""
    return jnp.einsum(spec, a, b, precision=lax.Precision.HIGHEST)


def _scores(q, k, bias, mask, scale):
    c = upcast(q)
    s = _product("zhnd,zhmd->zhnm", c, k.astype(c.dtype)) * scale
    if bias is not None:
        s = s + bias.astype(c.dtype)
    if mask is not None:
        s = add_window_mask(s, mask)
    return s


@register(fusedops.window_attention.default)
def window_attention(q, k, v, bias, mask, scale, backend=None):
    s = _scores(q, k, bias, mask, scale)
    p, shift, masked = shifted_exp(s)
    total = jnp.where(masked, 1.0, jnp.sum(p, axis=-1, keepdims=True))
    out = jnp.where(masked, 0.0, _product("zhnm,zhmd->zhnd", p, v.astype(s.dtype)) / total)
    lse = jnp.where(masked, jnp.inf, shift + jnp.log(total))
    return out.astype(q.dtype), lse[..., 0]


@register(fusedops.window_attention_backward.default)
def window_attention_backward(dout, q, k, v, bias, mask, lse, scale, bias_grad, backend=None):
    s = _scores(q, k, bias, mask, scale)
    p = jnp.exp(s - lse.astype(s.dtype)[..., None])
    do = dout.astype(s.dtype)
    dv = _product("zhnm,zhnd->zhmd", p, do)
    dp = _product("zhnd,zhmd->zhnm", do, v.astype(s.dtype))
    ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True))
    dq = _product("zhnm,zhmd->zhnd", ds, k.astype(s.dtype)) * scale
    dk = _product("zhnm,zhnd->zhmd", ds, q.astype(s.dtype)) * scale
    if bias_grad and bias is not None:
        dbias = jnp.sum(ds, axis=0).astype(bias.dtype)
    else:
        dbias = jnp.zeros((0,), dtype=q.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dbias


def samples(name):
    """Arguments of ``fusedops::window_attention`` for the lowering test: 2 images of 2 windows
    with bias and a -100 shift mask, no bias nor mask at N = 7, bf16 at d = 32."""
    from fusedops.testing import random_tensor as r

    mask = torch.where(torch.rand(2, 16, 16) < 0.3, -100.0, 0.0)
    qkv = [r((4, 2, 16, 16)) for _ in range(3)]
    bf16 = [r((2, 2, 9, 32), torch.bfloat16) for _ in range(3)]
    return [
        (*qkv, r((2, 16, 16)), mask, 0.25),
        (*[r((3, 1, 7, 16)) for _ in range(3)], None, None, 0.25),
        (*bf16, r((2, 9, 9)), None, 32**-0.5),
    ]

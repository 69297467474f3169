"""Swin attention softmax in XLA: ``softmax(attn + bias + mask)`` with fully -inf rows giving
zeros (NaN for rows holding NaN or +inf, ``_swin.py``), in fp32 for 16-bit inputs; the backward
gives d_attn and the bias gradient summed over windows."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from fusedops.xla.fused._swin import add_window_mask, masked_softmax
from fusedops.xla.lower_table import register, upcast

fusedops = torch.ops.fusedops


@register(fusedops.swin_attention_softmax.default)
def swin_attention_softmax(attn, bias, mask=None, backend=None):
    z = upcast(attn) + bias[None]
    if mask is not None:
        z = add_window_mask(z, mask)
    return masked_softmax(z).astype(attn.dtype)


@register(fusedops.swin_attention_softmax_backward.default)
def swin_attention_softmax_backward(grad, probs, backend=None):
    p = upcast(probs)
    g = grad.astype(p.dtype)
    dz = p * (g - jnp.sum(p * g, axis=-1, keepdims=True))
    return dz.astype(probs.dtype), jnp.sum(dz, axis=0)


def samples(name):
    """Arguments of ``fusedops::swin_attention_softmax`` for the lowering test: 2 images of 2
    windows, Swin's -100 shift mask, no mask, bf16 attn with an fp32 bias."""
    from fusedops.testing import random_tensor as r

    mask = torch.where(torch.rand(2, 9, 9) < 0.3, -100.0, 0.0)
    return [
        (r((4, 3, 9, 9)), r((3, 9, 9)), mask, None),
        (r((2, 2, 16, 16)), r((2, 16, 16)), None, None),
        (r((4, 2, 7, 7), torch.bfloat16), r((2, 7, 7)), None, None),
    ]

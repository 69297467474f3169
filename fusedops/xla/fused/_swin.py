"""``fusedops/ops/_swin.py`` in jax.numpy, for the lowerings of the Swin attention ops: window
``z``'s mask ``mask[z % nW]`` and the softmax whose fully masked rows (max -inf) give zeros,
NaN where a row holds NaN or +inf (as torch.softmax)."""

from __future__ import annotations

import jax.numpy as jnp


def add_window_mask(scores, mask):
    """``scores`` (Z, H, N, N) with ``mask[z % nW]`` (nW, N, N) added to window z."""
    windows = mask.shape[0]
    by_image = scores.reshape(scores.shape[0] // windows, windows, *scores.shape[1:])
    return (by_image + mask.astype(scores.dtype)[None, :, None]).reshape(scores.shape)


def shifted_exp(scores):
    """``(e, shift, masked)`` over the last axis, as ``ops._swin.shifted_exp``."""
    top = jnp.max(scores, axis=-1, keepdims=True)
    masked = top == -jnp.inf
    shift = jnp.where(masked, 0.0, top)
    return jnp.exp(scores - shift), shift, masked


def masked_softmax(scores):
    """softmax over the last axis, fully masked rows giving 0."""
    e, _, masked = shifted_exp(scores)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.where(masked, 0.0, e / jnp.where(masked, 1.0, total))

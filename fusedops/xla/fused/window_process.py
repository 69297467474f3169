"""Swin window gathers in XLA: roll + window partition and window reverse + roll as jax.numpy
reshapes and transposes; each backward is the other gather with the shift negated."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from fusedops.xla.lower_table import register

fusedops = torch.ops.fusedops


def _partition(x, window_h, window_w, shift_h, shift_w):
    batch, height, width, channels = x.shape
    if shift_h % height or shift_w % width:
        x = jnp.roll(x, (shift_h, shift_w), axis=(1, 2))
    rows, cols = height // window_h, width // window_w
    grid = x.reshape(batch, rows, window_h, cols, window_w, channels)
    return grid.transpose(0, 1, 3, 2, 4, 5).reshape(
        batch * rows * cols, window_h, window_w, channels
    )


def _reverse(windows, window_h, window_w, height, width, shift_h, shift_w):
    # sizes spelled out: a reshape to (-1, ...) of no elements (C = 0) is ambiguous
    rows, cols, channels = height // window_h, width // window_w, windows.shape[-1]
    batch = windows.shape[0] // (rows * cols)
    grid = windows.reshape(batch, rows, cols, window_h, window_w, channels)
    x = grid.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height, width, channels)
    if shift_h % height or shift_w % width:
        x = jnp.roll(x, (shift_h, shift_w), axis=(1, 2))
    return x


@register(fusedops.window_partition_roll.default)
def window_partition_roll(x, window_h, window_w, shift_h, shift_w, backend=None):
    return _partition(x, window_h, window_w, shift_h, shift_w)


@register(fusedops.window_partition_roll_backward.default)
def window_partition_roll_backward(
    grad, window_h, window_w, height, width, shift_h, shift_w, backend=None
):
    return _reverse(grad, window_h, window_w, height, width, -shift_h, -shift_w)


@register(fusedops.window_reverse_roll.default)
def window_reverse_roll(windows, window_h, window_w, height, width, shift_h, shift_w, backend=None):
    return _reverse(windows, window_h, window_w, height, width, shift_h, shift_w)


@register(fusedops.window_reverse_roll_backward.default)
def window_reverse_roll_backward(grad, window_h, window_w, shift_h, shift_w, backend=None):
    return _partition(grad, window_h, window_w, -shift_h, -shift_w)


def samples(name):
    """Arguments of ``fusedops::window_partition_roll`` / ``window_reverse_roll`` for the
    lowering test: H != W, non-square windows, shifts 0 and not, bf16."""
    from fusedops.testing import random_tensor as r

    if name == "window_partition_roll":
        return [
            (r((2, 8, 12, 3)), 4, 4, 2, 5, None),
            (r((1, 6, 6, 5), torch.bfloat16), 3, 2, 0, 0, None),
        ]
    return [  # windows of (2, 8, 12, 3) in 4x4 windows: 2 * 2 * 3; (1, 6, 6) in 3x2: 6
        (r((12, 4, 4, 3)), 4, 4, 8, 12, 6, 1, None),
        (r((6, 3, 2, 5), torch.bfloat16), 3, 2, 6, 6, 0, 0, None),
    ]

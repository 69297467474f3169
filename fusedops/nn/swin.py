"""Swin building blocks: the seed runtime's ``WindowProcess``, ``WindowProcessReverse`` and
``FusedSwinFmha`` (classes with ``.apply`` as the original Swin CUDA extension's autograd
Functions), and ``window_attention_core``, the score / softmax / value part of Swin's window
attention that the fused model classes (``fusedops.integrations.transformers.swin``,
``fusedops.integrations.timm.swin``) call.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from fusedops.nn import _fused_class
from fusedops.ops import window_attention as _flash
from fusedops.ops.swin_softmax import swin_attention_softmax
from fusedops.ops.window_process import window_partition_roll, window_reverse_roll


def _check_dims(t: torch.Tensor, name: str, expected: tuple, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, but {what} give {tuple(expected)}")


class WindowProcess:
    """Cyclic shift + window partition in one gather (seed runtime name).

    ``WindowProcess.apply(x, B, H, W, C, shift_size, window_size)``: x (B, H, W, C) ->
    (B * H/ws * W/ws, ws, ws, C), equal to ``window_partition(torch.roll(x, (shift_size,
    shift_size), dims=(1, 2)), ws)``. Swin call sites pass ``-shift_size``. Differentiable.
    """

    @staticmethod
    def apply(x, B, H, W, C, shift_size, window_size):  # noqa: N803 - the seed runtime's names
        _check_dims(x, "x", (B, H, W, C), "B, H, W, C")
        return window_partition_roll(x, window_size, shift_size)


class WindowProcessReverse:
    """Window reverse + cyclic shift in one gather (seed runtime name).

    ``WindowProcessReverse.apply(windows, B, H, W, C, shift_size, window_size)``: windows
    (B * H/ws * W/ws, ws, ws, C) -> (B, H, W, C), equal to ``torch.roll(window_reverse(windows,
    ws, H, W), (shift_size, shift_size), dims=(1, 2))``. Swin call sites pass ``+shift_size``.
    """

    @staticmethod
    def apply(windows, B, H, W, C, shift_size, window_size):  # noqa: N803
        if not isinstance(windows, torch.Tensor):
            raise TypeError(f"windows must be a torch.Tensor, got {type(windows).__name__}")
        if windows.dim() != 4 or windows.shape[-1] != C:
            raise ValueError(
                f"windows has shape {tuple(windows.shape)}; expected (B*nW, ws, ws, C={C})"
            )
        out = window_reverse_roll(windows, window_size, H, W, shift_size)
        if out.shape[0] != B:
            raise ValueError(f"windows hold {out.shape[0]} images of {H}x{W}, but B={B}")
        return out


class FusedSwinFmha:
    """Swin's attention softmax with bias and shift mask fused (seed runtime name).

    ``FusedSwinFmha.apply(attn, relative_pos_bias, attn_mask, batch_size, window_num, num_head,
    window_len)``: ``softmax(attn + relative_pos_bias[None] + attn_mask[w][:, None])`` for attn
    (batch_size*window_num, num_head, window_len, window_len), relative_pos_bias (num_head, N, N),
    attn_mask (window_num, N, N) or None. Differentiable in attn and relative_pos_bias.
    """

    @staticmethod
    def apply(attn, relative_pos_bias, attn_mask, batch_size, window_num, num_head, window_len):
        n = window_len
        _check_dims(attn, "attn", (batch_size * window_num, num_head, n, n),
                    "batch_size*window_num, num_head, window_len")  # fmt: skip
        if attn_mask is not None:
            _check_dims(attn_mask, "attn_mask", (window_num, n, n), "window_num, window_len")
        return swin_attention_softmax(attn, relative_pos_bias, attn_mask)


def window_attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(q @ k^T * scale + bias + mask) @ v`` for Swin's windows.

    q, k, v: (B*nW, heads, N, d); bias: (heads, N, N); mask: (nW, N, N) or None, window b using
    ``mask[b % nW]``. Dropout with ``dropout_p`` on the probabilities when ``training``.
    Returns (out (B*nW, heads, N, d), the probabilities after dropout (B*nW, heads, N, N), as
    Swin's attention modules return them, or None).

    Without ``need_weights`` (and no attention dropout), one flash-style kernel per direction
    (``fusedops.window_attention``: the scores never reach memory, weights None) where it takes
    the sizes (N <= 256, d in 16/32/64/128); otherwise the products around the fused softmax.
    """
    n, d = q.shape[-2:]
    dropout = training and dropout_p > 0
    if not (need_weights or dropout) and 1 <= n <= _flash.MAX_TOKENS and d in _flash.HEAD_DIMS:
        return _flash.window_attention(q, k, v, bias, mask, scale), None
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    probs = swin_attention_softmax(scores, bias, mask)
    dropped = F.dropout(probs, dropout_p, training) if dropout else probs
    return torch.matmul(dropped, v), dropped


# ------------------------------------------------------------------------------------------
# Fused subclasses of model libraries' Swin classes (used by the swin hook).


def fused_subclass(original: type, recognise) -> type | str:
    """A subclass of ``original`` with the attributes ``recognise(original)`` returns (a dict,
    e.g. ``{"forward": ...}``), ``original`` itself if it is already fused, or the reason (a
    str) why it has no fused version. Same name, constructor and state_dict;
    ``isinstance(m, original)`` holds; ``_fusedops_original`` is the class it replaces."""
    if original.__dict__.get("_fusedops_fused", False):
        return original
    attributes = recognise(original)
    if isinstance(attributes, str):
        return attributes
    return _fused_class.fused_subclass(original, attributes, "fusedops' Swin window ops")

"""Swin building blocks: the seed runtime's ``WindowProcess``, ``WindowProcessReverse`` and
``FusedSwinFmha`` (classes with ``.apply`` as the original Swin CUDA extension's autograd
Functions), and ``fused_subclass``, which the fused model classes
(``fusedops.integrations.transformers.swin``, ``fusedops.integrations.timm.swin``) are built
with. Their attention calls ``fusedops.ops.window_attention``'s ``attention_core``.
"""

from __future__ import annotations

import torch

from fusedops.nn import _fused_class
from fusedops.ops.swin_softmax import swin_attention_softmax
from fusedops.ops.window_process import window_partition_roll, window_reverse_roll

__all__ = ["FusedSwinFmha", "WindowProcess", "WindowProcessReverse"]


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

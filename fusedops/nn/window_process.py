"""The seed runtime's ``WindowProcess`` and ``WindowProcessReverse``: Swin's cyclic shift and
window partition (and its inverse) in one gather each, classes with ``.apply`` as the original
Swin CUDA extension's autograd Functions (``from torchacc.runtime.nn.window_process import
WindowProcess`` ports as ``from fusedops.nn.window_process import WindowProcess``).
"""

from __future__ import annotations

import torch

from fusedops.nn._shapes import check_dims
from fusedops.ops.window_process import window_partition_roll, window_reverse_roll

__all__ = ["WindowProcess", "WindowProcessReverse"]


class WindowProcess:
    """Cyclic shift + window partition in one gather (seed runtime name).

    ``WindowProcess.apply(x, B, H, W, C, shift_size, window_size)``: x (B, H, W, C) ->
    (B * H/ws * W/ws, ws, ws, C), equal to ``window_partition(torch.roll(x, (shift_size,
    shift_size), dims=(1, 2)), ws)``. Swin call sites pass ``-shift_size``. Differentiable.
    """

    @staticmethod
    def apply(x, B, H, W, C, shift_size, window_size):  # noqa: N803 - the seed runtime's names
        check_dims(x, "x", (B, H, W, C), "B, H, W, C")
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

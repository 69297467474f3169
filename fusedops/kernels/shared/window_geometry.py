"""Window geometry of the Swin window ops: the shapes windows and maps take, shared by the
window ops' fakes, references and kernels."""

from __future__ import annotations

import torch


def partition_shape(x: torch.Tensor, wh: int, ww: int) -> tuple[int, int, int, int]:
    """The windows' shape (B*nW, wh, ww, C) for a (B, H, W, C) map x."""
    batch, height, width, channels = x.shape
    return (batch * (height // wh) * (width // ww), wh, ww, channels)


def reverse_shape(windows: torch.Tensor, wh: int, ww: int, height: int, width: int):
    """The map's shape (B, H, W, C) for (B*nW, wh, ww, C) windows."""
    return (windows.shape[0] // ((height // wh) * (width // ww)), height, width, windows.shape[-1])

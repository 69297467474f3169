"""Swin window gathers on the CUDA extension: allocates outputs, calls window_process.cu."""

from __future__ import annotations

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library
from fusedops.kernels.shared.window_geometry import partition_shape, reverse_shape


def partition(x: torch.Tensor, wh: int, ww: int, sh: int, sw: int) -> torch.Tensor:
    """roll(x, (sh, sw)) cut into (B*nW, wh, ww, C) windows; x contiguous (B, H, W, C),
    0 <= sh < H, 0 <= sw < W."""
    height, width = x.shape[1], x.shape[2]
    out = _alloc.empty(partition_shape(x, wh, ww), dtype=x.dtype, device=x.device)
    library().window_gather(x, out, height, width, wh, ww, sh, sw, False)
    return out


def reverse(windows: torch.Tensor, wh: int, ww: int, height: int, width: int, sh: int, sw: int):
    """Windows (B*nW, wh, ww, C), contiguous, glued into (B, H, W, C) then rolled by (sh, sw);
    0 <= sh < H, 0 <= sw < W."""
    shape = reverse_shape(windows, wh, ww, height, width)
    out = _alloc.empty(shape, dtype=windows.dtype, device=windows.device)
    library().window_gather(windows, out, height, width, wh, ww, sh, sw, True)
    return out

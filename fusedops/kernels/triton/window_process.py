"""Swin window gathers in Triton: cyclic shift + window partition / window reverse + shift.

One kernel for both directions: each program copies a tile of BLOCK_R output pixels x BLOCK_C
channels from the source pixel each output pixel comes from (rows of C contiguous elements, so
every access is coalesced along C). Pixel indices are 64-bit; the batch is folded into the row
index, so there is no grid-dimension cap on it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.ops.window_process import partition_shape, reverse_shape

TILE = 4096  # elements per program


@triton.jit
def _window_gather_kernel(
    src_ptr,
    dst_ptr,
    rows,
    channels,
    height,
    width,
    window_h,
    window_w,
    shift_h,
    shift_w,
    REVERSE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    windows_h = height // window_h
    windows_w = width // window_w
    if REVERSE:  # dst is the (B, H, W) map, src the windows; shift after the reverse
        w = row % width
        t = row // width
        h = t % height
        image = t // height
        h = (h + height - shift_h) % height
        w = (w + width - shift_w) % width
        window = (image * windows_h + h // window_h) * windows_w + w // window_w
        src_row = (window * window_h + h % window_h) * window_w + w % window_w
    else:  # dst is the windows, src the (B, H, W) map; shift before the partition
        j = row % window_w
        t = row // window_w
        i = t % window_h
        t = t // window_h
        wj = t % windows_w
        t = t // windows_w
        wi = t % windows_h
        image = t // windows_h
        h = (wi * window_h + i + height - shift_h) % height
        w = (wj * window_w + j + width - shift_w) % width
        src_row = (image * height + h) * width + w
    mask = (row < rows)[:, None] & (col < channels)[None, :]
    values = tl.load(src_ptr + src_row[:, None] * channels + col[None, :], mask=mask)
    tl.store(dst_ptr + row[:, None] * channels + col[None, :], values, mask=mask)


def _gather(src, dst, height, width, wh, ww, sh, sw, reverse: bool) -> torch.Tensor:
    channels = dst.shape[-1]
    rows = dst.numel() // channels if channels else 0
    if rows == 0:
        return dst
    block_c = min(triton.next_power_of_2(channels), 256)
    block_r = max(1, TILE // block_c)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(channels, block_c))
    _window_gather_kernel[grid](
        src, dst, rows, channels, height, width, wh, ww, sh, sw,
        REVERSE=reverse, BLOCK_R=block_r, BLOCK_C=block_c,
    )  # fmt: skip
    return dst


def partition(x: torch.Tensor, wh: int, ww: int, sh: int, sw: int) -> torch.Tensor:
    """roll(x, (sh, sw)) cut into (B*nW, wh, ww, C) windows; x contiguous (B, H, W, C),
    0 <= sh < H, 0 <= sw < W."""
    height, width = x.shape[1], x.shape[2]
    out = _alloc.empty(partition_shape(x, wh, ww), dtype=x.dtype, device=x.device)
    return _gather(x, out, height, width, wh, ww, sh, sw, reverse=False)


def reverse(windows: torch.Tensor, wh: int, ww: int, height: int, width: int, sh: int, sw: int):
    """Windows (B*nW, wh, ww, C), contiguous, glued into (B, H, W, C) then rolled by (sh, sw);
    0 <= sh < H, 0 <= sw < W."""
    shape = reverse_shape(windows, wh, ww, height, width)
    out = _alloc.empty(shape, dtype=windows.dtype, device=windows.device)
    return _gather(windows, out, height, width, wh, ww, sh, sw, reverse=True)

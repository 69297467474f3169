"""Swin window gathers in Triton: cyclic shift + window partition / window reverse + shift.

One kernel for both directions: program (w, c) moves channel block c of window w, a tile of
(window pixels x BLOCK_C channels). The window's pixels are a contiguous block of rows in the
windows tensor; pixel (i, j) of window (image, wi, wj) is map pixel
``((wi*wh + i - shift_h) mod H, (wj*ww + j - shift_w) mod W)`` of that image (partition reads it,
reverse writes it, with its shift negated). The window size is a compile-time constant, so the
per-pixel index math is a few multiplies and one conditional add, no division; rows of C
contiguous channels keep every access coalesced. Offsets are 64-bit; the batch is folded into
the window index (grid dimension 0, up to 2^31 - 1 windows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared.launch import cdiv, next_power_of_2
from fusedops.kernels.shared.window_geometry import partition_shape, reverse_shape

TILE = 4096  # elements per program


@triton.jit
def _window_gather_kernel(
    src_ptr,
    dst_ptr,
    channels,
    height,
    width,
    shift_h,
    shift_w,
    WINDOW_H: tl.constexpr,
    WINDOW_W: tl.constexpr,
    REVERSE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    window = tl.program_id(0).to(tl.int64)
    windows_h = height // WINDOW_H
    windows_w = width // WINDOW_W
    image = window // (windows_h * windows_w)  # scalars: once per program
    wi = (window // windows_w) % windows_h
    wj = window % windows_w
    pixel = tl.arange(0, BLOCK_P)  # pixel (i, j) of the window, row-major
    h = wi * WINDOW_H + pixel // WINDOW_W - shift_h
    w = wj * WINDOW_W + pixel % WINDOW_W - shift_w
    h = tl.where(h < 0, h + height, h)  # shifts are in [0, H) and [0, W): one wrap at most
    w = tl.where(w < 0, w + width, w)
    map_row = (image * height + h) * width + w
    window_row = window * (WINDOW_H * WINDOW_W) + pixel
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (pixel < WINDOW_H * WINDOW_W)[:, None] & (col < channels)[None, :]
    map_offsets = map_row[:, None] * channels + col[None, :]
    window_offsets = window_row[:, None] * channels + col[None, :]
    if REVERSE:
        values = tl.load(src_ptr + window_offsets, mask=mask)
        tl.store(dst_ptr + map_offsets, values, mask=mask)
    else:
        values = tl.load(src_ptr + map_offsets, mask=mask)
        tl.store(dst_ptr + window_offsets, values, mask=mask)


def _gather(src, dst, windows, height, width, wh, ww, sh, sw, reverse: bool) -> torch.Tensor:
    channels = dst.shape[-1]
    if windows == 0 or channels == 0:
        return dst
    block_p = next_power_of_2(wh * ww)
    block_c = min(next_power_of_2(channels), max(16, TILE // block_p))
    if reverse:  # the map pixel a window pixel goes to is shifted the other way
        sh, sw = (height - sh) % height, (width - sw) % width
    # windows on dim 0 (up to 2^31 - 1); channel blocks on dim 1 (<= 65535: C up to ~1M)
    grid = (windows, cdiv(channels, block_c))
    _window_gather_kernel[grid](
        src, dst, channels, height, width, sh, sw,
        WINDOW_H=wh, WINDOW_W=ww, REVERSE=reverse, BLOCK_P=block_p, BLOCK_C=block_c,
    )  # fmt: skip
    return dst


def partition(x: torch.Tensor, wh: int, ww: int, sh: int, sw: int) -> torch.Tensor:
    """roll(x, (sh, sw)) cut into (B*nW, wh, ww, C) windows; x contiguous (B, H, W, C),
    0 <= sh < H, 0 <= sw < W."""
    height, width = x.shape[1], x.shape[2]
    out = _alloc.empty(partition_shape(x, wh, ww), dtype=x.dtype, device=x.device)
    return _gather(x, out, out.shape[0], height, width, wh, ww, sh, sw, reverse=False)


def reverse(windows: torch.Tensor, wh: int, ww: int, height: int, width: int, sh: int, sw: int):
    """Windows (B*nW, wh, ww, C), contiguous, glued into (B, H, W, C) then rolled by (sh, sw);
    0 <= sh < H, 0 <= sw < W."""
    shape = reverse_shape(windows, wh, ww, height, width)
    out = _alloc.empty(shape, dtype=windows.dtype, device=windows.device)
    return _gather(windows, out, windows.shape[0], height, width, wh, ww, sh, sw, reverse=True)

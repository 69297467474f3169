"""deform_conv2d Triton kernels (the host steps and the layouts: ``kernels/deform_conv2d_host.py``).

Each program of ``_columns_kernel`` and ``_sample_grads_kernel`` takes BLOCK samples (image,
offset group, kernel point, output pixel), computes their bilinear corners once and loops over
the group's channels; math in fp32. ``_segment_gather_kernel`` is the deterministic input
gradient: one program per (image, offset group, input pixel) and BLOCK_C channels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fusedops.kernels import deform_conv2d_host as host
from fusedops.kernels.shared.launch import cdiv

BLOCK = 128
BLOCK_C = 16


@triton.jit
def _corners(
    offset_ptr, mask_ptr, N, L, W_OUT, K, KW, G,
    SH, SW, PH, PW, DH, DW, H, W, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """This program's BLOCK samples ``pos`` (b, g, k, l flattened; ``valid``: pos < N): their
    image, group, point, pixel, top-left corner, bilinear fractions, corner validity, mask."""
    pos = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = pos < N
    l = pos % L
    t = pos // L
    k = t % K
    bg = t // K
    oy = l // W_OUT
    ox = l % W_OUT
    base = (bg * K + k) * 2 * L + l
    dy = tl.load(offset_ptr + base, mask=valid, other=0.0).to(tl.float32)
    dx = tl.load(offset_ptr + base + L, mask=valid, other=0.0).to(tl.float32)
    y = (oy * SH - PH + (k // KW) * DH).to(tl.float32) + dy
    x = (ox * SW - PW + (k % KW) * DW).to(tl.float32) + dx
    inside = valid & (y > -1.0) & (y < H) & (x > -1.0) & (x < W)
    yf = tl.floor(y)
    xf = tl.floor(x)
    ly = y - yf
    lx = x - xf
    y0 = tl.where(inside, yf, 0.0).to(tl.int32)
    x0 = tl.where(inside, xf, 0.0).to(tl.int32)
    top = inside & (y0 >= 0)
    bottom = inside & (y0 + 1 < H)
    left = x0 >= 0
    right = x0 + 1 < W
    if HAS_MASK:
        m = tl.load(mask_ptr + bg * K * L + k * L + l, mask=valid, other=0.0).to(tl.float32)
    else:
        m = tl.full(ly.shape, 1.0, tl.float32)
    return pos, valid, bg // G, bg % G, bg, k, l, y0, x0, ly, lx, top, bottom, left, right, m


@triton.jit
def _columns_kernel(
    cols_ptr, input_ptr, offset_ptr, mask_ptr, N, B, C, CG, G, H, W, K, KW, L, W_OUT,
    SH, SW, PH, PW, DH, DW, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pos, valid, b, g, bg, k, l, y0, x0, ly, lx, top, bottom, left, right, m = _corners(
        offset_ptr, mask_ptr, N, L, W_OUT, K, KW, G, SH, SW, PH, PW, DH, DW, H, W, HAS_MASK, BLOCK
    )
    w00 = (1.0 - ly) * (1.0 - lx) * m
    w01 = (1.0 - ly) * lx * m
    w10 = ly * (1.0 - lx) * m
    w11 = ly * lx * m
    corner = y0 * W + x0
    plane = (b * C + g * CG) * H * W
    out = (g * CG * K + k) * (B * L) + b * L + l
    for c in range(0, CG):
        src = input_ptr + plane + c * H * W + corner
        v = w00 * tl.load(src, mask=top & left, other=0.0).to(tl.float32)
        v += w01 * tl.load(src + 1, mask=top & right, other=0.0).to(tl.float32)
        v += w10 * tl.load(src + W, mask=bottom & left, other=0.0).to(tl.float32)
        v += w11 * tl.load(src + W + 1, mask=bottom & right, other=0.0).to(tl.float32)
        tl.store(cols_ptr + out + c * K * B * L, v.to(cols_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _sample_grads_kernel(
    grad_cols_ptr, input_ptr, offset_ptr, mask_ptr, grad_offset_ptr, grad_mask_ptr,
    grad_input_ptr, keys_ptr, coefs_ptr, N, B, C, CG, G, H, W, K, KW, L, W_OUT,
    SH, SW, PH, PW, DH, DW,
    HAS_MASK: tl.constexpr, ATOMIC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pos, valid, b, g, bg, k, l, y0, x0, ly, lx, top, bottom, left, right, m = _corners(
        offset_ptr, mask_ptr, N, L, W_OUT, K, KW, G, SH, SW, PH, PW, DH, DW, H, W, HAS_MASK, BLOCK
    )
    hy = 1.0 - ly
    hx = 1.0 - lx
    ok00 = top & left
    ok01 = top & right
    ok10 = bottom & left
    ok11 = bottom & right
    corner = y0 * W + x0
    plane = (b * C + g * CG) * H * W
    col = (g * CG * K + k) * (B * L) + b * L + l
    acc_m = tl.zeros((BLOCK,), tl.float32)
    acc_y = tl.zeros((BLOCK,), tl.float32)
    acc_x = tl.zeros((BLOCK,), tl.float32)
    for c in range(0, CG):
        gc = tl.load(grad_cols_ptr + col + c * K * B * L, mask=valid, other=0.0).to(tl.float32)
        src = plane + c * H * W + corner
        v00 = tl.load(input_ptr + src, mask=ok00, other=0.0).to(tl.float32)
        v01 = tl.load(input_ptr + src + 1, mask=ok01, other=0.0).to(tl.float32)
        v10 = tl.load(input_ptr + src + W, mask=ok10, other=0.0).to(tl.float32)
        v11 = tl.load(input_ptr + src + W + 1, mask=ok11, other=0.0).to(tl.float32)
        acc_m += gc * (hy * (hx * v00 + lx * v01) + ly * (hx * v10 + lx * v11))
        acc_y += gc * (hx * (v10 - v00) + lx * (v11 - v01))
        acc_x += gc * (hy * (v01 - v00) + ly * (v11 - v10))
        if ATOMIC:
            gm = gc * m
            tl.atomic_add(grad_input_ptr + src, gm * hy * hx, mask=ok00)
            tl.atomic_add(grad_input_ptr + src + 1, gm * hy * lx, mask=ok01)
            tl.atomic_add(grad_input_ptr + src + W, gm * ly * hx, mask=ok10)
            tl.atomic_add(grad_input_ptr + src + W + 1, gm * ly * lx, mask=ok11)
    base = (bg * K + k) * 2 * L + l
    ty = grad_offset_ptr.dtype.element_ty
    tl.store(grad_offset_ptr + base, (acc_y * m).to(ty), mask=valid)
    tl.store(grad_offset_ptr + base + L, (acc_x * m).to(ty), mask=valid)
    if HAS_MASK:
        tm = grad_mask_ptr.dtype.element_ty
        tl.store(grad_mask_ptr + bg * K * L + k * L + l, acc_m.to(tm), mask=valid)
    if not ATOMIC:
        none = B * G * H * W
        key = bg * H * W + corner
        entry = pos * 4
        tl.store(keys_ptr + entry, tl.where(ok00, key, none), mask=valid)
        tl.store(keys_ptr + entry + 1, tl.where(ok01, key + 1, none), mask=valid)
        tl.store(keys_ptr + entry + 2, tl.where(ok10, key + W, none), mask=valid)
        tl.store(keys_ptr + entry + 3, tl.where(ok11, key + W + 1, none), mask=valid)
        tl.store(coefs_ptr + entry, m * hy * hx, mask=valid)
        tl.store(coefs_ptr + entry + 1, m * hy * lx, mask=valid)
        tl.store(coefs_ptr + entry + 2, m * ly * hx, mask=valid)
        tl.store(coefs_ptr + entry + 3, m * ly * lx, mask=valid)


@triton.jit
def _segment_gather_kernel(
    grad_cols_ptr, order_ptr, coefs_ptr, starts_ptr, grad_input_ptr, B, C, CG, G, HW, K, L,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    segment = tl.program_id(0).to(tl.int64)
    bg = segment // HW
    pixel = segment % HW
    b = bg // G
    g = bg % G
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = channels < CG
    rows = (g * CG + channels).to(tl.int64) * K * B * L + b * L
    start = tl.load(starts_ptr + segment)
    end = tl.load(starts_ptr + segment + 1)
    acc = tl.zeros((BLOCK_C,), tl.float32)
    for e in range(start, end):
        entry = tl.load(order_ptr + e)
        coef = tl.load(coefs_ptr + entry)
        sample = entry // 4
        point = (sample // L) % K
        gc = tl.load(grad_cols_ptr + rows + point * B * L + sample % L, mask=live, other=0.0)
        acc += coef * gc.to(tl.float32)
    dst = grad_input_ptr + (b * C + g * CG + channels) * HW + pixel
    tl.store(dst, acc.to(grad_input_ptr.dtype.element_ty), mask=live)


def _sizes(geo: host.Geometry) -> tuple:
    """The sample decoding arguments shared by the columns and sample-gradient kernels."""
    (sh, sw), (ph, pw), (dh, dw) = geo.stride, geo.padding, geo.dilation
    return (
        geo.samples, geo.batch, geo.channels, geo.group_channels, geo.offset_groups,
        geo.height, geo.width, geo.points, geo.kw, geo.pixels, geo.w_out, sh, sw, ph, pw, dh, dw,
    )  # fmt: skip


def _columns(cols, input, offset, mask, geo):
    grid = (cdiv(geo.samples, BLOCK),)
    _columns_kernel[grid](
        cols, input, offset, offset if mask is None else mask, *_sizes(geo),
        HAS_MASK=mask is not None, BLOCK=BLOCK,
    )  # fmt: skip


def _sample_grads(
    grad_cols, input, offset, mask, geo, grad_offset, grad_mask, grad_input, keys, coefs
):
    atomic = grad_input is not None
    grid = (cdiv(geo.samples, BLOCK),)
    _sample_grads_kernel[grid](
        grad_cols, input, offset, offset if mask is None else mask, grad_offset,
        grad_offset if grad_mask is None else grad_mask,
        grad_input if atomic else grad_offset, grad_offset if atomic else keys,
        grad_offset if atomic else coefs, *_sizes(geo),
        HAS_MASK=mask is not None, ATOMIC=atomic, BLOCK=BLOCK,
    )  # fmt: skip


def _segment_gather(grad_cols, order, coefs, starts, grad_input, geo):
    cg = geo.group_channels
    segments = geo.batch * geo.offset_groups * geo.height * geo.width
    grid = (segments, cdiv(cg, BLOCK_C))
    _segment_gather_kernel[grid](
        grad_cols, order, coefs, starts, grad_input, geo.batch, geo.channels, cg,
        geo.offset_groups, geo.height * geo.width, geo.points, geo.pixels, BLOCK_C=BLOCK_C,
    )  # fmt: skip


#: The op's backend interface (``ops/deform_conv2d.py``) over these kernels.
forward, backward = host.entry_points(_columns, _sample_grads, _segment_gather)

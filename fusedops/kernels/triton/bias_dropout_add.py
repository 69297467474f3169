"""Bias-dropout-add Triton kernel and its launchers (the mask: ops/bias_dropout_add.py).

One kernel serves both directions: ``out = [residual +] dropout(src [+ bias])`` over src viewed
as ``(M, H)`` rows, math in fp32.

- Forward: src = x, with bias and residual.
- Backward: src = grad, no bias or residual, out = grad_x; with a bias the kernel also reduces
  grad_x over rows: program ``g`` of ``G`` row groups takes row tiles ``g, g + G, ...`` and
  writes one fp32 partial row, then ``layer_norm._column_sum`` adds the ``G`` partial rows in a
  fixed order (no atomics: the same bits every run).

A tile is ``(BLOCK_M, BLOCK_N4, 4)``: four consecutive elements of a row in the last dim. When
every such quad starts at a multiple of 4 in x (H % 4 == 0, or a single row), one
``tl.randint4x`` call gives the words of a quad; otherwise each element runs its own Philox call
(4x the arithmetic, same bits). Without a bias src is viewed as one row (M = 1, H = numel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared import philox
from fusedops.kernels.shared.launch import cdiv, next_power_of_2
from fusedops.kernels.triton.layer_norm import _column_sum, _max_programs

#: Elements per tile (BLOCK_M * BLOCK_N4 * 4) and the widest tile row (columns) of rows with a
#: bias (a single row, without a bias, takes a whole tile).
TILE_ELEMENTS = 4096
MAX_BLOCK_N = 1024
#: Triton's limit on grid dims 1 and 2 (row groups loop over the rest).
MAX_GROUPS = 65535


@triton.jit
def _keep(seed_ptr, first, lane, threshold, GROUPED: tl.constexpr):
    """Whether each element is kept: ``first`` (BM, BN4, 1) is the flat index of a quad's first
    element, ``lane`` (1, 1, 4) the element's place in it; element i takes word i % 4 of Philox
    counter offset + i // 4 and is kept iff the word >= threshold."""
    key = tl.load(seed_ptr)
    offset = tl.load(seed_ptr + 1)
    if GROUPED:  # first % 4 == 0: one counter per quad
        counter = offset + (first >> 2)
        which = lane
    else:
        index = first + lane
        counter = offset + (index >> 2)
        which = index & 3
    w0, w1, w2, w3 = tl.randint4x(key, counter)
    word = tl.where(which == 0, w0, tl.where(which == 1, w1, tl.where(which == 2, w2, w3)))
    return word.to(tl.int64) >= threshold


@triton.jit
def _kernel(
    src_ptr,
    bias_ptr,
    residual_ptr,
    out_ptr,
    partial_ptr,
    seed_ptr,
    M,
    H,
    threshold,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    REDUCE: tl.constexpr,
    MODE: tl.constexpr,
    GROUPED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N4: tl.constexpr,
):
    quads = tl.program_id(0).to(tl.int64) * BLOCK_N4 + tl.arange(0, BLOCK_N4)
    lane = tl.arange(0, 4)[None, None, :]
    first_col = (quads * 4)[None, :, None]  # (1, BN4, 1)
    cols = first_col + lane  # (1, BN4, 4)
    col_mask = cols < H
    group = tl.program_id(1)
    groups = tl.num_programs(1)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if REDUCE:
        acc = tl.zeros([BLOCK_M, BLOCK_N4, 4], dtype=tl.float32)
    for start in range(group.to(tl.int64) * BLOCK_M, M, groups * BLOCK_M):
        rows = (start + tl.arange(0, BLOCK_M))[:, None, None]
        first = rows * H + first_col  # (BM, BN4, 1)
        offsets = first + lane
        mask = (rows < M) & col_mask
        v = tl.load(src_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            v += bias
        if MODE == 1:  # philox.RANDOM
            keep = _keep(seed_ptr, first, lane, threshold, GROUPED)
            y = tl.where(keep & mask, v * scale, 0.0)
        elif MODE == 0:  # philox.KEEP
            y = v
        else:  # philox.DROP
            y = tl.zeros_like(v)
        if REDUCE:
            acc += y
        if HAS_RESIDUAL:
            y += tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)
    if REDUCE:
        partial = group.to(tl.int64) * H + cols
        tl.store(partial_ptr + partial, tl.sum(acc, axis=0)[None], mask=col_mask)


def _launch(src, bias, residual, out, seed, p: float, rows: int, width: int, reduce: bool):
    """Run the kernel over src viewed as (rows, width); returns the fp32 partial rows of the
    column sums when ``reduce``."""
    mode = philox.dropout_mode(p, seed is not None)
    widest = MAX_BLOCK_N if rows > 1 else TILE_ELEMENTS
    block_n4 = max(1, min(widest, next_power_of_2(width)) // 4)
    block_m = max(1, min(TILE_ELEMENTS // (4 * block_n4), next_power_of_2(rows)))
    column_blocks = cdiv(width, 4 * block_n4)
    groups = min(cdiv(rows, block_m), MAX_GROUPS)
    partial = src  # a dummy pointer where nothing is reduced (never touched)
    if reduce:
        groups = max(1, min(groups, _max_programs(src.device) // column_blocks))
        partial = _alloc.empty((groups, width), dtype=torch.float32, device=src.device)
    _kernel[(column_blocks, groups)](
        src,
        src if bias is None else bias,
        src if residual is None else residual,
        out,
        partial,
        src if seed is None else seed,
        rows,
        width,
        philox.keep_threshold(p),
        philox.dropout_scale(p),
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        REDUCE=reduce,
        MODE=mode,
        GROUPED=width % 4 == 0 or rows == 1,
        BLOCK_M=block_m,
        BLOCK_N4=block_n4,
        num_warps=4,
    )
    return partial


def forward(x, bias, residual, seed, p: float) -> torch.Tensor:
    """residual + dropout(x + bias); x contiguous (..., H), bias (H,) or None, residual
    contiguous of x's shape; out like x in residual's dtype."""
    out = _alloc.empty_like(x, dtype=residual.dtype)
    n = x.numel()
    if n:
        rows, width = (n // x.shape[-1], x.shape[-1]) if bias is not None else (1, n)
        _launch(x, bias, residual, out, seed, p, rows, width, reduce=False)
    return out


def backward(grad, seed, p: float, x_dtype, bias_dtype):
    """(grad_x, grad_bias): dropout(grad) in x_dtype, and its sum over the leading dims in
    bias_dtype (None without a bias); grad contiguous (..., H)."""
    grad_x = _alloc.empty_like(grad, dtype=x_dtype)
    n = grad.numel()
    width = grad.shape[-1] if grad.dim() else 1
    if bias_dtype is None:
        if n:
            _launch(grad, None, None, grad_x, seed, p, 1, n, reduce=False)
        return grad_x, None
    if n == 0:
        return grad_x, torch.zeros((width,), dtype=bias_dtype, device=grad.device)
    partial = _launch(grad, None, None, grad_x, seed, p, n // width, width, reduce=True)
    return grad_x, _column_sum(partial, bias_dtype)

"""Bias-dropout-add Triton kernel and its launchers (the mask: ops/bias_dropout_add.py).

One kernel serves both directions: ``out = [residual +] dropout(src [+ bias])`` over src viewed
as ``(M, H)`` rows, math in fp32.

- Forward: src = x, with bias and residual.
- Backward: src = grad, no bias or residual, out = grad_x; with a bias the kernel also reduces
  grad_x over rows: program ``g`` of ``G`` row groups takes row tiles ``g, g + G, ...`` and
  writes one fp32 partial row, then ``layer_norm._column_sum`` adds the ``G`` partial rows in a
  fixed order (no atomics: the same bits every run).

A tile is ``(BLOCK_M, BLOCK_N)`` of src, loaded and stored whole, so a thread holds 8
consecutive 16-bit elements (16-byte accesses where rows are aligned; ``blocks`` picks the
warps so that one tile row spans them). When every quad (four consecutive elements) starts at
a multiple of 4 in x (H % 4 == 0, or a single row), one ``tl.randint4x`` call on a
``(BLOCK_M, BLOCK_N // 4)`` tensor gives the words of each quad and ``tl.join`` /
``tl.reshape`` lay them out as the tile's columns (register moves, no shared memory);
otherwise each element runs its own Philox call (4x the arithmetic, same bits). fp32 stores
of a 16-bit tile (an fp32 residual stream, the partial sums) go out as two 16-byte vectors a
thread (``_store``). Without a bias src is viewed as one row (M = 1, H = numel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared import philox
from fusedops.kernels.shared.launch import cdiv, next_power_of_2
from fusedops.kernels.triton.layer_norm import _column_sum, _max_programs

#: Elements per tile (BLOCK_M * BLOCK_N) and the widest tile row (columns) of rows with a
#: bias (a single row, without a bias, takes a whole tile).
TILE_ELEMENTS = 4096
MAX_BLOCK_N = 1024
#: Triton's limit on grid dims 1 and 2 (row groups loop over the rest).
MAX_GROUPS = 65535


@triton.jit
def _keep(seed_ptr, rows, col0, H, threshold, GROUPED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Whether each element of the (BM, BN) tile at ``rows`` (BM, 1) and columns
    ``col0 + [0, BN)`` of the (M, H) view is kept: element i (flat index) takes word i % 4 of
    Philox counter offset + i // 4 and is kept iff the word >= threshold (col0 % 4 == 0)."""
    key = tl.load(seed_ptr)
    offset = tl.load(seed_ptr + 1)
    if GROUPED:  # every quad starts at a multiple of 4: one counter per quad
        quads = (col0 + 4 * tl.arange(0, BLOCK_N // 4))[None, :]
        w0, w1, w2, w3 = tl.randint4x(key, offset + ((rows * H + quads) >> 2))
        # (BM, BN4, 2, 2) with [.., j, k] = word 2j + k, so row-major (BM, BN) is quad order
        words = tl.join(tl.join(w0, w2), tl.join(w1, w3))
        word = tl.reshape(words, (rows.shape[0], BLOCK_N))
    else:
        index = rows * H + (col0 + tl.arange(0, BLOCK_N))[None, :]
        which = index & 3
        w0, w1, w2, w3 = tl.randint4x(key, offset + (index >> 2))
        word = tl.where(which == 0, w0, tl.where(which == 1, w1, tl.where(which == 2, w2, w3)))
    return word.to(tl.int64) >= threshold


@triton.jit
def _store(ptr, src_ptr, row0, ROWS: tl.constexpr, M, col0, H, y, BLOCK_N: tl.constexpr):
    """Store the fp32 tile ``y`` (ROWS, BN), rows ``row0 + [0, ROWS)`` (< M) and columns
    ``col0 + [0, BN)`` (< H) of ``ptr`` viewed as (M, H), in ptr's dtype. Where ptr's elements
    are twice src's width (fp32 out of a 16-bit tile, whose thread holds 8 columns), the tile is
    stored as (2, ROWS, BN // 8, 4): each thread's columns as two 16-byte vectors from its own
    registers (a (ROWS, BN) store would take 4 columns a thread: a shared-memory shuffle)."""
    if ptr.dtype.element_ty.primitive_bitwidth == 2 * src_ptr.dtype.element_ty.primitive_bitwidth:
        ptr += row0 * H  # rows counted from row0 (8 bytes of spills at sm_80 otherwise)
        rows = tl.arange(0, ROWS)[None, :, None, None]
        cols = (
            col0
            + 4 * tl.arange(0, 2)[:, None, None, None]
            + 8 * tl.arange(0, BLOCK_N // 8)[None, None, :, None]
            + tl.arange(0, 4)[None, None, None, :]
        )
        y = tl.permute(tl.reshape(y, (ROWS, BLOCK_N // 8, 2, 4)), (2, 0, 1, 3))
        mask = (rows < M - row0) & (cols < H)
    else:
        rows = (row0 + tl.arange(0, ROWS))[:, None]
        cols = (col0 + tl.arange(0, BLOCK_N))[None, :]
        mask = (rows < M) & (cols < H)
    tl.store(ptr + rows * H + cols, y.to(ptr.dtype.element_ty), mask=mask)


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
    BLOCK_N: tl.constexpr,
):
    col0 = tl.program_id(0).to(tl.int64) * BLOCK_N
    cols = col0 + tl.arange(0, BLOCK_N)
    col_mask = (cols < H)[None, :]
    group = tl.program_id(1)
    groups = tl.num_programs(1)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
    if REDUCE:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(group.to(tl.int64) * BLOCK_M, M, groups * BLOCK_M):
        rows = (start + tl.arange(0, BLOCK_M))[:, None]
        offsets = rows * H + cols[None, :]
        mask = (rows < M) & col_mask
        v = tl.load(src_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            v += bias
        if MODE == 1:  # philox.RANDOM
            keep = _keep(seed_ptr, rows, col0, H, threshold, GROUPED, BLOCK_N)
            y = tl.where(keep & mask, v * scale, 0.0)
        elif MODE == 0:  # philox.KEEP
            y = v
        else:  # philox.DROP
            y = tl.zeros_like(v)
        if REDUCE:
            acc += y
        if HAS_RESIDUAL:
            y += tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        _store(out_ptr, src_ptr, start, BLOCK_M, M, col0, H, y, BLOCK_N)
    if REDUCE:
        total = tl.sum(acc, axis=0)[None, :]
        _store(partial_ptr, src_ptr, group.to(tl.int64), 1, groups, col0, H, total, BLOCK_N)


def blocks(
    rows: int, width: int, itemsize: int, grouped: bool = True, reduce: bool = False
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the kernel over (rows, width) of ``itemsize``-byte src
    elements. Tile columns: a power of 2 >= 8 (whole quads; 16 bytes of 16-bit elements), at
    most ``MAX_BLOCK_N`` with rows (a single row takes ``TILE_ELEMENTS``). Warps: as many (<= 4)
    as one tile row fills at 16 bytes a thread, so no warp splits a column (no cross-warp sum;
    the bias row takes the tile's layout). Rows: ``TILE_ELEMENTS / 4`` elements a warp, half
    that where each element runs its own Philox call (``grouped`` False: 255 registers and
    spills at sm_90) or an fp32 tile keeps an fp32 bias-gradient sum (``reduce``: 168
    registers at sm_90, 3 CTAs/SM, fewer than the programs the reduction puts on an SM)."""
    widest = MAX_BLOCK_N if rows > 1 else TILE_ELEMENTS
    block_n = max(8, min(widest, next_power_of_2(width)))
    warps = max(1, min(4, block_n * itemsize // 512))
    tile = TILE_ELEMENTS * warps // (4 if grouped and not (reduce and itemsize == 4) else 8)
    return max(1, min(tile // block_n, next_power_of_2(rows))), block_n, warps


def _launch(src, bias, residual, out, seed, p: float, rows: int, width: int, reduce: bool):
    """Run the kernel over src viewed as (rows, width); returns the fp32 partial rows of the
    column sums when ``reduce``."""
    mode = philox.dropout_mode(p, seed is not None)
    grouped = width % 4 == 0 or rows == 1
    block_m, block_n, warps = blocks(rows, width, src.element_size(), grouped, reduce)
    column_blocks = cdiv(width, block_n)
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
        GROUPED=grouped,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
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

"""Swin attention softmax in Triton: ``softmax(attn + bias + mask)`` forward, and its backward
with the bias gradient reduced over windows in fp32 without atomics.

Forward: program ``window * row_blocks + row block`` (a 1-D grid: windows and row blocks can
each pass the 65535 that CUDA allows grid dims 1 and 2) normalises BLOCK_R rows of N scores of
one window (a row per (head, query)), adding bias[head, query] and mask[window % nW, query] as
it loads them; N is a compile-time constant, so the only per-row index math is ``row % N`` by
a constant.
Backward: program (row block, chunk) walks the windows of its chunk for BLOCK_R rows of one
window's (heads*N, N) block, writes d_attn and accumulates dz for the same rows in fp32; the
partial sums of the chunks are added in a fixed order afterwards. Its tile holds each row in one
warp, and its offsets are 32-bit from the chunk's start (64-bit, WIDE, past 2^31 - 1): 56-64
registers at Swin's N = 49 (255 with spills before), BACKWARD_PER_SM programs a multiprocessor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared.launch import cdiv, next_power_of_2
from fusedops.kernels.shared.swin_chunks import backward_chunks

TILE = 2048  # scores per forward program
BACKWARD_TILE = 1024  # scores per backward program
#: backward programs a multiprocessor: what its 56-64 registers a thread let one hold
#: (benchmarks/results/kernel_report.csv), so the loads in flight fill it
BACKWARD_PER_SM = 8
#: the largest offset from a chunk's first score that the backward keeps in 32 bits
MAX_OFFSET = 2**31 - 1


@triton.jit
def _forward_kernel(
    attn_ptr,
    bias_ptr,
    mask_ptr,
    out_ptr,
    heads_n,
    row_blocks,
    mask_windows,
    N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)
    window = program // row_blocks
    row = (program % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)  # head * N + query
    col = tl.arange(0, BLOCK_N)
    inside = (row < heads_n)[:, None] & (col < N)[None, :]
    inner = row[:, None] * N + col[None, :]  # bias offsets; within one window too
    base = window * heads_n * N  # 64-bit offset of the window's scores
    z = tl.load(attn_ptr + base + inner, mask=inside, other=-float("inf")).to(tl.float32)
    z += tl.load(bias_ptr + inner, mask=inside, other=0.0)
    if HAS_MASK:
        mask_base = (window % mask_windows) * N * N
        mask_offsets = (row % N)[:, None] * N + col[None, :]
        z += tl.load(mask_ptr + mask_base + mask_offsets, mask=inside, other=0.0)
    top = tl.max(z, axis=1)  # skips NaN: a NaN shows in the total instead
    e = tl.exp(z - tl.where(top == -float("inf"), 0.0, top)[:, None])
    total = tl.sum(e, axis=1)
    # fully masked: every entry -inf (the row max, NaN counted, is -inf); a NaN or +inf in a
    # row makes its total NaN, so its probabilities are NaN, as torch.softmax's
    masked = (top == -float("inf")) & (total == total)
    scale = tl.where(masked, 0.0, 1.0 / tl.where(masked, 1.0, total))
    tl.store(out_ptr + base + inner, (e * scale[:, None]).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _backward_kernel(
    grad_ptr,
    probs_ptr,
    dattn_ptr,
    partial_ptr,
    windows,
    per_chunk,
    heads_n,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WIDTH: tl.constexpr,
    WIDE: tl.constexpr,
):
    # The tile is (BLOCK_N // WIDTH, BLOCK_R, WIDTH): each row's BLOCK_N columns in pieces of
    # WIDTH <= 32 lanes, so that with a score a lane (N = 49: rows not 16-byte aligned) a warp
    # holds whole rows and the row sums are shuffles within it; a (BLOCK_R, 64) tile spreads a
    # row over two warps (shared memory, barriers). Where N allows 16-byte vectors (N % 8 == 0
    # for 16-bit, % 4 for fp32) a piece takes fewer lanes and wide rows may span warps again.
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (head, query) rows of a window
    col = tl.arange(0, BLOCK_N // WIDTH)[:, None, None] * WIDTH + tl.arange(0, WIDTH)[None, None, :]
    chunk = tl.program_id(1)
    inside = (row < heads_n)[None, :, None] & (col < N)
    if WIDE:  # the chunk's scores past 32-bit offsets
        row = row.to(tl.int64)
        block = heads_n.to(tl.int64) * N
    else:
        block = heads_n * N  # scores per window
    inner = row[None, :, None] * N + col
    acc = tl.zeros((BLOCK_N // WIDTH, BLOCK_R, WIDTH), dtype=tl.float32)
    first = chunk * per_chunk
    base = first.to(tl.int64) * block  # 64-bit offset of the chunk's first window
    probs_ptr += base
    grad_ptr += base
    dattn_ptr += base
    # offsets from the chunk's start, made afresh per window: pointers advanced per window
    # are strength-reduced into a 64-bit pointer per element and tensor, live across the loop
    # (255 registers and spills at BLOCK_R x BLOCK_N = 32 x 64)
    for w in range(0, tl.minimum(per_chunk, windows - first)):
        offsets = inner + w * block
        p = tl.load(probs_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        dz = p * (g - tl.sum(tl.sum(p * g, axis=2), axis=0)[None, :, None])
        tl.store(dattn_ptr + offsets, dz.to(dattn_ptr.dtype.element_ty), mask=inside)
        acc += dz
    tl.store(partial_ptr + chunk.to(tl.int64) * block + inner, acc, mask=inside)


def _blocks(n: int, tile: int = TILE) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_N): rows of ``n`` scores a program takes, ``tile`` scores at most."""
    block_n = next_power_of_2(max(n, 1))
    return max(1, min(64, tile // block_n)), block_n


def forward(attn: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Probabilities (attn's shape and dtype); attn (B*nW, heads, N, N) contiguous non-empty,
    bias (heads, N, N) and mask (nW, N, N) or None contiguous fp32."""
    out = _alloc.empty_like(attn)
    windows, heads, n = attn.shape[0], attn.shape[1], attn.shape[-1]
    block_r, block_n = _blocks(n)
    row_blocks = cdiv(heads * n, block_r)
    _forward_kernel[(windows * row_blocks,)](
        attn, bias, mask if mask is not None else bias, out, heads * n, row_blocks,
        mask.shape[0] if mask is not None else 1,
        N=n, HAS_MASK=mask is not None, BLOCK_R=block_r, BLOCK_N=block_n,
    )  # fmt: skip
    return out


def backward_meta(n: int, heads: int, per_chunk: int) -> dict:
    """The backward kernel's constexprs for windows of ``heads`` x ``n`` rows of ``n`` scores
    and ``per_chunk`` windows a program (ints >= 1): BACKWARD_TILE scores a program (8 a thread
    at Triton's default 4 warps), WIDE where a chunk's offsets pass ``MAX_OFFSET``."""
    block_r, block_n = _blocks(n, BACKWARD_TILE)
    wide = per_chunk * heads * n * n > MAX_OFFSET
    return dict(N=n, BLOCK_R=block_r, BLOCK_N=block_n, WIDTH=min(block_n, 32), WIDE=wide)


def backward(grad: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_attn like probs, d_bias (heads, N, N) fp32); grad and probs contiguous, same
    non-empty shape."""
    d_attn = _alloc.empty_like(probs)
    windows, heads, n = probs.shape[0], probs.shape[1], probs.shape[-1]
    row_groups = cdiv(heads * n, _blocks(n, BACKWARD_TILE)[0])
    chunks = backward_chunks(windows, row_groups, probs.device, BACKWARD_PER_SM)
    per_chunk = cdiv(windows, chunks)
    partial = _alloc.empty((chunks, heads, n, n), dtype=torch.float32, device=probs.device)
    _backward_kernel[(row_groups, chunks)](
        grad, probs, d_attn, partial, windows, per_chunk, heads * n,
        **backward_meta(n, heads, per_chunk),
    )  # fmt: skip
    return d_attn, partial.sum(dim=0)

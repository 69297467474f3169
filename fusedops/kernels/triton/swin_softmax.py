"""Swin attention softmax in Triton: ``softmax(attn + bias + mask)`` forward, and its backward
with the bias gradient reduced over windows in fp32 without atomics.

Forward: program ``window * row_blocks + row block`` (a 1-D grid: windows and row blocks can
each pass the 65535 that CUDA allows grid dims 1 and 2) normalises BLOCK_R rows of N scores of
one window (a row per (head, query)), adding bias[head, query] and mask[window % nW, query] as
it loads them; N is a compile-time constant, so the only per-row index math is ``row % N`` by
a constant.
Backward: program (row block, chunk) walks the windows of its chunk for BLOCK_R rows of one
window's (heads*N, N) block, writes d_attn and accumulates dz for the same rows in fp32; the
partial sums of the chunks are added in a fixed order afterwards.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared.launch import cdiv, next_power_of_2
from fusedops.kernels.shared.swin_chunks import backward_chunks

TILE = 2048  # scores per program


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
    n,
    heads_n,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (head, query) rows of a window
    col = tl.arange(0, BLOCK_N)
    chunk = tl.program_id(1)
    inside = (row < heads_n)[:, None] & (col < n)[None, :]
    inner = row.to(tl.int64)[:, None] * n + col[None, :]
    block = heads_n * n  # scores per window
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    first = chunk * per_chunk
    last = tl.minimum(first + per_chunk, windows)
    base = first.to(tl.int64) * block  # 64-bit offset of the current window
    for _ in range(first, last):
        p = tl.load(probs_ptr + base + inner, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + base + inner, mask=inside, other=0.0).to(tl.float32)
        dz = p * (g - tl.sum(p * g, axis=1)[:, None])
        tl.store(dattn_ptr + base + inner, dz.to(dattn_ptr.dtype.element_ty), mask=inside)
        acc += dz
        base += block
    tl.store(partial_ptr + chunk.to(tl.int64) * block + inner, acc, mask=inside)


def _blocks(n: int) -> tuple[int, int]:
    block_n = next_power_of_2(max(n, 1))
    return max(1, min(64, TILE // block_n)), block_n


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


def backward(grad: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_attn like probs, d_bias (heads, N, N) fp32); grad and probs contiguous, same
    non-empty shape."""
    d_attn = _alloc.empty_like(probs)
    windows, heads, n = probs.shape[0], probs.shape[1], probs.shape[-1]
    block_r, block_n = _blocks(n)
    row_groups = cdiv(heads * n, block_r)
    chunks = backward_chunks(windows, row_groups, probs.device)
    per_chunk = cdiv(windows, chunks)
    partial = _alloc.empty((chunks, heads, n, n), dtype=torch.float32, device=probs.device)
    _backward_kernel[(row_groups, chunks)](
        grad, probs, d_attn, partial, windows, per_chunk, n, heads * n,
        BLOCK_R=block_r, BLOCK_N=block_n,
    )  # fmt: skip
    return d_attn, partial.sum(dim=0)

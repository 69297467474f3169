"""NMS and soft-NMS Triton kernels and their launchers (the cores of ``fusedops.ops.nms``; the
outputs are documented in ``fusedops.ops.nms_reference``).

nms: ``_mask_kernel`` (one program per 64x64 tile of boxes, upper triangle only; with classes,
only tiles where the row block's and column block's classes meet) writes, for every box i, the
64-bit words whose bit j says IoU(i, j) > threshold for a later box j of its class. One program
(``_walk_kernel``) then walks the boxes in order, a 64-box block at a time, holding the block's
removed word: each box not yet removed is kept and its row is OR-ed into the removed words
(of its own block and of the columns after it, up to the end of its class). No host round
trip.

soft-NMS: one program per class segment (one launch for all classes). Each step is one pass
over the segment: decay every live score by the previous pick, drop those below min_score, and
find the next pick (highest score, lowest position on ties). Scores live in an fp32 workspace;
a dropped or picked box holds NaN there.

IoU in fp32, correctly rounded division, and no fused multiply-adds (``enable_fp_fusion=False``),
so IoU, hence nms and the naive / linear soft-NMS decays, equal the reference's bit for bit.
Gaussian soft-NMS goes through ``tl.exp`` (approximate on the GPU), so its scores are within
float rounding of the reference's, not identical (two picks that close may swap places).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.shared.nms_plan import block_column_end, nms_walk_buffers, soft_nms_outputs

#: Boxes per bitmask word (and per row/column block of the mask).
WORD = 64
#: Column words OR-ed at once by the walk; boxes per chunk of a soft-NMS pass (at most).
WALK_COLUMNS = 128
SOFT_BLOCK = 1024


@triton.jit
def _area(x1, y1, x2, y2, offset):
    return (x2 - x1 + offset) * (y2 - y1 + offset)


@triton.jit
def _iou(ax1, ay1, ax2, ay2, a_area, bx1, by1, bx2, by2, b_area, offset):
    w = tl.maximum(tl.minimum(ax2, bx2) - tl.maximum(ax1, bx1) + offset, 0.0)
    h = tl.maximum(tl.minimum(ay2, by2) - tl.maximum(ay1, by1) + offset, 0.0)
    inter = w * h
    return tl.div_rn(inter, a_area + b_area - inter)


@triton.jit
def _load_box(boxes_ptr, index, mask):
    """Coordinates of boxes ``index`` (int64) as fp32."""
    base = boxes_ptr + index * 4
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    y1 = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + 2, mask=mask, other=0.0).to(tl.float32)
    y2 = tl.load(base + 3, mask=mask, other=0.0).to(tl.float32)
    return x1, y1, x2, y2


@triton.jit
def _mask_kernel(
    boxes_ptr,
    classes_ptr,
    col_end_ptr,
    mask_ptr,
    n,
    col_blocks,
    iou_threshold,
    offset,
    BATCHED: tl.constexpr,
):
    row_block = tl.program_id(0).to(tl.int64)
    col_block = tl.program_id(1).to(tl.int64)
    needed = col_block >= row_block
    if BATCHED:
        needed = needed & (col_block < tl.load(col_end_ptr + row_block))
    if needed:
        lane = tl.arange(0, 64)
        rows = row_block * 64 + lane
        cols = col_block * 64 + lane
        rmask, cmask = rows < n, cols < n
        rx1, ry1, rx2, ry2 = _load_box(boxes_ptr, rows, rmask)
        cx1, cy1, cx2, cy2 = _load_box(boxes_ptr, cols, cmask)
        r_area = _area(rx1, ry1, rx2, ry2, offset)
        c_area = _area(cx1, cy1, cx2, cy2, offset)
        iou = _iou(
            rx1[:, None], ry1[:, None], rx2[:, None], ry2[:, None], r_area[:, None],
            cx1[None, :], cy1[None, :], cx2[None, :], cy2[None, :], c_area[None, :], offset,
        )  # fmt: skip
        over = (iou > iou_threshold) & (cols[None, :] > rows[:, None]) & cmask[None, :]
        if BATCHED:
            r_cls = tl.load(classes_ptr + rows, mask=rmask, other=-1)
            c_cls = tl.load(classes_ptr + cols, mask=cmask, other=-2)
            over = over & (r_cls[:, None] == c_cls[None, :])
        bits = tl.where(over, tl.full([64, 64], 1, tl.int64) << lane[None, :].to(tl.int64), 0)
        words = tl.sum(bits, 1)  # distinct bits: the sum is their OR
        tl.store(mask_ptr + rows * col_blocks + col_block, words, mask=rmask)


@triton.jit
def _walk_kernel(
    mask_ptr,
    col_end_ptr,
    removed_ptr,
    positions_ptr,
    count_ptr,
    n,
    col_blocks,
    BATCHED: tl.constexpr,
    COLUMNS: tl.constexpr,
):
    column = tl.arange(0, COLUMNS)
    for first in range(0, col_blocks, COLUMNS):
        words = first + column
        tl.store(removed_ptr + words, tl.zeros([COLUMNS], tl.int64), mask=words < col_blocks)
    tl.debug_barrier()
    count = tl.zeros([], tl.int64)
    for block in range(0, col_blocks):
        row0 = tl.full([], 64, tl.int64) * block
        end = tl.zeros([], tl.int64) + col_blocks
        if BATCHED:
            end = tl.load(col_end_ptr + block)
        removed = tl.load(removed_ptr + block)
        for j in range(0, tl.minimum(n - row0, 64)):
            i = tl.zeros([], tl.int64) + j
            if ((removed >> i) & 1) == 0:  # box row0 + i is kept: remove what it overlaps
                tl.store(positions_ptr + count, row0 + i)
                count += 1
                row = mask_ptr + (row0 + i) * col_blocks
                removed |= tl.load(row + block)
                for c0 in range(row0 // 64 + 1, end, COLUMNS):  # int64 bounds
                    cols = c0 + column
                    inside = cols < end
                    old = tl.load(removed_ptr + cols, mask=inside, other=0)
                    hit = tl.load(row + cols, mask=inside, other=0)
                    tl.store(removed_ptr + cols, old | hit, mask=inside)
        tl.debug_barrier()
    for p0 in range(0, n, COLUMNS):
        p = p0 + column
        tl.store(positions_ptr + p, tl.zeros([COLUMNS], tl.int64) + n, mask=(p >= count) & (p < n))
    tl.store(count_ptr, count)


def nms_walk(boxes_p: torch.Tensor, classes_p: torch.Tensor | None, iou_threshold, offset):
    """Greedy NMS over boxes_p (N, 4) fp32/fp16/bf16 in processing order; classes_p int64 (N,)
    grouped, or None. Returns (positions (N,) int64, count 0-dim int64)."""
    n = boxes_p.shape[0]
    col_blocks = triton.cdiv(n, WORD)
    device = boxes_p.device
    batched = classes_p is not None
    col_end = block_column_end(classes_p, n) if batched else boxes_p.new_empty(0, dtype=torch.int64)
    classes = classes_p if batched else col_end
    mask, positions, count = nms_walk_buffers(n, device)
    # grid dim 1 (<= 65535) holds col_blocks up to n = 4.19M boxes, whose bitmask alone would
    # be n * col_blocks * 8 bytes = 2.2 TB: the allocation above fails long before the launch
    _mask_kernel[(col_blocks, col_blocks)](
        boxes_p, classes, col_end, mask, n, col_blocks, float(iou_threshold), float(offset),
        BATCHED=batched, enable_fp_fusion=False,
    )  # fmt: skip
    removed = _alloc.empty((col_blocks,), dtype=torch.int64, device=device)
    _walk_kernel[(1,)](
        mask, col_end, removed, positions, count, n, col_blocks,
        BATCHED=batched, COLUMNS=WALK_COLUMNS,
    )  # fmt: skip
    return positions, count


@triton.jit
def _soft_pass(
    boxes_ptr, source_ptr, work_ptr, start, end, pick,
    px1, py1, px2, py2, p_area,
    iou_threshold, sigma, min_score, offset,
    METHOD: tl.constexpr, DECAY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One pass over a segment: (with DECAY) decay every live score by the pick and drop it
    below min_score; write the scores to work; return the best live (score, position), position
    ``end`` when none is left."""
    best_score = tl.full([], float("-inf"), tl.float32)
    best = end
    for c0 in range(start, end, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        inside = offs < end
        score = tl.load(source_ptr + offs, mask=inside, other=float("nan")).to(tl.float32)
        live = inside & (score == score)
        if DECAY:
            x1, y1, x2, y2 = _load_box(boxes_ptr, offs, inside)
            iou = _iou(
                px1, py1, px2, py2, p_area, x1, y1, x2, y2, _area(x1, y1, x2, y2, offset), offset
            )
            iou = tl.where(iou == iou, iou, 0.0)
            if METHOD == 2:
                weight = tl.exp(tl.div_rn(-(iou * iou), sigma))
            elif METHOD == 1:
                weight = tl.where(iou >= iou_threshold, 1.0 - iou, 1.0)
            else:
                weight = tl.where(iou >= iou_threshold, 0.0, 1.0)
            score = score * weight
            live = live & (score >= min_score) & (offs != pick)
            score = tl.where(live, score, float("nan"))
        tl.store(work_ptr + offs, score, mask=inside)
        candidate = tl.where(live, score, float("-inf"))
        top = tl.max(candidate, 0)
        first = tl.min(tl.where(live & (candidate == top), offs, end), 0)
        better = (first < end) & ((best == end) | (top > best_score))
        best_score = tl.where(better, top, best_score)
        best = tl.where(better, first, best)
    return best_score, best


@triton.jit
def _soft_nms_kernel(
    boxes_ptr, scores_ptr, work_ptr, starts_ptr, positions_ptr, picked_ptr, counts_ptr, n,
    iou_threshold, sigma, min_score, offset,
    METHOD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    segment = tl.program_id(0)
    start = tl.load(starts_ptr + segment)
    end = tl.load(starts_ptr + segment + 1)
    zero = tl.zeros([], tl.float32)
    score, best = _soft_pass(
        boxes_ptr, scores_ptr, work_ptr, start, end, end, zero, zero, zero, zero, zero,
        iou_threshold, sigma, min_score, offset, METHOD=METHOD, DECAY=False, BLOCK=BLOCK,
    )  # fmt: skip
    slot = start
    while best < end:
        tl.store(positions_ptr + slot, best)
        tl.store(picked_ptr + slot, score)
        slot += 1
        px1, py1, px2, py2 = _load_box(boxes_ptr, best, True)
        p_area = _area(px1, py1, px2, py2, offset)
        tl.debug_barrier()
        score, best = _soft_pass(
            boxes_ptr, work_ptr, work_ptr, start, end, best, px1, py1, px2, py2, p_area,
            iou_threshold, sigma, min_score, offset, METHOD=METHOD, DECAY=True, BLOCK=BLOCK,
        )  # fmt: skip
    tl.store(counts_ptr + segment, slot - start)
    for c0 in range(slot, end, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        inside = offs < end
        tl.store(positions_ptr + offs, tl.zeros([BLOCK], tl.int64) + n, mask=inside)
        tl.store(picked_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=inside)


def soft_nms_segments(
    boxes_p, scores_p, seg_starts, iou_threshold, sigma, min_score, method, offset
):
    """Soft-NMS per segment: boxes_p (N, 4) fp32/fp16/bf16, scores_p (N,) fp32, seg_starts
    int64 (S + 1,). Returns (positions (N,) int64, scores (N,) fp32, counts (S,) int64)."""
    n = boxes_p.shape[0]
    n_segments = seg_starts.numel() - 1
    device = boxes_p.device
    work = _alloc.empty((n,), dtype=torch.float32, device=device)
    positions, picked, counts = soft_nms_outputs(n, n_segments, device)
    block = min(SOFT_BLOCK, triton.next_power_of_2(n))
    _soft_nms_kernel[(n_segments,)](
        boxes_p, scores_p, work, seg_starts, positions, picked, counts, n,
        float(iou_threshold), float(sigma), float(min_score), float(offset),
        METHOD=int(method), BLOCK=block, enable_fp_fusion=False,
    )  # fmt: skip
    return positions, picked, counts

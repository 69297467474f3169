"""NMS and soft-NMS Triton kernels and their launchers (the cores of ``fusedops.ops.nms``; the
outputs are documented in ``fusedops.ops.nms_reference``).

nms: ``_mask_kernel`` (one program per 64x64 tile of boxes, upper triangle only; with classes,
only tiles where the row block's and column block's classes meet) writes, for every box i, the
64-bit words whose bit j says IoU(i, j) > threshold for a later box j of its class. One program
(``_walk_kernel``, 8 warps) then walks the 64-box blocks in order with a bitset of removed
boxes (one word per block, in a global workspace the program alone touches): it scans 128
removed words at once for the next block holding a box not yet removed (blocks whose boxes are
all removed cost nothing more), resolves that block's boxes in parallel as a fixed point over
its 64 diagonal words (``_resolve``), writes the kept positions with a prefix sum, and OR-s the
kept rows into the removed words of the later columns (up to the end of the block's classes)
as 64 x 128 tiles, loading only kept rows' words; one barrier per block holding a kept box.
No host round trip. The old walk stepped through every box serially and, per kept box,
read-modified-wrote every later removed word in 128-word chunks, one after another.

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
#: The walk: column words OR-ed at once (a 64 x WALK_COLUMNS tile of kept rows), removed
#: words scanned at once for the next open block, warps of its one program.
WALK_COLUMNS = 128
WALK_SCAN = 128
WALK_WARPS = 8
#: Boxes per chunk of a soft-NMS pass (at most).
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
def _or(a, b):
    return a | b


@triton.jit
def _block_bits(block, n, lane):
    """(64,) bool: which of 64-box block ``block``'s boxes exist (position < n)."""
    return block * 64 + lane < n


@triton.jit
def _resolve(alive, diagonal, bit):
    """The greedy picks among a block's ``alive`` boxes (a 64-bit word): bit i is kept when no
    kept j < i of the block has bit i in its ``diagonal`` word (the (64,) row words of the
    block's own column). Jacobi fixed point of kept = alive & ~OR(kept rows): row j only holds
    bits > j, so after t rounds bits 0..t-1 are final, at most 64 rounds, usually a few, each
    one OR-reduction over the 64 rows; a fixed point is the greedy result."""
    kept = alive
    changed = alive != 0
    while changed:
        suppressed = tl.reduce(tl.where((kept & bit) != 0, diagonal, 0), 0, _or)
        update = alive & ~suppressed
        changed = update != kept
        kept = update
    return kept


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
    SCAN: tl.constexpr,
):
    lane = tl.arange(0, 64)
    bit = tl.full([64], 1, tl.int64) << lane.to(tl.int64)
    column = tl.arange(0, COLUMNS)
    scan = tl.arange(0, SCAN)
    for first in range(0, col_blocks, SCAN):
        words = first + scan
        tl.store(removed_ptr + words, tl.zeros([SCAN], tl.int64), mask=words < col_blocks)
    tl.debug_barrier()
    count = tl.zeros([], tl.int64)
    block = tl.zeros([], tl.int64)
    while block < col_blocks:
        # the next block holding a box not yet removed, among the SCAN blocks from `block`
        blocks = block + scan
        inside = blocks < col_blocks
        left = tl.minimum(tl.maximum(n - blocks * 64, 0), 64)
        valid = tl.where(left >= 64, -1, (tl.full([SCAN], 1, tl.int64) << tl.minimum(left, 63)) - 1)
        gone = tl.load(removed_ptr + blocks, mask=inside, other=0)
        open_bits = tl.where(inside, valid & ~gone, 0)
        found = tl.min(tl.where(open_bits != 0, blocks, block + SCAN), 0)
        if found < block + SCAN:
            alive = tl.sum(tl.where(blocks == found, open_bits, 0), 0)
            row0 = found * 64
            rows = row0 + lane
            live = (alive & bit) != 0
            diagonal = tl.load(mask_ptr + rows * col_blocks + found, mask=live, other=0)
            kept = _resolve(alive, diagonal, bit)
            keep = (kept & bit) != 0
            taken = keep.to(tl.int64)
            tl.store(positions_ptr + count + tl.cumsum(taken, 0) - taken, rows, mask=keep)
            count += tl.sum(taken, 0)
            end = tl.zeros([], tl.int64) + col_blocks
            if BATCHED:
                end = tl.load(col_end_ptr + found)
            # push: OR the kept rows into the removed words of the later columns
            for c0 in range(found + 1, end, COLUMNS):
                cols = c0 + column
                within = cols < end
                hits = tl.load(
                    mask_ptr + rows[:, None] * col_blocks + cols[None, :],
                    mask=keep[:, None] & within[None, :],
                    other=0,
                )
                old = tl.load(removed_ptr + cols, mask=within, other=0)
                tl.store(removed_ptr + cols, old | tl.reduce(hits, 0, _or), mask=within)
            tl.debug_barrier()
            block = found + 1
        else:
            block = block + SCAN
    for p0 in range(0, n, SCAN * 8):
        p = p0 + tl.arange(0, SCAN * 8)
        tl.store(positions_ptr + p, tl.zeros([SCAN * 8], tl.int64) + n, mask=(p >= count) & (p < n))
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
        BATCHED=batched, COLUMNS=WALK_COLUMNS, SCAN=WALK_SCAN, num_warps=WALK_WARPS,
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

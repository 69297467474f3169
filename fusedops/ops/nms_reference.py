"""The NMS family in plain, vectorised PyTorch: the CPU path and the test oracle.

Same functions and outputs as the Triton and CUDA backends (``fusedops.ops.nms`` describes the
pipeline around them); every backend computes IoU with the same operations in the same order,
so IoU, nms and the naive / linear soft-NMS are bit-identical across backends (gaussian
soft-NMS goes through exp, whose last bits differ between implementations: its scores agree
within float rounding, and two picks whose scores are that close may come in either order):

    area  = (x2 - x1 + offset) * (y2 - y1 + offset)
    inter = max(min(x2a, x2b) - max(x1a, x1b) + offset, 0) * (same for y)
    iou   = inter / ((area_a + area_b) - inter)

in float32 (float64 for float64 boxes). A zero union gives NaN: for hard NMS a NaN IoU never
suppresses (as torchvision); soft-NMS counts it as 0.

- ``nms_walk(boxes_p, classes_p, iou_threshold, offset) -> (positions, count)``: greedy NMS over
  boxes in processing order (decreasing score; with classes, grouped by class, each group in
  decreasing score). positions: int64 (N,), the kept positions in increasing order, then N;
  count: int64 0-dim.
- ``soft_nms_segments(boxes_p, scores_p, seg_starts, iou_threshold, sigma, min_score, method,
  offset) -> (positions, scores, counts)``: soft-NMS on each segment ``[seg_starts[s],
  seg_starts[s+1])`` independently (one class each). Segment s's picks, in pick order, fill
  ``positions[seg_starts[s]:]`` (positions in processing order) and ``scores`` (their score when
  picked); the rest of the segment holds N and 0; counts: int64 (S,) picks per segment.
"""

from __future__ import annotations

import functools

import torch

from fusedops.kernels.shared.nms_plan import GAUSSIAN, NAIVE
from fusedops.ops._dtypes import compute_dtype

#: soft-NMS methods, coded as mmcv codes them.

#: Boxes resolved together by the greedy NMS (one pairwise IoU matrix of CHUNK^2 at a time).
CHUNK = 128


def one_thread_on_cpu(core):
    """Run ``core`` (whose first argument is a tensor) with one intra-op thread when its
    tensors are on the CPU. The cores are sequences of many small ops: OpenMP teams never pay
    there, and on a busy machine each parallel region costs milliseconds waiting for a thread
    (a soft-NMS step went from 0.2 ms to 5 ms with two threads on a loaded 2-core host)."""

    @functools.wraps(core)
    def run(tensor, *args):
        threads = torch.get_num_threads()
        if tensor.device.type != "cpu" or threads == 1:
            return core(tensor, *args)
        torch.set_num_threads(1)  # this thread's OpenMP setting
        try:
            return core(tensor, *args)
        finally:
            torch.set_num_threads(threads)

    return run


def areas(boxes: torch.Tensor, offset: int) -> torch.Tensor:
    """(N,) areas of (N, 4) boxes in the compute dtype."""
    return (boxes[:, 2] - boxes[:, 0] + offset) * (boxes[:, 3] - boxes[:, 1] + offset)


def coords_iou(ax1, ay1, ax2, ay2, area_a, bx1, by1, bx2, by2, area_b, offset: int):
    """IoU from coordinates and areas (broadcast), NaN where the union is 0."""
    w = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1) + offset).clamp(min=0)
    h = (torch.minimum(ay2, by2) - torch.maximum(ay1, by1) + offset).clamp(min=0)
    inter = w * h
    return inter / (area_a + area_b - inter)


def _resolve(over: torch.Tensor) -> torch.Tensor:
    """Greedy keep flags inside one chunk: ``over[i, j]`` (i < j only) says box i suppresses
    box j when kept. Iterates keep[j] = no kept i < j suppresses j to its fixed point, which is
    the greedy answer (after t rounds the first t flags are final)."""
    keep = torch.ones(over.shape[0], dtype=torch.bool, device=over.device)
    while True:
        new = ~(over & keep[:, None]).any(0)
        if torch.equal(new, keep):
            return keep
        keep = new


def _greedy_keep(boxes: torch.Tensor, iou_threshold: float, offset: int) -> torch.Tensor:
    """Keep flags of greedy NMS on ``boxes`` (N, 4), already in decreasing score order.

    Boxes are resolved CHUNK at a time (a dense IoU matrix inside the chunk); the chunk's kept
    boxes then suppress the remaining ones, comparing only pairs that overlap along x (found by
    a sweep over x1; pairs that do not overlap have IoU 0 or NaN, never > a threshold >= 0)."""
    n = boxes.shape[0]
    keep = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    alive = torch.ones(n, dtype=torch.bool, device=boxes.device)  # neither kept nor suppressed
    coords = [c.contiguous() for c in boxes.unbind(1)]  # 1-D: small ops stay single-threaded
    coords.append(areas(boxes, offset))
    x1, x2_end = _x_extent(boxes, offset)
    rest = torch.arange(n, device=boxes.device)  # alive positions in score order
    by_x = torch.argsort(x1, stable=True)  # alive positions in x1 order
    while rest.numel():
        head = rest[:CHUNK]
        box = [c.index_select(0, head) for c in coords]
        over = coords_iou(*(c[:, None] for c in box), *box, offset) > iou_threshold
        kept = head[_resolve(over.triu_(1))]
        keep[kept] = True
        alive[head] = False
        by_x = by_x[alive[by_x]]
        if by_x.numel():
            if iou_threshold >= 0:
                k, r = _x_overlapping_pairs(kept, by_x, x1, x2_end)
            else:  # every pair may pass a negative threshold
                k = kept[:, None].expand(-1, by_x.numel()).reshape(-1)
                r = by_x[None, :].expand(kept.numel(), -1).reshape(-1)
            iou = coords_iou(
                *(c.index_select(0, k) for c in coords),
                *(c.index_select(0, r) for c in coords),
                offset,
            )
            alive[r[iou > iou_threshold]] = False
        rest = rest[CHUNK:]
        rest = rest[alive[rest]]
    return keep


def _x_extent(boxes: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x1 and a bound just above x2 + offset, in float64: boxes a, b can only have a positive
    intersection width if x1_b < x2_end_a and x1_a < x2_end_b."""
    x1 = boxes[:, 0].double()
    return x1, torch.nextafter(boxes[:, 2].double() + offset, x1.new_tensor(torch.inf))


def _x_overlapping_pairs(a, b_by_x, x1, x2_end):
    """Pairs (i, j), i from positions ``a``, j from positions ``b_by_x`` (sorted by x1), whose
    x ranges overlap: x1_i <= x1_j < x2_end_i, or x1_j < x1_i < x2_end_j. Each pair once."""
    a = a[torch.argsort(x1[a], stable=True)]
    xa, xb = x1[a], x1[b_by_x]
    owner, at = _ranges(
        torch.searchsorted(xb, xa, side="left"), torch.searchsorted(xb, x2_end[a], side="left")
    )
    owner2, at2 = _ranges(
        torch.searchsorted(xa, xb, side="right"),
        torch.searchsorted(xa, x2_end[b_by_x], side="left"),
    )
    return torch.cat((a[owner], a[at2])), torch.cat((b_by_x[at], b_by_x[owner2]))


def _ranges(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (owner, value) with lo[owner] <= value < hi[owner]. (Built with searchsorted, not
    repeat_interleave, whose CPU kernel wakes every OpenMP thread however small it is.)"""
    counts = (hi - lo).clamp(min=0)
    ends = torch.cumsum(counts, 0)
    slots = torch.arange(int(ends[-1]) if ends.numel() else 0, device=lo.device)
    owner = torch.searchsorted(ends, slots, right=True)
    return owner, lo[owner] + slots - (ends - counts)[owner]


@one_thread_on_cpu
def nms_walk(
    boxes_p: torch.Tensor, classes_p: torch.Tensor | None, iou_threshold: float, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS in processing order (see the module docstring)."""
    n = boxes_p.shape[0]
    boxes = boxes_p.to(compute_dtype(boxes_p.dtype))
    if classes_p is None:
        keep = _greedy_keep(boxes, iou_threshold, offset)
    else:
        keep = torch.ones(n, dtype=torch.bool, device=boxes.device)  # a box alone in its class
        _, lengths = torch.unique_consecutive(classes_p, return_counts=True)
        start = 0
        for length in lengths.tolist():
            if length > 1:
                keep[start : start + length] = _greedy_keep(
                    boxes[start : start + length], iou_threshold, offset
                )
            start += length
    kept = torch.nonzero(keep).flatten()
    positions = torch.full((n,), n, dtype=torch.int64, device=boxes.device)
    positions[: kept.numel()] = kept
    return positions, torch.tensor(kept.numel(), dtype=torch.int64, device=boxes.device)


def soft_weight(iou: torch.Tensor, iou_threshold: float, sigma: float, method: int):
    """The factor a pick multiplies an overlapping box's score by (NaN IoU counts as 0)."""
    iou = torch.where(iou.isnan(), 0.0, iou)
    if method == GAUSSIAN:
        return torch.exp(-(iou * iou) / sigma)
    decayed = torch.zeros_like(iou) if method == NAIVE else 1.0 - iou
    return torch.where(iou >= iou_threshold, decayed, 1.0)


@one_thread_on_cpu
def soft_nms_segments(
    boxes_p: torch.Tensor,
    scores_p: torch.Tensor,
    seg_starts: torch.Tensor,
    iou_threshold: float,
    sigma: float,
    min_score: float,
    method: int,
    offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft-NMS on every segment at once: each step picks the best box of every segment that
    has boxes left (highest score, lowest position on ties), decays the rest of that segment
    and drops what falls below min_score (see the module docstring for the outputs). A box
    scored NaN is never picked (dropped from the start, as the kernels drop it)."""
    n = boxes_p.shape[0]
    n_segments = seg_starts.numel() - 1
    boxes = boxes_p.to(scores_p.dtype)
    # the boxes in play, compacted after every step: rows x1 y1 x2 y2 area score; 1-D tensors
    # and few ops per step (small ops stay single-threaded: no OpenMP wake-ups)
    scored = torch.nonzero(~scores_p.isnan()).flatten()
    state = torch.stack((*boxes.unbind(1), areas(boxes, offset), scores_p)).index_select(1, scored)
    pos = scored
    segment = torch.searchsorted(seg_starts[1:], pos, right=True)
    picks = [(pos[:0], state[5, :0], segment[:0])]  # no picks at all when every score is NaN
    while pos.numel():
        picked, pick_of = _picks(state[5], segment, n_segments)
        picks.append((pos[picked], state[5, picked], segment[picked]))
        iou = coords_iou(*state[:5, pick_of], *state[:5], offset)
        state[5] *= soft_weight(iou, iou_threshold, sigma, method)
        alive = state[5] >= min_score
        alive[picked] = False
        rows = torch.nonzero(alive).flatten()
        state, pos, segment = state.index_select(1, rows), pos[rows], segment[rows]
    return _by_segment(picks, seg_starts, n, scores_p.dtype)


def _by_segment(picks, seg_starts, n, dtype):
    """The outputs from the steps' (positions, scores, segments): each segment's picks in pick
    order from its start, then n / 0; and the counts per segment."""
    pos, score, segment = (torch.cat(parts) for parts in zip(*picks))
    order = torch.sort(segment, stable=True).indices  # per segment, in pick order
    segment = segment[order]
    rank = torch.arange(segment.numel(), device=segment.device)
    slots = seg_starts[segment] + rank - torch.searchsorted(segment, segment)
    out_pos = torch.full((n,), n, dtype=torch.int64, device=seg_starts.device)
    out_score = torch.zeros(n, dtype=dtype, device=seg_starts.device)
    out_pos[slots], out_score[slots] = pos[order], score[order]
    counts = torch.zeros(seg_starts.numel() - 1, dtype=torch.int64, device=seg_starts.device)
    return out_pos, out_score, counts.scatter_add_(0, segment, torch.ones_like(segment))


def _picks(score: torch.Tensor, segment: torch.Tensor, n_segments: int):
    """(picks, pick_of): the local indices of every segment's pick (best score, first on
    ties) and, broadcastable over the boxes, the pick of each box's segment."""
    if n_segments == 1:
        picked = torch.argmax(score).reshape(1)
        return picked, picked
    m = score.shape[0]
    best = score.new_full((n_segments,), -torch.inf).scatter_reduce(
        0, segment, score, "amax", include_self=True
    )
    candidates = torch.where(score == best[segment], torch.arange(m, device=score.device), m)
    first = torch.full((n_segments,), m, dtype=torch.int64, device=score.device)
    first = first.scatter_reduce(0, segment, candidates, "amin", include_self=True)
    return first[first < m], first[segment]

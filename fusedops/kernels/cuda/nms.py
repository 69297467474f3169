"""NMS and soft-NMS on the CUDA extension: allocates outputs and workspaces, calls nms.cu's
launchers (algorithms in nms.cu; outputs as in ``fusedops.ops.nms_reference``)."""

from __future__ import annotations

import functools

import torch

from fusedops import _alloc
from fusedops.kernels.cuda.build import library
from fusedops.kernels.shared.nms_plan import block_column_end, nms_walk_buffers, soft_nms_outputs


def nms_walk(boxes_p: torch.Tensor, classes_p: torch.Tensor | None, iou_threshold, offset):
    """Greedy NMS over boxes_p (N, 4) CUDA fp32/fp16/bf16 in processing order; classes_p int64
    (N,) grouped, or None. Returns (positions (N,) int64, count 0-dim int64)."""
    n = boxes_p.shape[0]
    col_end = None if classes_p is None else block_column_end(classes_p, n)
    mask, positions, count = nms_walk_buffers(n, boxes_p.device)
    library().nms_walk(
        boxes_p, classes_p, col_end, mask, positions, count, float(iou_threshold), float(offset)
    )
    return positions, count


@functools.cache
def _shared_items(device: torch.device) -> int:
    """Boxes of a soft-NMS segment that fit in one block's shared memory on ``device``."""
    return library().soft_nms_shared_items(torch.empty(0, device=device))


def soft_nms_segments(
    boxes_p, scores_p, seg_starts, iou_threshold, sigma, min_score, method, offset
):
    """Soft-NMS per segment: boxes_p (N, 4) CUDA fp32/fp16/bf16, scores_p (N,) fp32, seg_starts
    int64 (S + 1,). Returns (positions (N,) int64, scores (N,) fp32, counts (S,) int64)."""
    n = boxes_p.shape[0]
    n_segments = seg_starts.numel() - 1
    device = boxes_p.device
    # launch configuration: the longest segment (one host synchronisation with several classes)
    longest = n if n_segments == 1 else int(seg_starts.diff().max())
    workspace = None
    if longest > _shared_items(device):
        workspace = _alloc.empty((7 * n,), dtype=torch.float32, device=device)
    positions, picked, counts = soft_nms_outputs(n, n_segments, device)
    library().soft_nms_segments(
        boxes_p, scores_p.contiguous(), seg_starts, longest, workspace, positions, picked,
        counts, float(iou_threshold), float(sigma), float(min_score), int(method), float(offset),
    )  # fmt: skip
    return positions, picked, counts

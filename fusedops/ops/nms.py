"""The NMS family: nms, batched_nms (torchvision), nms_normal, soft_nms (mmcv), batched_soft_nms.

Boxes are (x1, y1, x2, y2); IoU is computed in float32 for float32/float16/bfloat16 boxes
(float64 for float64 boxes, reference backend only); ``nms_reference`` gives the exact formula.

- nms: greedy in decreasing score order (ties: lower index first); a box is suppressed by a
  kept box when their IoU > iou_threshold (strict). batched_nms: boxes of different ``idxs``
  never suppress each other.
- soft-NMS: each step picks the highest current score (ties: lower index first), emits it with
  that score, and multiplies every other remaining box of its class by ``1 - iou`` (linear) or
  ``0`` (naive) when ``iou >= iou_threshold``, or by ``exp(-iou^2 / sigma)`` (gaussian, every
  box); boxes whose score falls below min_score are dropped. The first pick of each class is
  emitted whatever its score (as mmcv's first pick). Results are in decreasing final score
  order (ties: lower index first); batched_soft_nms is soft_nms per class, merged that way.
- NaN scores raise ValueError (the check rides on the one host synchronisation the result's
  size needs anyway). Inside the ops every backend gives count -1 and soft-NMS never picks a
  NaN-scored box (the picks of the other boxes stay well defined; no backend loops or fails).

Static and data-dependent parts. The custom ops have outputs of fixed shape, so they have fake
implementations, run under torch.compile / torch.export and have XLA lowerings
(``fusedops/xla/fused/nms.py``)::

    fusedops::nms(boxes, scores, idxs?, iou_threshold, offset) -> (keep (N,) int64, count)
    fusedops::soft_nms(boxes, scores, idxs?, iou_threshold, sigma, min_score, method, offset)
        -> (inds (N,) int64, scores (N,) float, count)

keep / inds hold the result then -1; count (0-dim int64) is the result's length, or -1 when a
score is NaN. The public functions read count (a host synchronisation) and slice; on CUDA
that is the only one, except in fusedops::soft_nms with idxs (batched_soft_nms), which also
synchronises to find the classes (and, on the cuda backend, the largest one). Inside the ops,
sorting and index plumbing are torch ops shared by every backend; the backends (reference,
triton, cuda) provide the two cores ``nms_walk`` and ``soft_nms_segments``
(``nms_reference`` documents them). On CUDA/Triton, nms builds the IoU > threshold bitmask in
64-bit words (one program per 64x64 tile) and one program walks it on the device; soft-NMS runs
one block/program per class, argmax and decay on the device every step.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): inside the
custom ops the reference's vectorised PyTorch cores (form (a) with no namespace of its own,
docs/contract.md); in plain eager mode ``nms``/``batched_nms`` call torchvision's compiled
``torch.ops.torchvision.nms`` where torchvision loads (``_native_nms``, form (b)), else the
custom op.
"""

from __future__ import annotations

import functools
import numbers

import torch

from fusedops import dispatch
from fusedops.kernels.shared import nms_plan
from fusedops.ops import nms_reference
from fusedops.ops._checks import FLOAT_DTYPES, check_same_device, check_tensor
from fusedops.ops._define import define_op
from fusedops.ops._dtypes import compute_dtype
from fusedops.ops._eager import eager_fast_path

__all__ = ["nms", "batched_nms", "nms_normal", "soft_nms", "batched_soft_nms"]

SOFT_NMS_METHODS = {
    "naive": nms_plan.NAIVE,
    "linear": nms_plan.LINEAR,
    "gaussian": nms_plan.GAUSSIAN,
}
INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
NAN_MESSAGE = "scores contains NaN; NMS needs an order of the scores (remove or replace NaNs)"

for _name in ("nms", "soft_nms"):
    dispatch.register_op(
        _name,
        nms_reference,
        kernels="nms",
    )


# ------------------------------------------------------------------------------------------
# Static pipelines shared by every backend (sort, group by class, map positions to indices).


def _with_sentinel(t: torch.Tensor, value: int) -> torch.Tensor:
    return torch.cat((t, t.new_full((1,), value)))


def _nms_forward(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
    offset: int,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    n = boxes.shape[0]
    impl = dispatch.select("nms", boxes, backend=backend)
    if n == 0:
        empty = boxes.new_empty((0,), dtype=torch.int64)
        return empty, boxes.new_zeros((), dtype=torch.int64)
    # where a NaN sorts is not the same everywhere (CUDA's radix sort orders NaNs by their sign
    # bit, pytorch#190781): the NaN check reads the scores, not the sorted values
    order = torch.sort(scores, descending=True, stable=True).indices
    if idxs is None:
        positions, count = impl.nms_walk(boxes[order], None, iou_threshold, offset)
        keep = _with_sentinel(order, -1)[positions]
    else:
        # group by class, each group in decreasing score order; rank = position in `order`
        classes_p, rank = torch.sort(idxs[order], stable=True)
        positions, count = impl.nms_walk(boxes[order[rank]], classes_p, iou_threshold, offset)
        kept_ranks = torch.sort(_with_sentinel(rank, n)[positions]).values
        keep = _with_sentinel(order, -1)[kept_ranks]
    return keep, torch.where(scores.isnan().any(), -1, count)


def _nms_fake(boxes, scores, idxs, iou_threshold, offset, backend=None):
    return boxes.new_empty((boxes.shape[0],), dtype=torch.int64), boxes.new_empty(
        (), dtype=torch.int64
    )


NMS = define_op("nms", forward=_nms_forward, fake=_nms_fake)


def _soft_nms_forward(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
    sigma: float,
    min_score: float,
    method: int,
    offset: int,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = boxes.shape[0]
    impl = dispatch.select("soft_nms", boxes, backend=backend)
    score_dtype = compute_dtype(boxes.dtype)
    if n == 0:
        empty = boxes.new_empty((0,), dtype=torch.int64)
        zero = boxes.new_zeros((), dtype=torch.int64)
        return empty, boxes.new_empty((0,), dtype=score_dtype), zero
    if idxs is None:
        order = torch.arange(n, device=boxes.device)
        seg_starts = torch.arange(0, n + 1, n, device=boxes.device)  # [0, n], made on the device
        boxes_p, scores_p = boxes, scores.to(score_dtype)
    else:
        classes_p, order = torch.sort(idxs, stable=True)
        first = torch.ones(n, dtype=torch.bool, device=boxes.device)
        first[1:] = classes_p[1:] != classes_p[:-1]
        # where the classes start: nonzero's size is data-dependent (a host synchronisation)
        seg_starts = _with_sentinel(torch.nonzero(first).flatten(), n)
        boxes_p, scores_p = boxes[order], scores[order].to(score_dtype)
    positions, picked, counts = impl.soft_nms_segments(
        boxes_p, scores_p, seg_starts, iou_threshold, sigma, min_score, method, offset
    )
    inds = _with_sentinel(order, -1)[positions]
    count = counts.sum()
    if seg_starts.numel() > 2:  # merge the classes: decreasing score, then lower index
        inds, picked = _merge_by_score(inds, picked, count)
    return inds, picked, torch.where(scores.isnan().any(), -1, count)


def _merge_by_score(inds: torch.Tensor, picked: torch.Tensor, count: torch.Tensor):
    """inds/picked: per-class picks (-1 elsewhere) -> all picks by decreasing score, ties by
    lower index, then -1 / 0."""
    n = inds.shape[0]
    slot = torch.where(inds >= 0, inds, n)  # scatter into index space: index order for free
    score_at = picked.new_zeros(n + 1).scatter_(0, slot, picked)[:n]
    emitted_at = torch.zeros(n + 1, dtype=torch.bool, device=inds.device)
    emitted_at = emitted_at.scatter_(0, slot, True)[:n]
    by_score = torch.sort(score_at, descending=True, stable=True).indices
    order = by_score[torch.sort(~emitted_at[by_score], stable=True).indices]
    valid = torch.arange(n, device=inds.device) < count
    return torch.where(valid, order, -1), torch.where(valid, score_at[order], 0)


def _soft_nms_fake(
    boxes, scores, idxs, iou_threshold, sigma, min_score, method, offset, backend=None
):
    n = boxes.shape[0]
    score_dtype = compute_dtype(boxes.dtype)
    return (
        boxes.new_empty((n,), dtype=torch.int64),
        boxes.new_empty((n,), dtype=score_dtype),
        boxes.new_empty((), dtype=torch.int64),
    )


SOFT_NMS = define_op("soft_nms", forward=_soft_nms_forward, fake=_soft_nms_fake)


# ------------------------------------------------------------------------------------------
# Input checks.


def _check_boxes_scores(boxes, scores, idxs=None, batched=False):
    check_tensor(boxes, "boxes", FLOAT_DTYPES)
    check_tensor(scores, "scores", FLOAT_DTYPES)
    if batched:
        check_tensor(idxs, "idxs", INDEX_DTYPES)
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {tuple(boxes.shape)}")
    n = boxes.shape[0]
    if scores.shape != (n,):
        raise ValueError(f"scores must have shape ({n},) like boxes, got {tuple(scores.shape)}")
    if batched and idxs.shape != (n,):
        raise ValueError(f"idxs must have shape ({n},) like boxes, got {tuple(idxs.shape)}")
    check_same_device(boxes, "boxes", scores=scores, idxs=idxs)
    boxes, scores = boxes.detach().contiguous(), scores.detach().contiguous()
    if batched:
        idxs = idxs.detach().to(torch.int64).contiguous()
    return boxes, scores, idxs


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value != value:
        raise ValueError(f"{name} must not be NaN")
    return float(value)


def _integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _offset(value) -> int:
    offset = _integer(value, "offset")
    if offset not in (0, 1):
        raise ValueError(f"offset must be 0 or 1, got {offset}")
    return offset


def _soft_options(iou_threshold, sigma, min_score, method, offset):
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, got {type(method).__name__}")
    if method not in SOFT_NMS_METHODS:
        known = ", ".join(repr(m) for m in SOFT_NMS_METHODS)
        raise ValueError(f"unknown soft-NMS method {method!r}; choose one of {known}")
    sigma = _number(sigma, "sigma")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    thr, low = _number(iou_threshold, "iou_threshold"), _number(min_score, "min_score")
    return thr, sigma, low, SOFT_NMS_METHODS[method], _offset(offset)


def _length(count: torch.Tensor, size: int) -> int:
    """The result's length from an op's count: the one host synchronisation. Count -1 (a NaN
    score) raises ValueError in eager mode; in a compiled graph a failed check is a
    RuntimeError whichever check raises it, and torch._check is the one Dynamo traces in
    every supported torch (torch 2.11's Dynamo has no handler for torch._check_with, added by
    pytorch#181552: the graph broke there, and fullgraph=True failed)."""
    n = count.item()
    if torch.compiler.is_compiling():
        torch._check(n >= 0, lambda: NAN_MESSAGE)
    elif n < 0:
        raise ValueError(NAN_MESSAGE)
    torch._check(n <= size)
    return n


# ------------------------------------------------------------------------------------------
# Native: torchvision's compiled NMS where it is installed (the op the nms hook replaces).


@functools.cache
def torchvision_nms():
    """``torch.ops.torchvision.nms`` (torchvision's C++/CUDA kernel) where torchvision is
    installed and its ops load with this torch, else None. The hooks patch torchvision's Python
    functions, never this op, so calling it cannot come back into fusedops."""
    try:
        import torchvision  # noqa: F401  (registers torch.ops.torchvision)

        return torch.ops.torchvision.nms
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None


def _native_nms(boxes, scores, idxs, iou_threshold, backend):
    """Plain eager ``nms``/``batched_nms`` on the native pick through torchvision's op (float32
    or float64 boxes and scores of one dtype; batched: one call per class, as torchvision's own
    batched_nms does past 4k boxes on a CPU, so boxes of different classes never interact), or
    None where the custom op (the reference's vectorised PyTorch) must run instead. Kept
    indices in decreasing score order, ties by index (a stable sort of the kept scores)."""
    if not eager_fast_path(boxes, scores, idxs):  # compiled/traced: the custom op (no import)
        return None
    op = torchvision_nms()
    if (
        op is None
        or boxes.dtype not in (torch.float32, torch.float64)
        or scores.dtype != boxes.dtype
        or dispatch.pick("nms", boxes, backend=backend) != "native"
    ):
        return None
    if bool(scores.isnan().any()):
        raise ValueError(NAN_MESSAGE)
    if idxs is None:
        kept = op(boxes, scores, iou_threshold)
    else:
        keep_mask = torch.zeros_like(scores, dtype=torch.bool)
        for label in torch.unique(idxs):
            members = torch.nonzero(idxs == label).flatten()
            keep_mask[members[op(boxes[members], scores[members], iou_threshold)]] = True
        kept = torch.nonzero(keep_mask).flatten()
    return kept[torch.sort(scores[kept], descending=True, stable=True).indices]


# ------------------------------------------------------------------------------------------
# Public functions.


def nms(
    boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, *, backend: str | None = None
) -> torch.Tensor:
    """Non-maximum suppression, as ``torchvision.ops.nms``.

    boxes: (N, 4) float32/float16/bfloat16 (float64 on the reference backend), (x1, y1, x2, y2);
    scores: (N,) any float dtype, same device. Returns int64 (K,) indices of the kept boxes in
    decreasing score order (ties: lower index first). A box is dropped when its IoU with a kept,
    higher-scoring box is > iou_threshold. NaN scores raise ValueError.
    backend: "cuda" | "triton" | "native" | "reference" to force one (default: the dispatch rule).
    """
    boxes, scores, _ = _check_boxes_scores(boxes, scores)
    return _hard_nms(boxes, scores, None, iou_threshold, backend)


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """NMS per category, as ``torchvision.ops.batched_nms``: boxes with different ``idxs``
    (N,) integers never suppress each other. Returns int64 (K,) kept indices in decreasing
    score order (ties: lower index first). Other arguments as :func:`nms`.
    """
    boxes, scores, idxs = _check_boxes_scores(boxes, scores, idxs, batched=True)
    return _hard_nms(boxes, scores, idxs, iou_threshold, backend)


def _hard_nms(boxes, scores, idxs, iou_threshold, backend: str | None) -> torch.Tensor:
    """``nms`` (idxs None) and ``batched_nms`` on checked boxes and scores: torchvision's op on
    the native backend in eager mode, else the custom op; int64 (K,) kept indices."""
    thr = _number(iou_threshold, "iou_threshold")
    native = _native_nms(boxes, scores, idxs, thr, backend)
    if native is not None:
        return native
    keep, count = NMS(boxes, scores, idxs, thr, 0, backend)
    return keep[: _length(count, keep.shape[0])]


def nms_normal(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    offset: int = 0,
    score_threshold: float = 0,
    max_num: int = -1,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NMS as ``mmcv.ops.nms``: returns ``(dets, inds)``, dets (K, 5) = kept boxes with their
    score appended (dtype of ``torch.cat`` of the two), inds int64 (K,) in decreasing score
    order. offset: 0 or 1 (added to widths and heights). score_threshold > 0: only boxes with
    score > score_threshold take part. max_num > 0: at most that many results. dets is built
    by indexing boxes and scores, so it carries their autograd history (as mmcv's).
    """
    options = (iou_threshold, offset, score_threshold, max_num)
    return nms_with_options(boxes, scores, None, *options, backend=backend)


def nms_with_options(
    boxes, scores, idxs, iou_threshold, offset=0, score_threshold=0, max_num=-1, *, backend=None
):
    """:func:`nms_normal` with optional ``idxs`` (categories that never suppress each other;
    None: one category). Returns ``(dets, inds)`` as nms_normal."""
    batched = idxs is not None
    checked_boxes, checked_scores, idxs = _check_boxes_scores(boxes, scores, idxs, batched)
    thr, offset = _number(iou_threshold, "iou_threshold"), _offset(offset)
    score_threshold = _number(score_threshold, "score_threshold")
    max_num = _integer(max_num, "max_num")
    valid = None
    if score_threshold > 0:
        if checked_scores.isnan().any():
            raise ValueError(NAN_MESSAGE)
        valid = torch.nonzero(checked_scores > score_threshold).flatten()
        checked_boxes, checked_scores = checked_boxes[valid], checked_scores[valid]
        idxs = idxs[valid] if batched else None
    keep, count = NMS(checked_boxes, checked_scores, idxs, thr, offset, backend)
    inds = keep[: _length(count, keep.shape[0])]
    if max_num > 0:
        inds = inds[:max_num]
    if valid is not None:
        inds = valid[inds]
    return torch.cat((boxes[inds], scores[inds].reshape(-1, 1)), dim=1), inds


def _soft(boxes, scores, idxs, options, backend):
    inds, picked, count = SOFT_NMS(boxes, scores, idxs, *options, backend)
    k = _length(count, inds.shape[0])
    inds = inds[:k]
    dtype = torch.promote_types(boxes.dtype, scores.dtype)
    return torch.cat((boxes[inds].to(dtype), picked[:k, None].to(dtype)), dim=1), inds


def soft_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float = 0.3,
    sigma: float = 0.5,
    min_score: float = 1e-3,
    method: str = "linear",
    offset: int = 0,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft-NMS as ``mmcv.ops.soft_nms`` (on CPU and GPU): returns ``(dets, inds)``, dets
    (K, 5) = picked boxes with their decayed score (dtype: promotion of boxes' and scores'),
    inds int64 (K,) in decreasing final score order. method: "naive", "linear" or "gaussian";
    sigma > 0 (gaussian); boxes whose score falls below min_score are dropped; offset 0 or 1.
    Scores are computed in float32 (float64 for float64 boxes). NaN scores raise ValueError.
    On CUDA (cuda and triton backends) it synchronises with the host once: reading the result's
    length (which also checks for NaN); the reference backend steps on the host.
    """
    boxes, scores, _ = _check_boxes_scores(boxes, scores)
    options = _soft_options(iou_threshold, sigma, min_score, method, offset)
    return _soft(boxes, scores, None, options, backend)


def batched_soft_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float = 0.3,
    sigma: float = 0.5,
    min_score: float = 1e-3,
    method: str = "linear",
    offset: int = 0,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft-NMS per category in one call (one kernel launch for all classes): the union of
    :func:`soft_nms` on each class of ``idxs`` (N,) integers, in decreasing final score order
    (ties: lower index first). Returns ``(dets, inds)`` as :func:`soft_nms`.
    On CUDA it synchronises with the host to find the classes (``torch.nonzero`` over the
    sorted ``idxs``), on the cuda backend once more for the largest class's size (the kernel's
    shared memory), and once to read the result's length.
    """
    boxes, scores, idxs = _check_boxes_scores(boxes, scores, idxs, batched=True)
    options = _soft_options(iou_threshold, sigma, min_score, method, offset)
    return _soft(boxes, scores, idxs, options, backend)

"""The NMS family against brute-force oracles (plain loops in numpy float32), mmcv's golden
soft-NMS case, every backend available here, the static ops (compile, export, XLA)."""

from pathlib import Path

import numpy as np
import pytest
import torch

import fusedops
from fusedops import dispatch
from fusedops.ops import nms as nms_ops
from fusedops.ops import nms_reference
from fusedops.testing import non_contiguous, run_python, unit_roundoff
from tests.op_testing import BACKENDS, DEVICE, KERNEL_BACKENDS

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

METHODS = ["naive", "linear", "gaussian"]
BOX_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ------------------------------------------------------------------------------------------
# Inputs and oracles.


def random_boxes(n, overlap="heavy", dtype=torch.float32, device=DEVICE, seed=None):
    """(boxes (n, 4), scores (n,)): "heavy": jittered around a few centres; "none": disjoint
    cells of a grid; "some": uniform positions and sizes."""
    if seed is None:  # from the global generator (seeded per test by conftest): reproducible
        seed = int(torch.randint(2**31, (1,), device="cpu"))
    g = torch.Generator().manual_seed(seed)
    if overlap == "none":
        side = max(1, int(np.ceil(np.sqrt(n))))
        cell = torch.arange(n)
        xy = torch.stack((cell % side, cell // side), 1).double() * 10
        wh = 1 + 8 * torch.rand(n, 2, generator=g, dtype=torch.float64)
    elif overlap == "heavy":
        centres = torch.rand(max(1, n // 20), 2, generator=g, dtype=torch.float64) * 100
        wh = 10 + 20 * torch.rand(n, 2, generator=g, dtype=torch.float64)
        pick = torch.randint(0, centres.shape[0], (n,), generator=g)
        xy = centres[pick] + 3 * torch.randn(n, 2, generator=g, dtype=torch.float64) - wh / 2
    else:
        xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 200
        wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 40
    boxes = torch.cat((xy, xy + wh), 1).to(dtype)
    scores = torch.rand(n, generator=g, dtype=torch.float64).float()
    return boxes.to(device), scores.to(device)


def _order(scores):
    s = scores.double().cpu().numpy()
    return np.array(sorted(range(len(s)), key=lambda i: (-s[i], i)), dtype=np.int64)


def _areas(b, off):
    return (b[:, 2] - b[:, 0] + off) * (b[:, 3] - b[:, 1] + off)


def _iou_with(b, area, i, js, off):
    w = np.maximum(np.minimum(b[i, 2], b[js, 2]) - np.maximum(b[i, 0], b[js, 0]) + off, 0)
    h = np.maximum(np.minimum(b[i, 3], b[js, 3]) - np.maximum(b[i, 1], b[js, 1]) + off, 0)
    inter = (w * h).astype(np.float32)
    with np.errstate(all="ignore"):
        return inter / (area[i] + area[js] - inter)


def _classes(idxs, n):
    return np.zeros(n, np.int64) if idxs is None else idxs.cpu().numpy()


def oracle_nms(boxes, scores, thr, idxs=None, offset=0):
    """Greedy NMS, one box at a time in decreasing score order (ties: lower index first)."""
    b = boxes.float().cpu().numpy()
    n, off = len(b), np.float32(offset)
    cls, order, area = _classes(idxs, n), _order(scores), _areas(b, off)
    removed, keep = np.zeros(n, bool), []
    for at, i in enumerate(order):
        if removed[i]:
            continue
        keep.append(int(i))
        later = order[at + 1 :]
        hit = (_iou_with(b, area, i, later, off) > np.float32(thr)) & (cls[later] == cls[i])
        removed[later[hit]] = True
    return keep


def oracle_soft_nms(boxes, scores, thr, sigma, min_score, method, idxs=None, offset=0):
    """Soft-NMS per class as mmcv's loop, one pick at a time; (indices, scores) merged by
    decreasing score then index."""
    b = boxes.float().cpu().numpy()
    n, off = len(b), np.float32(offset)
    cls, area = _classes(idxs, n), _areas(b, off)
    score = scores.float().cpu().numpy().copy()
    picks = []
    for c in np.unique(cls):
        alive = np.nonzero(cls == c)[0]
        while alive.size:
            i = alive[np.argmax(score[alive])]  # first of the best
            picks.append((int(i), float(score[i])))
            alive = alive[alive != i]
            iou = np.nan_to_num(_iou_with(b, area, i, alive, off), nan=0.0)
            if method == "gaussian":
                weight = np.exp(-(iou * iou) / np.float32(sigma))
            else:
                decayed = np.float32(0) if method == "naive" else np.float32(1) - iou
                weight = np.where(iou >= np.float32(thr), decayed, np.float32(1))
            score[alive] = (score[alive] * weight).astype(np.float32)
            alive = alive[score[alive] >= np.float32(min_score)]
    picks.sort(key=lambda p: (-p[1], p[0]))
    return [p[0] for p in picks], [p[1] for p in picks]


#: Soft-NMS scores are products of decay factors; gaussian ones go through exp, whose last
#: bits differ between implementations (Triton's GPU exp is approximate, ~2 ulp; CUDA's expf
#: and torch's exp differ by an ulp): a pick decayed k times carries k + 1 roundings of a
#: factor, each within this many unit roundoffs of fp32 (the exp's error and the multiply's).
ULPS_PER_FACTOR = 8


def soft_score_rtol(factors: int) -> float:
    """Relative bound between two implementations' scores of a box decayed ``factors``
    times (its initial score times ``factors`` factors, each rounded)."""
    return ULPS_PER_FACTOR * unit_roundoff(torch.float32) * (factors + 1)


def check_gaussian_picks(got, want, min_score, classes=None):
    """Gaussian soft-NMS picks ``got`` against ``want`` (each a list of (index, score) in
    decreasing score order), compared as far as the math fixes them: per class, the picks
    agree one by one (scores within :func:`soft_score_rtol` of the number of factors, the
    pick's rank in its class) until the first step that is ambiguous, where the two picks'
    scores are within that bound of each other (a tie with the runner-up) or of min_score (a
    box kept by one and dropped by the other); beyond it the order may differ. ``classes``:
    index -> class (None: one class). Returns the number of picks compared."""
    for picks in (got, want):
        scores = [s for _, s in picks]
        assert scores == sorted(scores, reverse=True), "picks not in decreasing score order"
    compared = 0
    for c in sorted({classes[i] if classes else 0 for i, _ in got + want}):
        mine = [p for p in got if (classes[p[0]] if classes else 0) == c]
        theirs = [p for p in want if (classes[p[0]] if classes else 0) == c]
        for k in range(max(len(mine), len(theirs))):
            rtol = soft_score_rtol(k)
            g, w = (p[k] if k < len(p) else None for p in (mine, theirs))
            if g is not None and w is not None and g[0] == w[0]:
                assert abs(g[1] - w[1]) <= rtol * abs(w[1]), (
                    f"class {c} pick {k} (box {g[0]}): score {g[1]!r} vs {w[1]!r}, rtol {rtol:g}"
                )
                compared += 1
                continue
            scores = [p[1] for p in (g, w) if p is not None]
            tie = len(scores) == 2 and abs(scores[0] - scores[1]) <= 2 * rtol * max(scores)
            at_floor = any(abs(s - min_score) <= 2 * rtol * min_score for s in scores)
            assert tie or at_floor, (
                f"class {c} pick {k}: {g} vs {w}, not a tie or at min_score {min_score} "
                f"within rtol {rtol:g}"
            )
            break
    return compared


def check_soft(dets, inds, boxes, expected, method=None, min_score=None, idxs=None):
    """Picks and scores against the oracle's: exactly in order, scores within 1e-6; for the
    gaussian method (not bit-identical across backends, see kernels/triton/nms.py) as
    :func:`check_gaussian_picks` allows (``min_score``, ``idxs`` the classes or None)."""
    want_inds, want_scores = expected
    got = inds.tolist()
    assert inds.dtype == torch.int64 and dets.shape[1:] == (5,)
    torch.testing.assert_close(dets[:, :4].cpu(), boxes[inds].to(dets.dtype).cpu())
    scores = dets[:, 4].double().cpu()
    if method != "gaussian":
        assert got == want_inds and dets.shape[0] == len(want_inds)
        want = torch.tensor(want_scores, dtype=torch.float64)
        # a pick's score went through at most len(want) - 1 decay factors
        torch.testing.assert_close(scores, want, atol=0, rtol=soft_score_rtol(len(want)))
        return
    classes = None if idxs is None else idxs.tolist()
    check_gaussian_picks(list(zip(got, scores.tolist())), list(zip(*expected)), min_score, classes)


# ------------------------------------------------------------------------------------------
# nms / batched_nms


@pytest.mark.parametrize("n", [1, 7, 64, 65, 1000, 5000])
@pytest.mark.parametrize("overlap", ["heavy", "none"])
def test_reference_equals_brute_force(n, overlap):
    boxes, scores = random_boxes(n, overlap, device="cpu")
    keep = fusedops.nms(boxes, scores, 0.5, backend="reference")
    assert keep.dtype == torch.int64 and keep.tolist() == oracle_nms(boxes, scores, 0.5)
    idxs = torch.randint(0, 5, (n,))
    keep = fusedops.batched_nms(boxes, scores, idxs, 0.5, backend="reference")
    assert keep.tolist() == oracle_nms(boxes, scores, 0.5, idxs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 7, 64, 65, 130])
def test_backends_equal_brute_force(backend, n):
    boxes, scores = random_boxes(n, "some")
    for thr in (0.3, 0.7):
        assert fusedops.nms(boxes, scores, thr, backend=backend).tolist() == oracle_nms(
            boxes, scores, thr
        )
    idxs = torch.randint(0, 4, (n,), device=DEVICE)
    keep = fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)
    assert keep.tolist() == oracle_nms(boxes, scores, 0.5, idxs)


def chain_boxes(n, device=DEVICE):
    """(boxes, scores) of n boxes 10 wide on a line, box k at x = k: IoU 9/11 with the next box
    and 8/12 with the one after, so at threshold 0.75 each box can only suppress its neighbours
    and the greedy picks depend on the whole chain before them (64 rounds of the walk's fixed
    point per block). Scores fall along the chain in steps shared by pairs of boxes (ties) and
    the indices are a random permutation of the chain (ties are broken by index)."""
    g = torch.Generator().manual_seed(int(torch.randint(2**31, (1,))))
    x = torch.arange(n, dtype=torch.float32)
    boxes = torch.stack((x, torch.zeros(n), x + 10, torch.ones(n)), 1)
    scores = 1 - (torch.arange(n) // 2).float() / n
    perm = torch.randperm(n, generator=g)
    return boxes[perm].to(device), scores[perm].to(device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_suppression_chains_and_ties_across_blocks(backend):
    """Greedy picks that depend on a chain through every box, over blocks of 64 and a last
    partial block (the walk resolves a block's boxes as a fixed point), with equal scores."""
    boxes, scores = chain_boxes(150)
    assert fusedops.nms(boxes, scores, 0.75, backend=backend).tolist() == oracle_nms(
        boxes, scores, 0.75
    )
    idxs = (torch.arange(150, device=DEVICE) * 7 % 3).to(torch.int64)
    keep = fusedops.batched_nms(boxes, scores, idxs, 0.75, backend=backend)
    assert keep.tolist() == oracle_nms(boxes, scores, 0.75, idxs)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_kernel_walk_equals_reference_walk(backend):
    """The kernels' nms_walk (positions and count, sentinels included) against the
    reference's on boxes in processing order: 200 boxes (a partial last block), heavy
    overlap, one class and classes whose runs straddle block boundaries."""
    boxes, _ = random_boxes(200, "heavy")
    impl = dispatch.select("nms", boxes, backend=backend)
    classes = torch.sort(torch.randint(0, 5, (200,), device=DEVICE)).values
    for classes_p, offset in ((None, 0), (classes, 1)):
        got = impl.nms_walk(boxes, classes_p, 0.4, offset)
        want = nms_reference.nms_walk(boxes, classes_p, 0.4, offset)
        assert torch.equal(got[0], want[0]) and int(got[1]) == int(want[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", BOX_DTYPES[1:])
def test_half_precision_boxes_compute_iou_in_fp32(backend, dtype):
    boxes, scores = random_boxes(97, "heavy", dtype=dtype)
    keep = fusedops.nms(boxes, scores.to(dtype), 0.5, backend=backend)
    assert keep.tolist() == oracle_nms(boxes.float(), scores.to(dtype), 0.5)
    idxs = torch.randint(0, 3, (97,), device=DEVICE, dtype=torch.int32)
    keep = fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)
    assert keep.tolist() == oracle_nms(boxes.float(), scores, 0.5, idxs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_score_ties_keep_the_lower_index_first(backend):
    boxes, scores = random_boxes(80, "heavy")
    scores = (scores * 4).round() / 4  # five distinct values
    keep = fusedops.nms(boxes, scores, 0.4, backend=backend)
    assert keep.tolist() == oracle_nms(boxes, scores, 0.4)
    same = torch.tensor([[0, 0, 10, 10]] * 3, dtype=torch.float32, device=DEVICE)
    ones = torch.ones(3, device=DEVICE)
    assert fusedops.nms(same, ones, 0.5, backend=backend).tolist() == [0]
    groups = torch.tensor([1, 0, 1], device=DEVICE)
    assert fusedops.batched_nms(same, ones, groups, 0.5, backend=backend).tolist() == [0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_threshold_is_strict_and_degenerate_boxes_never_suppress(backend):
    # IoU([0,0,4,1], [0,0,2,1]) = 2 / 4 exactly
    boxes = torch.tensor([[0, 0, 4, 1], [0, 0, 2, 1]], dtype=torch.float32, device=DEVICE)
    scores = torch.tensor([0.9, 0.8], device=DEVICE)
    assert fusedops.nms(boxes, scores, 0.5, backend=backend).tolist() == [0, 1]
    assert fusedops.nms(boxes, scores, 0.49, backend=backend).tolist() == [0]
    # zero-area boxes: IoU 0/0 is NaN, which suppresses nothing (as torchvision)
    flat = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [2, 2, 2, 5], [0, 0, 3, 3]], device=DEVICE)
    flat_scores = torch.tensor([0.9, 0.8, 0.7, 0.6], device=DEVICE)
    assert fusedops.nms(flat.float(), flat_scores, 0.1, backend=backend).tolist() == [0, 1, 2, 3]
    boxes, scores = random_boxes(70, "heavy")
    boxes[::3, 2] = boxes[::3, 0]  # zero width
    assert fusedops.nms(boxes, scores, 0.3, backend=backend).tolist() == oracle_nms(
        boxes, scores, 0.3
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offset", [0, 1])
def test_nms_normal_offset_score_threshold_and_max_num(backend, offset):
    boxes, scores = random_boxes(90, "heavy")
    boxes = boxes.round()  # integer pixel boxes, where mmcv's offset 1 is meant
    dets, inds = fusedops.nms_normal(boxes, scores, 0.3, offset=offset, backend=backend)
    assert inds.tolist() == oracle_nms(boxes, scores, 0.3, offset=offset)
    assert torch.equal(dets, torch.cat((boxes[inds], scores[inds, None]), 1))
    valid = torch.nonzero(scores > 0.5).flatten()
    expected = valid[oracle_nms(boxes[valid], scores[valid], 0.3, offset=offset)][:4]
    dets, inds = fusedops.nms_normal(
        boxes, scores, 0.3, offset=offset, score_threshold=0.5, max_num=4, backend=backend
    )
    assert inds.tolist() == expected.tolist() and dets.shape == (len(expected), 5)


def test_empty_inputs_give_empty_int64_results():
    boxes, scores = torch.empty(0, 4, device=DEVICE), torch.empty(0, device=DEVICE)
    idxs = torch.empty(0, dtype=torch.int64, device=DEVICE)
    for backend in BACKENDS:
        for keep in (
            fusedops.nms(boxes, scores, 0.5, backend=backend),
            fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend),
        ):
            assert keep.shape == (0,) and keep.dtype == torch.int64
        for dets, inds in (
            fusedops.nms_normal(boxes, scores, 0.5, backend=backend),
            fusedops.soft_nms(boxes, scores, backend=backend),
            fusedops.batched_soft_nms(boxes, scores, idxs, backend=backend),
        ):
            assert dets.shape == (0, 5) and inds.shape == (0,) and inds.dtype == torch.int64


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs(backend):
    boxes, scores = random_boxes(40, "heavy")
    strided_scores = non_contiguous(scores[:, None])[:, 0]
    keep = fusedops.nms(non_contiguous(boxes), strided_scores, 0.5, backend=backend)
    assert keep.tolist() == oracle_nms(boxes, scores, 0.5)
    assert fusedops.nms(boxes.t().contiguous().t(), scores, 0.5, backend=backend).tolist() == (
        keep.tolist()
    )


# ------------------------------------------------------------------------------------------
# soft-NMS

GOLDEN_BOXES = [[6, 3, 8, 7], [3, 6, 9, 11], [3, 7, 10, 12], [1, 4, 13, 7]]
GOLDEN = {  # mmcv's own test: thr 0.3, sigma 0.5, min_score 0.01
    "linear": ([1, 0, 2, 3], [0.9, 0.6, 0.29024392, 0.2]),
    "gaussian": ([1, 0, 2, 3], [0.9, 0.59630775, 0.35275510, 0.18650459]),
    "naive": ([1, 0, 3], [0.9, 0.6, 0.2]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_soft_nms_mmcv_golden_case(backend, method):
    boxes = torch.tensor(GOLDEN_BOXES, dtype=torch.float32, device=DEVICE)
    scores = torch.tensor([0.6, 0.9, 0.7, 0.2], device=DEVICE)
    dets, inds = fusedops.soft_nms(boxes, scores, 0.3, 0.5, 0.01, method, backend=backend)
    check_soft(dets, inds, boxes, GOLDEN[method], method, 0.01)
    one_class = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    dets, inds = fusedops.batched_soft_nms(
        boxes, scores, one_class, 0.3, 0.5, 0.01, method, backend=backend
    )
    check_soft(dets, inds, boxes, GOLDEN[method], method, 0.01)
    if method == "gaussian":  # all 4 picks compared: no ambiguous step in mmcv's case
        assert (
            check_gaussian_picks(
                list(zip(inds.tolist(), dets[:, 4].tolist())), list(zip(*GOLDEN[method])), 0.01
            )
            == 4
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("offset", [0, 1])
def test_soft_nms_equals_the_loop(backend, method, offset):
    n = 150 if backend == "reference" else 40
    boxes, scores = random_boxes(n, "heavy")
    options = (0.3, 0.5, 0.05, method, offset)
    dets, inds = fusedops.soft_nms(boxes, scores, *options, backend=backend)
    expected = oracle_soft_nms(boxes, scores, *options[:4], offset=offset)
    check_soft(dets, inds, boxes, expected, method, options[2])
    idxs = torch.randint(0, 3, (n,), device=DEVICE)
    dets, inds = fusedops.batched_soft_nms(boxes, scores, idxs, *options, backend=backend)
    expected = oracle_soft_nms(boxes, scores, *options[:4], idxs=idxs, offset=offset)
    check_soft(dets, inds, boxes, expected, method, options[2], idxs)


def test_check_gaussian_picks_allows_only_ambiguous_divergence():
    u = unit_roundoff(torch.float32)
    want = [(3, 0.9), (1, 0.5), (4, 0.5 * (1 - u)), (0, 0.2), (2, 0.01 * (1 + 2 * u))]
    assert check_gaussian_picks(want, want, 0.01) == 5
    near = [(i, s * (1 + 4 * u)) for i, s in want]  # within the bound of 1 factor
    assert check_gaussian_picks(near, want, 0.01) == 5
    with pytest.raises(AssertionError, match="score"):  # beyond the bound of 1 factor
        check_gaussian_picks([(3, 0.9 * (1 + 40 * u)), *want[1:]], want, 0.01)
    tie = [want[0], (4, 0.5), (1, 0.5 * (1 - u)), *want[3:]]  # 1 and 4 tie: order free beyond
    assert check_gaussian_picks(tie, want, 0.01) == 1
    with pytest.raises(AssertionError, match="not a tie"):  # 0.3 vs 0.2 is no tie
        check_gaussian_picks([*want[:3], (2, 0.3), (0, want[4][1])], want, 0.01)
    assert check_gaussian_picks(want[:4], want, 0.01) == 4  # box 2 at min_score: dropped
    with pytest.raises(AssertionError, match="not a tie"):  # box 0 is far above min_score
        check_gaussian_picks(want[:3], want, 0.01)
    classes = {3: 0, 1: 1, 4: 0, 0: 1, 2: 1}  # per class, the merged order across is free
    assert check_gaussian_picks(tie, want, 0.01, classes) == 5
    with pytest.raises(AssertionError, match="decreasing"):
        check_gaussian_picks(want[::-1], want, 0.01)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_gaussian_soft_nms_kernels_against_reference(backend):
    """200 boxes, min_score 1e-3: picks decayed up to ~100 times, compared as
    check_gaussian_picks allows (one class, and three)."""
    boxes, scores = random_boxes(200, "heavy")
    idxs = torch.randint(0, 3, (200,), device=DEVICE)
    for run, args in (
        (fusedops.soft_nms, (boxes, scores)),
        (fusedops.batched_soft_nms, (boxes, scores, idxs)),
    ):
        picks = []
        for b in ("reference", backend):
            dets, inds = run(*args, 0.3, 0.5, 1e-3, "gaussian", backend=b)
            torch.testing.assert_close(dets[:, :4], boxes[inds])
            picks.append(list(zip(inds.tolist(), dets[:, 4].tolist())))
        classes = args[2].tolist() if len(args) == 3 else None
        assert check_gaussian_picks(picks[1], picks[0], 1e-3, classes) > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_soft_nms_first_pick_is_kept_below_min_score_and_dtypes(backend):
    boxes, scores = random_boxes(30, "none", dtype=torch.bfloat16)
    low = scores * 1e-3  # every score below min_score: only each class's first pick stays
    dets, inds = fusedops.soft_nms(boxes, low, min_score=0.01, backend=backend)
    assert inds.tolist() == [int(torch.argmax(low))] and dets.dtype == torch.float32
    idxs = torch.arange(30, device=DEVICE) % 2
    low = low.bfloat16()
    dets, inds = fusedops.batched_soft_nms(boxes, low, idxs, min_score=0.01, backend=backend)
    firsts = [int(torch.argmax(torch.where(idxs == c, low.float(), -1))) for c in (0, 1)]
    assert sorted(inds.tolist()) == sorted(firsts) and dets.dtype == torch.bfloat16


def test_batched_soft_nms_is_soft_nms_per_class():
    boxes, scores = random_boxes(120, "heavy", device="cpu")
    idxs = torch.randint(0, 4, (120,))
    dets, inds = fusedops.batched_soft_nms(boxes, scores, idxs, method="gaussian")
    merged = []
    for c in range(4):
        members = torch.nonzero(idxs == c).flatten()
        d, i = fusedops.soft_nms(boxes[members], scores[members], method="gaussian")
        merged += [(float(s), int(members[k])) for s, k in zip(d[:, 4], i)]
    merged.sort(key=lambda p: (-p[0], p[1]))
    assert inds.tolist() == [k for _, k in merged]


# ------------------------------------------------------------------------------------------
# NaN scores and bad inputs.


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_scores_raise_value_error(backend):
    boxes, scores = random_boxes(20, "heavy")
    scores[7] = float("nan")
    idxs = torch.zeros(20, dtype=torch.int64, device=DEVICE)
    calls = [
        lambda: fusedops.nms(boxes, scores, 0.5, backend=backend),
        lambda: fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend),
        lambda: fusedops.nms_normal(boxes, scores, 0.5, backend=backend),
        lambda: fusedops.nms_normal(boxes, scores, 0.5, score_threshold=0.1, backend=backend),
        lambda: fusedops.soft_nms(boxes, scores, backend=backend),
        lambda: fusedops.batched_soft_nms(boxes, scores, idxs, backend=backend),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="scores contains NaN"):
            call()


def test_nan_check_does_not_depend_on_where_sort_puts_nans(monkeypatch):
    """CUDA's radix sort puts a NaN with the sign bit set last in a descending sort
    (pytorch#190781), CPU's first: with a sort that puts NaNs last, NaN scores still raise."""
    real_sort = torch.sort

    def nans_last(t, *args, descending=False, **kwargs):
        if not (descending and t.is_floating_point()):
            return real_sort(t, *args, descending=descending, **kwargs)
        key = torch.where(t.isnan(), -torch.inf, t)
        indices = real_sort(key, *args, descending=True, **kwargs).indices
        return torch.return_types.sort((t[indices], indices))

    monkeypatch.setattr(torch, "sort", nans_last)
    boxes, scores = random_boxes(20, "heavy")
    scores[7], scores[11] = float("nan"), -float("nan")
    idxs = torch.zeros(20, dtype=torch.int64, device=DEVICE)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="scores contains NaN"):
            fusedops.nms(boxes, scores, 0.5, backend=backend)
        with pytest.raises(ValueError, match="scores contains NaN"):
            fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)


def _nan_case(device=DEVICE):
    """Two boxes of two classes, the second scored NaN (the review's case)."""
    boxes = torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30]], dtype=torch.float32, device=device)
    scores = torch.tensor([0.9, float("nan")], device=device)
    return boxes, scores, torch.tensor([0, 1], device=device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_scores_with_several_classes_raise_value_error(backend):
    """batched_soft_nms with a NaN score in a class of its own, and in a class shared with
    others: ValueError, and the op's count is -1 with the other classes' picks the same on
    every backend (a NaN-scored box is never picked)."""
    boxes, scores, idxs = _nan_case()
    with pytest.raises(ValueError, match="scores contains NaN"):
        fusedops.batched_soft_nms(boxes, scores, idxs, backend=backend)
    with pytest.raises(ValueError, match="scores contains NaN"):
        fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)
    many, many_scores = random_boxes(40, "heavy")
    many_scores[[3, 17]] = float("nan")
    many_idxs = torch.arange(40, device=DEVICE) % 3
    for args in ((boxes, scores, idxs), (many, many_scores, many_idxs)):
        inds, picked, count = nms_ops.SOFT_NMS(*args, 0.3, 0.5, 1e-3, 1, 0, backend)
        want = nms_ops.SOFT_NMS(*(a.cpu() for a in args), 0.3, 0.5, 1e-3, 1, 0, "reference")
        assert count.item() == -1
        assert torch.equal(inds.cpu(), want[0]) and torch.equal(picked.cpu(), want[1])
        assert not torch.isin(torch.nonzero(args[1].isnan()).flatten().cpu(), want[0]).any()


def _bounded_while_loop(limit):
    """lax.while_loop as a Python loop of at most ``limit`` steps (eager jax): a lowering that
    would not terminate fails instead of hanging the test."""

    def while_loop(cond, body, state):
        for _ in range(limit):
            if not bool(cond(state)):
                return state
            state = body(state)
        raise AssertionError(f"the soft-NMS while_loop runs past {limit} steps")

    return while_loop


def test_xla_soft_nms_lowering_stops_at_nan_scores(monkeypatch):
    """The lowering of fusedops::soft_nms with a NaN score (the review's case with every
    method, and 12 boxes in one class): every box is picked or dropped within N steps, count is
    -1 and the picks are the reference's."""
    jax = pytest.importorskip("jax")
    from types import SimpleNamespace

    from jax import lax

    from fusedops.xla import lower
    from fusedops.xla.fused import nms as xla_nms

    lowering = lower.LOWERINGS[torch.ops.fusedops.soft_nms.default]
    many, many_scores = random_boxes(12, "heavy", device="cpu")
    many_scores[[0, 7]] = float("nan")
    cases = [(*_nan_case("cpu"), m) for m in (0, 1, 2)] + [(many, many_scores, None, 2)]
    for boxes, scores, idxs, method in cases:
        n = boxes.shape[0]
        patched = SimpleNamespace(while_loop=_bounded_while_loop(n + 1), fori_loop=lax.fori_loop)
        monkeypatch.setattr(xla_nms, "lax", patched)
        with jax.enable_x64(True):  # as inside fusedops' XLA programs
            args = [
                None if t is None else jax.numpy.asarray(t.numpy()) for t in (boxes, scores, idxs)
            ]
            inds, picked, count = lowering(*args, 0.3, 0.5, 1e-3, method, 0)
        assert int(count) == -1
        want = nms_ops.SOFT_NMS(boxes, scores, idxs, 0.3, 0.5, 1e-3, method, 0, "reference")
        assert np.array_equal(np.asarray(inds), want[0].numpy())


BOXES = torch.zeros(3, 4)
SCORES = torch.zeros(3)
IDXS = torch.zeros(3, dtype=torch.int64)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fusedops.nms(BOXES[:, :3], SCORES, 0.5), ValueError, "boxes must have shape"),
        (lambda: fusedops.nms(BOXES[0], SCORES, 0.5), ValueError, "boxes must have shape"),
        (lambda: fusedops.nms(BOXES.long(), SCORES, 0.5), TypeError, "boxes has dtype"),
        (lambda: fusedops.nms([[0, 0, 1, 1]], SCORES, 0.5), TypeError, "boxes must be a torch"),
        (lambda: fusedops.nms(BOXES, SCORES[:2], 0.5), ValueError, "scores must have shape"),
        (lambda: fusedops.nms(BOXES, SCORES[:, None], 0.5), ValueError, "scores must have"),
        (lambda: fusedops.nms(BOXES, SCORES.int(), 0.5), TypeError, "scores has dtype"),
        (lambda: fusedops.nms(BOXES, SCORES, "0.5"), TypeError, "iou_threshold must be a num"),
        (lambda: fusedops.nms(BOXES, SCORES, None), TypeError, "iou_threshold must be a num"),
        (lambda: fusedops.nms(BOXES, SCORES, float("nan")), ValueError, "iou_threshold must not"),
        (lambda: fusedops.nms(BOXES, SCORES, torch.tensor(0.5)), TypeError, "iou_threshold"),
        (lambda: fusedops.batched_nms(BOXES, SCORES, IDXS.float(), 0.5), TypeError, "idxs has"),
        (lambda: fusedops.batched_nms(BOXES, SCORES, IDXS.bool(), 0.5), TypeError, "idxs has"),
        (lambda: fusedops.batched_nms(BOXES, SCORES, None, 0.5), TypeError, "idxs must be a"),
        (lambda: fusedops.batched_nms(BOXES, SCORES, IDXS[:2], 0.5), ValueError, "idxs must"),
        (lambda: fusedops.batched_nms(BOXES, SCORES, IDXS, [0.5]), TypeError, "iou_threshold"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, method="hard"), ValueError, "method 'hard'"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, method=1), TypeError, "method must be a str"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, sigma=0.0), ValueError, "sigma must be > 0"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, sigma=-1), ValueError, "sigma must be > 0"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, min_score="x"), TypeError, "min_score must"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, offset=2), ValueError, "offset must be 0 or 1"),
        (lambda: fusedops.soft_nms(BOXES, SCORES, offset=0.5), TypeError, "offset must be an"),
        (lambda: fusedops.batched_soft_nms(BOXES, SCORES, IDXS, sigma=0), ValueError, "sigma"),
        (lambda: fusedops.nms_normal(BOXES, SCORES, 0.5, max_num=1.5), TypeError, "max_num"),
        (lambda: fusedops.nms_normal(BOXES, SCORES, 0.5, score_threshold="a"), TypeError, "score"),
        (lambda: fusedops.nms(BOXES, SCORES, 0.5, backend="gpu"), ValueError, "unknown backend"),
    ],
)
def test_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_mismatched_devices_are_named():
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="scores is on meta but boxes is on cpu"):
        fusedops.nms(BOXES, SCORES.to(meta), 0.5)
    with pytest.raises(ValueError, match="idxs is on meta but boxes is on cpu"):
        fusedops.batched_nms(BOXES, SCORES, IDXS.to(meta), 0.5)
    with pytest.raises(ValueError, match="idxs is on meta"):
        fusedops.batched_soft_nms(BOXES, SCORES, IDXS.to(meta))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal message")
def test_forced_cuda_on_cpu_lists_reasons():
    with pytest.raises(fusedops.BackendUnavailableError, match="backend 'cuda'"):
        fusedops.nms(BOXES, SCORES, 0.5, backend="cuda")


# ------------------------------------------------------------------------------------------
# The static ops: torch.compile, opcheck, export, XLA, info.


def test_torch_compile_fullgraph():
    boxes, scores = random_boxes(60, "heavy", device="cpu")
    idxs = torch.randint(0, 3, (60,))

    def post(boxes, scores, idxs):
        keep = fusedops.batched_nms(boxes, scores, idxs, 0.5)
        dets, inds = fusedops.soft_nms(boxes, scores, method="gaussian")
        return keep, dets, inds, fusedops.nms(boxes, scores, 0.5)

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(post, fullgraph=True, backend="aot_eager")
        got = compiled(boxes, scores, idxs)
        for a, b in zip(got, post(boxes, scores, idxs)):
            assert torch.equal(a, b)
        scores[5] = float("nan")  # compiled, the failed check is a RuntimeError on count >= 0
        with pytest.raises((ValueError, RuntimeError), match="NaN|>= 0"):
            compiled(boxes, scores, idxs)


def test_opcheck():
    boxes, scores = random_boxes(30, "heavy", device="cpu")
    idxs = torch.randint(0, 3, (30,))
    for classes in (None, idxs):
        torch.library.opcheck(
            torch.ops.fusedops.nms.default, (boxes, scores, classes, 0.5, 0, None)
        )
        torch.library.opcheck(
            torch.ops.fusedops.soft_nms.default,
            (boxes, scores, classes, 0.3, 0.5, 0.01, 1, 1, None),
        )


def test_torch_export_keeps_the_custom_ops():
    class Post(torch.nn.Module):
        def forward(self, boxes, scores):
            keep, count = nms_ops.NMS.op(boxes, scores, None, 0.5, 0, None)
            inds, picked, n = nms_ops.SOFT_NMS.op(boxes, scores, None, 0.3, 0.5, 0.01, 2, 0, None)
            return keep, count, inds, picked, n

    boxes, scores = random_boxes(25, "heavy", device="cpu")
    exported = torch.export.export(Post(), (boxes, scores))
    graph = str(exported.graph)
    assert "fusedops.nms.default" in graph and "fusedops.soft_nms.default" in graph
    for a, b in zip(exported.module()(boxes, scores), Post()(boxes, scores)):
        assert torch.equal(a, b)


def test_static_ops_lower_into_one_xla_program():
    pytest.importorskip("jax")
    from fusedops.xla import partial_trace

    boxes, scores = random_boxes(40, "heavy", device="cpu")
    idxs = torch.randint(0, 3, (40,))

    def post(boxes, scores, idxs):
        keep, count = torch.ops.fusedops.nms(boxes, scores, idxs, 0.5, 1, None)
        inds, picked, n = torch.ops.fusedops.soft_nms(boxes, scores, None, 0.3, 0.5, 0.01, 1, 0)
        return keep, count, inds, picked, n

    traced = partial_trace(post, fullgraph=True)
    for a, b in zip(traced(boxes, scores, idxs), post(boxes, scores, idxs)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert traced.stats.regions == 1 and traced.stats.programs == 1


def test_info_lists_the_ops(capsys):
    from fusedops.__main__ import info

    assert info() == 0
    rows = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert {"nms", "soft_nms"} <= rows


# ------------------------------------------------------------------------------------------
# GPU: kernels on large inputs, torchvision parity.


def _quantised_boxes(n, seed):
    """Boxes on a 1/8 grid with sides <= 64: every IoU operation but the division is exact,
    so any correct implementation (with or without fused multiply-adds) agrees exactly."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 4096, (n, 2), generator=g) / 8
    wh = torch.randint(1, 512, (n, 2), generator=g) / 8
    scores = torch.randperm(n, generator=g) / n  # distinct: no order left to tie-breaking
    return torch.cat((xy, xy + wh), 1).cuda(), scores.cuda()


@pytest.mark.gpu
def test_cuda_equals_torchvision_on_10k_boxes():
    torchvision = pytest.importorskip("torchvision")
    boxes, scores = _quantised_boxes(10_000, 0)
    for thr in (0.3, 0.5, 0.7):
        expected = torchvision.ops.nms(boxes, scores, thr)
        for backend in KERNEL_BACKENDS:
            assert torch.equal(fusedops.nms(boxes, scores, thr, backend=backend), expected)
    for classes in (1, 80):
        idxs = torch.randint(0, classes, (10_000,), device="cuda")
        expected = torchvision.ops.batched_nms(boxes, scores, idxs, 0.5)
        for backend in KERNEL_BACKENDS:
            keep = fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)
            assert torch.equal(keep, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5000, 20000])
def test_cuda_kernels_equal_reference_on_large_inputs(n):
    boxes, scores = random_boxes(n, "heavy", device="cuda", seed=n)
    idxs = torch.randint(0, 80, (n,), device="cuda")
    expected = fusedops.nms(boxes.cpu(), scores.cpu(), 0.5, backend="reference")
    expected_b = fusedops.batched_nms(boxes.cpu(), scores.cpu(), idxs.cpu(), 0.5)
    for backend in KERNEL_BACKENDS:
        assert torch.equal(fusedops.nms(boxes, scores, 0.5, backend=backend).cpu(), expected)
        keep = fusedops.batched_nms(boxes, scores, idxs, 0.5, backend=backend)
        assert torch.equal(keep.cpu(), expected_b)
    fusedops.nms(boxes, scores, 0.5)
    assert fusedops.dispatch.last_used["nms"] == "cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [3000, 12000])
@pytest.mark.parametrize("method", METHODS)
def test_cuda_soft_nms_equals_reference(n, method):
    """12000 boxes in one class exceed a block's shared memory (the workspace path); 3000
    boxes with many dropped exercise the compaction. The reference runs on the GPU too.
    gaussian scores are products of thousands of exp factors whose last bits differ between
    implementations: there the picks are compared as check_gaussian_picks allows (in order
    until the first tie or min_score crossing within the factors' bound), elsewhere in order
    and exactly."""
    boxes, scores = random_boxes(n, "heavy", device="cuda", seed=n)
    idxs = torch.randint(0, 80, (n,), device="cuda")
    for run, args in (
        (fusedops.soft_nms, (boxes, scores)),
        (fusedops.batched_soft_nms, (boxes, scores, idxs)),
    ):
        want_dets, want = run(*args, 0.3, 0.5, 0.01, method, backend="reference")
        for backend in KERNEL_BACKENDS:
            dets, inds = run(*args, 0.3, 0.5, 0.01, method, backend=backend)
            if method == "gaussian":
                classes = args[2].tolist() if len(args) == 3 else None
                picks = [
                    list(zip(i.tolist(), d[:, 4].tolist()))
                    for i, d in ((inds, dets), (want, want_dets))
                ]
                check_gaussian_picks(*picks, 0.01, classes)
                torch.testing.assert_close(dets[:, :4], boxes[inds])
            else:  # IoU and the naive / linear decay: bit-identical on every backend
                assert torch.equal(inds, want) and torch.equal(dets, want_dets)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_soft_nms_op_does_not_synchronise(backend):
    """soft_nms's one host synchronisation is reading count in the public function: the op
    itself (one class) runs without any (no host-to-device copy of its segment bounds)."""
    boxes, scores = random_boxes(300, "heavy", device="cuda")
    args = (boxes, scores, None, 0.3, 0.5, 1e-3, 2, 0, backend)
    nms_ops.SOFT_NMS(*args)  # builds / compiles the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        inds, picked, count = nms_ops.SOFT_NMS(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert count.item() > 0


_COMPILE_TRITON_KERNELS = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fusedops.kernels.triton import nms as kernels

types = dict.fromkeys(("n", "col_blocks"), "i32")
types.update(dict.fromkeys(("iou_threshold", "offset", "sigma", "min_score"), "fp32"))
types.update(dict.fromkeys(("scores_ptr", "work_ptr", "picked_ptr"), "*fp32"))
cases = [
    (kernels._mask_kernel, "*bf16", {"BATCHED": True}),
    (kernels._walk_kernel, None, {"BATCHED": True, "COLUMNS": kernels.WALK_COLUMNS,
                                  "SCAN": kernels.WALK_SCAN}),
    (kernels._soft_nms_kernel, "*fp16", {"METHOD": 2, "BLOCK": 1024}),
]
for arch in (80, 90):
    for kernel, boxes, constants in cases:
        signature = {
            name: "constexpr" if name in constants
            else boxes if name == "boxes_ptr"
            else types.get(name, "*i64")
            for name in kernel.arg_names
        }
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
        target = GPUTarget("cuda", arch, 32)
        options = {"enable_fp_fusion": False}
        if kernel is kernels._walk_kernel:
            options["num_warps"] = kernels.WALK_WARPS
        compiled = triton.compile(source, target=target, options=options)
        assert "cubin" in compiled.asm
print("compiled")
"""


def test_triton_kernels_compile_for_sm80_and_sm90():
    """The interpreter does not type-check like the compiler does: compile every kernel to a
    cubin for sm_80 and sm_90 (Triton's own ptxas; no GPU needed) in a fresh interpreter."""
    pytest.importorskip("triton")
    done = run_python("-c", _COMPILE_TRITON_KERNELS, cwd=REPO, env={"TRITON_INTERPRET": "0"})
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_native_nms_runs_torchvisions_op_where_installed(monkeypatch):
    """The native backend (the automatic pick on CPU, forced on a GPU, where the pick is a
    kernel) calls torchvision's compiled op where torchvision loads, once for nms and once per
    class for batched_nms, with the op's semantics (kept indices by decreasing score); a
    stand-in op (our reference) plays torchvision here."""
    calls = []

    def stand_in(boxes, scores, iou_threshold):  # torchvision's greedy NMS, plainly
        calls.append(boxes.shape[0])
        b = boxes.double()
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        lo, hi = (
            torch.maximum(b[:, None, :2], b[None, :, :2]),
            torch.minimum(b[:, None, 2:], b[None, :, 2:]),
        )
        inter = (hi - lo).clamp(min=0).prod(-1)
        iou = inter / (area[:, None] + area[None, :] - inter)
        keep, dropped = [], torch.zeros(len(b), dtype=torch.bool)
        for i in torch.sort(scores, descending=True, stable=True).indices.tolist():
            if not dropped[i]:
                keep.append(i)
                dropped |= iou[i].cpu() > iou_threshold
        return torch.tensor(keep, dtype=torch.int64, device=boxes.device)

    monkeypatch.setattr(nms_ops, "torchvision_nms", lambda: stand_in)
    boxes, scores = random_boxes(300, "some", torch.float32, DEVICE)
    labels = torch.randint(0, 4, (300,), device=DEVICE)
    native = None if DEVICE.type == "cpu" else "native"  # None: the automatic pick
    got = fusedops.nms(boxes, scores, 0.5, backend=native)
    assert fusedops.dispatch.last_used["nms"] == "native" and calls == [300]
    assert torch.equal(got, fusedops.nms(boxes, scores, 0.5, backend="reference"))
    calls.clear()
    got = fusedops.batched_nms(boxes, scores, labels, 0.5, backend=native)
    assert sorted(calls) == sorted(torch.bincount(labels).tolist())
    assert torch.equal(got, fusedops.batched_nms(boxes, scores, labels, 0.5, backend="reference"))
    with pytest.raises(ValueError, match="NaN"):
        fusedops.nms(boxes, torch.where(scores > 0.9, float("nan"), scores), 0.5, backend=native)
    calls.clear()  # other dtypes and forced backends take the custom op
    fusedops.nms(boxes.half(), scores.half(), 0.5, backend=native)
    fusedops.nms(boxes, scores, 0.5, backend="reference")
    assert calls == []

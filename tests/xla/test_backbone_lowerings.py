"""Lowerings backbones and heads need (issue 13, item 4): strided scatter, the 3-D and adaptive
max pools, replication padding, grid sampling, embedding bags, complex numbers (rotary
embeddings), unfold, round(decimals), searchsorted, diagonals. Each through
``partial_trace(fullgraph=True)`` against eager, forward and (where differentiable) backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusedops.testing import random_tensor
from tests.xla.traced import check_traced, no_cpu_tune  # noqa: F401

pytest.importorskip("jax")


def R(*shape):
    return random_tensor(shape)


def _grid(n, h, w, margin=1.2):
    """A sampling grid reaching a little outside [-1, 1] (so padding modes matter)."""
    return random_tensor((n, h, w, 2), low=-margin, high=margin)


def _rope(x, freqs):
    """LLaMA's rotary embedding: pairs of x as complex numbers times unit phasors."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2)


CASES = {
    "as_strided_scatter": (
        lambda a, b: torch.as_strided_scatter(a * 2, b, (2, 3), (4, 1), 1),
        lambda: (R(4, 4), R(2, 3)),
    ),
    "as_strided_scatter-pooler": (  # Swin's pooler: adaptive_avg_pool1d on a transposed input
        lambda x: F.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1),
        lambda: (R(2, 5, 6),),
    ),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (3, 4)), lambda: (R(2, 3, 7, 9),)),
    "adaptive_max_pool2d-indices": (
        lambda x: F.adaptive_max_pool2d(x, (2, 5), return_indices=True),
        lambda: (R(3, 5, 11),),
    ),
    "adaptive_max_pool1d": (lambda x: F.adaptive_max_pool1d(x, 4), lambda: (R(2, 3, 10),)),
    "adaptive_max_pool3d": (
        lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True),
        lambda: (R(2, 2, 5, 7, 4),),
    ),
    "max_pool3d": (
        lambda x: F.max_pool3d(x, (2, 3, 2), (2, 2, 1), (1, 1, 0), return_indices=True),
        lambda: (R(2, 2, 5, 6, 4),),
    ),
    "max_pool3d-ceil-dilation": (
        lambda x: F.max_pool3d(x, 2, 2, 0, dilation=2, ceil_mode=True),
        lambda: (R(1, 2, 7, 6, 7),),
    ),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 3, 2, 1), lambda: (R(2, 2, 5, 6, 7),)),
    "avg_pool3d-ceil-no-pad-count": (
        lambda x: F.avg_pool3d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda: (R(1, 2, 5, 4, 5),),
    ),
    "adaptive_avg_pool3d": (
        lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)),
        lambda: (R(2, 2, 5, 7, 6),),
    ),
    "replication_pad1d": (lambda x: F.pad(x, (2, 3), mode="replicate"), lambda: (R(2, 3, 6),)),
    "replication_pad2d": (
        lambda x: F.pad(x, (1, 2, 3, 1), mode="replicate"),
        lambda: (R(2, 3, 5, 4),),
    ),
    "replication_pad3d": (
        lambda x: F.pad(x, (1, 0, 2, 1, 1, 2), mode="replicate"),
        lambda: (R(1, 2, 3, 4, 5),),
    ),
    "embedding_bag-mean": (
        lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"),
        lambda: (R(10, 4), torch.randint(0, 10, (9,)), torch.tensor([0, 3, 3, 7])),
    ),
    "embedding_bag-sum-weights-padding": (
        lambda w, i, o, p: F.embedding_bag(
            i, w, o, mode="sum", per_sample_weights=p, padding_idx=2
        ),  # fmt: skip
        lambda: (
            R(10, 4),
            torch.tensor([1, 2, 4, 2, 9, 0, 2, 5]),
            torch.tensor([0, 3, 6]),
            R(8),
        ),
    ),
    "embedding_bag-max-2d-input": (
        lambda w, i: F.embedding_bag(i, w, mode="max"),
        lambda: (R(10, 5), torch.randint(0, 10, (3, 4))),
    ),
    # (not scale_grad_by_freq: ATen's CPU kernel divides by the count of another index, e.g.
    # indices [3, 1, 1] scale row 3's gradient by 1/2; the lowering divides by the row's own
    # count, as documented)
    "embedding_bag-include-last-offset": (
        lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", include_last_offset=True),
        lambda: (R(10, 4), torch.tensor([1, 1, 4, 3, 1, 7]), torch.tensor([0, 2, 2, 6])),
    ),
    "view_as_complex-view_as_real-rope": (
        _rope,
        lambda: (R(2, 5, 8), torch.polar(torch.ones(5, 4), R(5, 4))),
    ),
    "polar": (lambda a, b: torch.view_as_real(torch.polar(a.abs() + 0.1, b)), lambda: (R(6), R(6))),
    "complex": (
        lambda a, b: torch.view_as_real(torch.complex(a, b) * torch.complex(b, a)),
        lambda: (R(3, 4), R(3, 4)),
    ),
    "unfold": (lambda x: x.unfold(1, 3, 2) * 2, lambda: (R(3, 9, 2),)),
    "unfold-last-overlapping": (lambda x: x.unfold(-1, 4, 1), lambda: (R(2, 7),)),
    "round-decimals": (
        lambda x: torch.round(x * 100, decimals=-1) + torch.round(x, decimals=2),
        lambda: (R(20),),
    ),  # fmt: skip
    "diagonal": (lambda x: torch.diagonal(x, 1, 0, 2) * 2, lambda: (R(4, 3, 5),)),
    "diagonal-negative-offset": (lambda x: torch.diagonal(x, -2, -1, -2), lambda: (R(2, 5, 4),)),
    "diagonal_scatter": (
        lambda a, b: torch.diagonal_scatter(a, b * 3, -1),
        lambda: (R(4, 5), R(3)),
    ),
    "diag_embed-trace": (lambda x: torch.diag_embed(x).sum(0) + torch.trace(x), lambda: (R(4, 4),)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_backbone_op_matches_eager_forward_and_backward(case):
    fn, build = CASES[case]
    check_traced(fn, *build())  # the default bound: sums of up to 2048 unit-scale terms


GRID_SAMPLE_CASES = [
    (mode, padding, (m + p) % 2 == 1)  # every mode and padding, each with both align_corners
    for m, mode in enumerate(["bilinear", "nearest", "bicubic"])
    for p, padding in enumerate(["zeros", "border", "reflection"])
] + [("bilinear", "reflection", True), ("bicubic", "reflection", True)]


@pytest.mark.parametrize(("mode", "padding_mode", "align_corners"), GRID_SAMPLE_CASES)
def test_grid_sample(mode, padding_mode, align_corners):
    def fn(x, grid):
        return F.grid_sample(x, grid, mode, padding_mode, align_corners)

    check_traced(fn, R(2, 3, 5, 6), _grid(2, 4, 3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right):
    edges = torch.sort(R(3, 6)).values
    values = R(3, 5)
    values[0, 0] = edges[0, 2]  # a tie: left and right differ

    def fn(edges, values):
        return (
            torch.searchsorted(edges, values, right=right),
            torch.searchsorted(edges[0], values, right=right, out_int32=True),
            torch.bucketize(values, edges[1], right=right),
        )

    check_traced(fn, edges, values, grad=False)


def test_searchsorted_with_a_sorter():
    sequence = R(8)
    check_traced(
        lambda s, v: torch.searchsorted(s, v, sorter=torch.argsort(s)), sequence, R(5), grad=False
    )


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d_indices_with_ties_and_nan_match_eager(ceil_mode):
    """Ties keep the first maximum of each window (row-major within it), as ATen's CPU kernel;
    a NaN is the window's maximum; padding is never picked over an input. Values on a coarse
    grid make ties in most windows; one NaN stands alone in its windows."""
    x = torch.round(R(2, 3, 9, 8) * 2) / 2
    x[0, 1, 4, 3] = float("nan")

    def fn(x):
        return F.max_pool2d(x, 3, 2, 1, ceil_mode=ceil_mode, return_indices=True)

    check_traced(fn, x, grad=False)

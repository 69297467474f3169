"""Cases PyTorch's OpInfo samples found wrong or crashing in partial_trace (issue 13, items 2
and 3): each through ``partial_trace(fullgraph=True)`` against eager, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

from fusedops.testing import random_tensor
from tests.xla.traced import check_traced, no_cpu_tune  # noqa: F401

pytest.importorskip("jax")

from fusedops.xla import partial_trace  # noqa: E402


def R(*shape, dtype=torch.float32):
    return random_tensor(shape, dtype)


# ---------------------------------------------------------------------------------- wrong numbers
@pytest.mark.parametrize(
    ("ord_", "dim"),
    [(-math.inf, None), (-math.inf, 1), (0, None), (0, 0), (1, 1), (3.5, None), (-2, 1)],
)
def test_vector_norm_orders(ord_, dim):
    x = R(4, 5)
    x[1, 2] = 0.0  # a zero: counted out by ord 0, the minimum for -inf
    grad = ord_ not in (0,) and not (ord_ < 0 and ord_ != -math.inf)
    check_traced(lambda t: torch.linalg.vector_norm(t, ord_, dim), x, grad=grad, terms=x.numel())


def test_vector_norm_minus_inf_is_the_smallest_magnitude():
    x = torch.tensor([[3.0, -0.25, 2.0], [-5.0, 4.0, 1.5]])
    out = partial_trace(lambda t: torch.linalg.vector_norm(t, float("-inf")), fullgraph=True)(x)
    assert out.item() == 0.25


# ------------------------------------------------------------------------- 0-dim tensors, dim 0
ZERO_DIM_CASES = {
    "sum": lambda t: t.sum(0),
    "sum-keepdim": lambda t: t.sum(-1, keepdim=True),
    "mean": lambda t: t.mean(-1),
    "amax": lambda t: t.amax(0),
    "amin": lambda t: t.amin(-1, keepdim=True),
    "any": lambda t: (t > 0).any(0),
    "all": lambda t: (t > 0).all(-1),
    "cumsum": lambda t: t.cumsum(0),
    "cumprod": lambda t: t.cumprod(-1),
    "max": lambda t: torch.max(t, 0),
    "min": lambda t: torch.min(t, -1, keepdim=True),
    "argmax": lambda t: t.argmax(0),
    "argmin": lambda t: t.argmin(-1, keepdim=True),
    "logsumexp": lambda t: t.logsumexp(0),
    "nansum": lambda t: t.nansum(0),
    "prod": lambda t: t.prod(0),
    "softmax": lambda t: t.softmax(0),
    "log_softmax": lambda t: t.log_softmax(-1),
    "sort": lambda t: t.sort(0),
    "topk": lambda t: t.topk(1, 0),
    "index_select": lambda t: t.index_select(0, torch.tensor([0])),
}


@pytest.mark.parametrize("case", list(ZERO_DIM_CASES))
def test_dim_reductions_on_a_0_dim_tensor(case):
    check_traced(ZERO_DIM_CASES[case], R())


@pytest.mark.parametrize("op", ["index_add", "index_copy"])
def test_index_add_and_copy_on_0_dim_tensors_forward_and_backward(op):
    def fn(x, source):
        return getattr(x, op)(0, torch.tensor([0]), source) * 2

    check_traced(fn, R(), R())


def test_squeeze_with_no_dims_squeezes_nothing():
    traced = check_traced(lambda t: torch.squeeze(t, ()) * 2, R(1, 3, 1))
    assert traced(R(1, 3, 1)).shape == (1, 3, 1)


# ----------------------------------------------------------------------------- masked assignment
def test_boolean_mask_assignment_of_a_scalar():
    def fn(y, mask):
        y = y * 1.0
        y[mask] = 7.0
        return y

    check_traced(fn, R(4, 3), torch.rand(4, 3) > 0.5)


def test_boolean_mask_assignment_of_a_row_and_accumulation():
    def fn(y, mask, row):
        y = y * 1.0
        y[mask] = row
        y.index_put_((mask,), row * 2, accumulate=True)
        return y

    row = R(3)  # constant: the gradient of a masked row is data-dependent (grad[mask].sum(0))
    check_traced(lambda y, mask: fn(y, mask, row), R(5, 3), torch.rand(5) > 0.5)


def test_gradient_through_a_masked_row_is_reported_as_data_dependent():
    from fusedops.xla import XLATraceError

    def fn(y, mask, row):
        y = y * 1.0
        y[mask] = row
        return y

    row = R(3).requires_grad_(True)
    out = partial_trace(fn, fullgraph=True)(R(5, 3), torch.rand(5) > 0.5, row)
    with pytest.raises(XLATraceError, match="data-dependent"):
        out.sum().backward()


# --------------------------------------------------------------------------------- complex dtypes
def test_conjugate_view_from_an_eager_region_crosses_into_the_next_program():
    """fullgraph=False: the first region's output is a lazy conjugate view (regenerated in
    eager by AOTAutograd); the next region's program reads it."""

    def fn(x):
        y = torch.conj(x * 2)
        torch._dynamo.graph_break()
        return y * 3

    x = torch.randn(5, dtype=torch.complex64)
    traced = partial_trace(fn)
    torch.testing.assert_close(traced(x), fn(x))
    assert traced.stats.regions == 2


def test_complex32_inputs_and_outputs():
    check_traced(lambda x: x.to(torch.complex32) * 2, R(4), grad=False, rtol=1e-3, atol=1e-3)
    half = (R(4) + 1j * R(4)).to(torch.complex32)
    check_traced(lambda z: z * 2, half, grad=False, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------- scatter_reduce mean
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce_mean(include_self, dtype):
    index = torch.tensor([[0, 0, 2, 4], [1, 3, 3, 3]])

    def fn(x, src):
        return x.scatter_reduce(1, index, src, "mean", include_self=include_self)

    if dtype == torch.int64:
        x, src = torch.randint(-9, 9, (2, 6)), torch.randint(-9, 9, (2, 4))
    else:
        x, src = R(2, 6), R(2, 4)
    check_traced(fn, x, src, grad=dtype.is_floating_point)

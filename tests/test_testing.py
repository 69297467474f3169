"""The shared test helpers themselves: poisoning and the tolerance rule."""

import math

import pytest
import torch

from fusedops import _alloc
from fusedops.testing import (
    TOLERANCES,
    assert_close,
    non_contiguous,
    poisoned_outputs,
    tolerance,
    unit_roundoff,
)


def test_poisoning_fills_outputs_and_assert_close_catches_it():
    with poisoned_outputs():
        out = _alloc.empty((3,), dtype=torch.float32, device="cpu")
        idx = _alloc.empty((2,), dtype=torch.int64, device="cpu")
    assert torch.isnan(out).all()
    assert (idx == torch.iinfo(torch.int64).max).all()
    with pytest.raises(AssertionError):
        assert_close(out, torch.zeros(3, dtype=torch.float64))


def test_poisoning_is_off_outside_the_block():
    with poisoned_outputs(False):
        assert not _alloc._poison


@pytest.mark.parametrize("poison", [False, True])
def test_empty_like_is_contiguous_in_the_asked_dtype(poison):
    """The launchers' ``_alloc.empty_like`` with poisoning off (torch.empty_like) and on: t's
    shape and device, contiguous whatever t's strides, ``dtype`` when given, no grad."""
    source = torch.randn(6, 4, dtype=torch.float16).t().requires_grad_()
    assert not source.is_contiguous()
    with poisoned_outputs(poison):
        same, wide = _alloc.empty_like(source), _alloc.empty_like(source, torch.float32)
    for out, dtype in ((same, torch.float16), (wide, torch.float32)):
        assert out.shape == source.shape and out.device == source.device
        assert out.dtype == dtype and out.is_contiguous() and not out.requires_grad
        assert out.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
        if poison:  # (unpoisoned memory may hold anything, a freed poisoned buffer too)
            assert torch.isnan(out).all()


def test_tolerance_table_covers_kernel_dtypes_and_is_ordered():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert dtype in TOLERANCES
    assert TOLERANCES[torch.float32][0] < TOLERANCES[torch.float16][0]
    assert TOLERANCES[torch.float16][0] < TOLERANCES[torch.bfloat16][0]


def test_assert_close_uses_the_dtype_tolerance():
    expected = torch.ones(4, dtype=torch.float64)
    assert_close(torch.full((4,), 1.004, dtype=torch.bfloat16), expected)
    with pytest.raises(AssertionError):
        assert_close(torch.full((4,), 1.004, dtype=torch.float32), expected)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(torch.ones(3), expected)


def test_tolerance_is_derived_from_the_unit_roundoff():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        u, u32 = torch.finfo(dtype).eps / 2, torch.finfo(torch.float32).eps / 2
        assert unit_roundoff(dtype) == u
        assert TOLERANCES[dtype] == tolerance(dtype) == (4 * (u + u32 * math.sqrt(2048)),) * 2
    rtol, atol = tolerance(torch.float16, terms=9, magnitude=10.0, compute=torch.float16)
    assert rtol == 4 * (1 + 3) * unit_roundoff(torch.float16) and atol == 10 * rtol
    assert tolerance(torch.float32, 2.0) == tuple(2 * t for t in TOLERANCES[torch.float32])
    with pytest.raises(ValueError, match="terms"):
        tolerance(torch.float32, terms=0)
    with pytest.raises(TypeError, match="dtype"):
        tolerance(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_one_ulp_at_the_magnitude_passes_and_an_off_by_one_element_fails(dtype):
    """A result one ulp from the oracle at any magnitude passes (random inputs cannot make
    the test flaky); a result shifted by one element does not."""
    expected = torch.randn(4096, dtype=torch.float64, device="cpu") * 10
    rounded = expected.to(dtype)
    one_ulp = torch.nextafter(rounded, torch.full_like(rounded, math.inf))
    assert_close(one_ulp, expected)
    with pytest.raises(AssertionError):
        assert_close(torch.roll(rounded, 1), expected)


def test_terms_and_magnitude_widen_the_bound_per_element():
    expected = torch.rand(64, dtype=torch.float64, device="cpu") + 1
    magnitude = torch.full((64,), 100.0, dtype=torch.float64, device="cpu")
    magnitude[0] = 1.0
    err = 100 * TOLERANCES[torch.float32][1] * 0.9
    off = (expected + err).float()
    off[0] = expected[0]
    assert_close(off, expected, magnitude=magnitude)
    with pytest.raises(AssertionError):
        assert_close(off, expected)
    off[0] = expected[0] + err
    with pytest.raises(AssertionError, match="elementwise bound"):
        assert_close(off, expected, magnitude=magnitude)
    nan = torch.tensor([math.nan, math.inf], dtype=torch.float64, device="cpu")
    assert_close(nan, nan.clone(), magnitude=torch.ones(2, device="cpu"))


def test_non_contiguous_view_keeps_values():
    t = torch.arange(12.0).view(3, 4)
    view = non_contiguous(t)
    assert not view.is_contiguous() and torch.equal(view, t)


def test_each_test_starts_from_the_seed_of_its_node_id(request):
    """conftest seeds torch from (session seed, node id) before each test: replayable."""
    from tests.conftest import SESSION_SEED, test_seed

    first = torch.rand(3, device="cpu")
    torch.manual_seed(test_seed(request.node.nodeid))
    assert torch.equal(first, torch.rand(3, device="cpu"))
    assert test_seed("a", SESSION_SEED) == test_seed("a") != test_seed("b")
    assert test_seed("a", 1) != test_seed("a", 2)

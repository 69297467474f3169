"""The shared test helpers themselves: poisoning and the tolerance table."""

import pytest
import torch

from fusedops import _alloc
from fusedops.testing import TOLERANCES, assert_close, non_contiguous, poisoned_outputs


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


def test_non_contiguous_view_keeps_values():
    t = torch.arange(12.0).view(3, 4)
    view = non_contiguous(t)
    assert not view.is_contiguous() and torch.equal(view, t)

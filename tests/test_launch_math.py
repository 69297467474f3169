"""fusedops.kernels.shared.launch: the launchers' int arithmetic equals Triton's own."""

from __future__ import annotations

import triton

from fusedops.kernels.shared.launch import cdiv, next_power_of_2

SIZES = [*range(0, 1100), 2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3]


def test_next_power_of_2_matches_triton():
    assert [next_power_of_2(n) for n in SIZES] == [triton.next_power_of_2(n) for n in SIZES]


def test_cdiv_matches_triton():
    for divisor in (1, 2, 3, 7, 64, 1000, 4096):
        assert [cdiv(n, divisor) for n in SIZES] == [triton.cdiv(n, divisor) for n in SIZES]


def test_plain_ints_out():
    """Plain ints (launch grids and constexprs hash them), not Triton constexpr objects."""
    assert type(next_power_of_2(49)) is int and type(cdiv(49, 8)) is int

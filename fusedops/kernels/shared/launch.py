"""Launch-configuration arithmetic for the Triton launchers, in plain Python ints.

``triton.next_power_of_2`` and ``triton.cdiv`` are ``ConstexprFunction`` objects in Triton 3.x:
called from host code each one unwraps its arguments through a generic wrapper and costs about
2-3 us a call, several times per launch. These are the same functions on non-negative ints at
a few tens of nanoseconds (issue 25: per-call host overhead).
"""

from __future__ import annotations


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n for n >= 1; 0 for n = 0 (as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for ints, b > 0 (as ``triton.cdiv``)."""
    return -(-a // b)

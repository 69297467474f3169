"""Philox4x32-10 in plain integer arithmetic: the dropout mask of ``bias_dropout_add``.

The one definition of fusedops' dropout bits, shared by the reference (torch int64 tensors)
and the XLA lowering (jax int64 arrays); the Triton kernel uses ``tl.randint4x`` and the CUDA
kernel its own ``philox4x32_10``, both bit-identical to this (tests check it).

Philox4x32-10 (Salmon et al., SC'11; the variant of Random123, curand and Triton): key
``(k0, k1)``, counter ``(c0, c1, c2, c3)``, 10 rounds of::

    c0, c1, c2, c3 = hi(B * c2) ^ c1 ^ k0, lo(B * c2), hi(A * c0) ^ c3 ^ k1, lo(A * c0)
    k0, k1 = k0 + KEY_A, k1 + KEY_B        (mod 2^32)

with ``A = 0xD2511F53``, ``B = 0xCD9E8D57``. fusedops keys it by a 64-bit seed
``(k0, k1) = (low, high 32 bits of seed)`` and uses counter ``(low, high 32 bits of n, 0, 0)``
for block ``n``; ``dropout_words`` lays the four words of counter ``offset + q`` out as elements
``4q .. 4q + 3``. All values are kept in ``[0, 2^32)`` and the 32x32-bit products are built from
16-bit halves, so no intermediate passes 2^34: exact in int64 on every framework.
"""

from __future__ import annotations

MASK32 = 0xFFFFFFFF
ROUND_A = 0xD2511F53  # multiplies counter word 0
ROUND_B = 0xCD9E8D57  # multiplies counter word 2
KEY_A = 0x9E3779B9
KEY_B = 0xBB67AE85
ROUNDS = 10
#: Elements per Philox call: element i takes word i % 4 of counter offset + i // 4.
WORDS_PER_COUNTER = 4


#: What dropout does to the elements of a call (the kernels take it as an int).
KEEP, RANDOM, DROP = 0, 1, 2


def dropout_mode(p: float, has_seed: bool) -> int:
    """KEEP every element (p = 0), DROP every element (p = 1) or keep them at RANDOM; only
    RANDOM reads the seed (a call with 0 < p < 1 and no seed is a bug of the caller)."""
    if p == 0:
        return KEEP
    if p == 1:
        return DROP
    if not has_seed:
        raise ValueError(f"dropout with p={p} needs a seed")
    return RANDOM


def dropout_scale(p: float) -> float:
    """The factor of kept elements, 1 / (1 - p) (0 for p = 1, where nothing is kept)."""
    return 1.0 / (1.0 - p) if p < 1 else 0.0


def keep_threshold(p: float) -> int:
    """The 32-bit threshold of dropout probability p in [0, 1]: an element is kept iff its
    Philox word is >= this (p = 1 gives 2^32: nothing is kept). The same integer on every
    backend, so every backend keeps the same elements."""
    return int(p * 2.0**32)  # p * 2^32 is exact in float64; int() floors a non-negative value


def _mul_hi_lo(a, constant: int):
    """(high, low) 32-bit words of ``a * constant`` for 32-bit values ``a``."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    c_lo, c_hi = constant & 0xFFFF, constant >> 16
    ll, lh, hl, hh = a_lo * c_lo, a_lo * c_hi, a_hi * c_lo, a_hi * c_hi
    middle = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    high = hh + (lh >> 16) + (hl >> 16) + (middle >> 16)
    low = ((middle & 0xFFFF) << 16) | (ll & 0xFFFF)
    return high, low


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """The four output words of Philox4x32-10 for counters ``(c0, c1, c2, c3)`` and key
    ``(k0, k1)``: integer arrays (torch or jax, int64) of 32-bit values, broadcastable."""
    for _ in range(ROUNDS):
        high_b, low_b = _mul_hi_lo(c2, ROUND_B)
        high_a, low_a = _mul_hi_lo(c0, ROUND_A)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return c0, c1, c2, c3


def dropout_words(seed, counters, n: int, stack):
    """Philox word of each of ``n`` elements: element i gets word ``i % 4`` of counter
    ``offset + i // 4``.

    seed: int64 array ``[key, offset]`` (key, offset >= 0, offset + n / 4 < 2^63);
    counters: int64 ``arange(ceil(n / 4))`` of the array's framework; stack: its ``stack``.
    Returns an int64 array of n values in ``[0, 2^32)``.
    """
    key, offset = seed[0], seed[1]
    block = offset + counters
    zero = block * 0
    words = philox4x32_10(
        block & MASK32, (block >> 32) & MASK32, zero, zero, key & MASK32, (key >> 32) & MASK32
    )
    return stack(words, 1).reshape(-1)[:n]

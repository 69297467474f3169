"""Row maxima for the softmax kernels (swin_softmax, window_attention) that follow the rule of
``fusedops/ops/_swin.py``: a row is fully masked when its max is -inf, and a NaN in a row makes
its max NaN (``tl.max`` and ``tl.maximum`` skip NaN by default, which would let a row of NaN
and -inf pass for fully masked and give zeros instead of torch.softmax's NaN)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def maximum_nan(a, b):
    """Elementwise max, NaN if either is NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def row_max(x):
    """Max of a 2-D tile over axis 1, NaN for rows holding a NaN."""
    return tl.reduce(x, 1, maximum_nan)

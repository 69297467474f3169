"""The dtype fusedops computes in, one rule for every op (statistics, accumulations, IoU)."""

from __future__ import annotations

import torch


def compute_dtype(*dtypes: torch.dtype | None) -> torch.dtype:
    """float64 when any of ``dtypes`` (None ignored) is float64, the reference backend's
    precision; float32 otherwise (16-bit and fp32 inputs alike)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, skipping the call (about 1 us of host time) where t already has
    ``dtype`` (where ``to`` returns t itself)."""
    return t if t.dtype == dtype else t.to(dtype)

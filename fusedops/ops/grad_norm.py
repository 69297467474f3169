"""The global gradient norm and clipping coefficient of ``torch.nn.utils.clip_grad_norm_``,
computed without writing the gradients and without a host synchronisation.

``total_norm`` reads every gradient once: one ``torch._foreach_norm`` per (device, dtype) group
(a multi-tensor kernel on CUDA), accumulated and returned in float32 whatever the gradients'
dtype; the groups' norms are combined on the first gradient's device as ``clip_grad_norm_``
combines them. A non-finite gradient makes the norm non-finite (inf for an inf, NaN for a NaN
with ``norm_type`` 2; inf or NaN for ``norm_type`` inf), so the same pass detects it.
``clip_coefficient`` is ``min(1, max_norm / (norm + 1e-6))``, the factor ``clip_grad_norm_``
multiplies the gradients by (NaN for a NaN norm, 0 for an infinite one, as there).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from fusedops.ops._eager import PLAIN_TENSOR_TYPES


def check_norm_type(norm_type) -> float:
    """``norm_type`` as a float; ValueError unless it is a positive number or inf."""
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)):
        raise TypeError(f"norm_type must be a positive number or inf, got {norm_type!r}")
    value = float(norm_type)
    if not value > 0:  # also refuses NaN
        raise ValueError(f"norm_type must be a positive number or inf, got {norm_type!r}")
    return value


def check_max_norm(max_norm) -> float | None:
    """``max_norm`` (max_grad_norm) as a float, or None; ValueError unless positive and finite."""
    if max_norm is None:
        return None
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
        raise TypeError(f"max_grad_norm must be a positive number or None, got {max_norm!r}")
    value = float(max_norm)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"max_grad_norm must be a positive finite number, got {max_norm!r}")
    return value


def _per_tensor_norms(grads: list[torch.Tensor], norm_type: float) -> list[torch.Tensor]:
    """Each gradient's norm in float32 (0-d, on its device): one multi-tensor pass per (device,
    dtype) group of plain tensors; subclasses (DTensor shards of FSDP2) one by one, a DTensor's
    norm made whole across its mesh (an all-reduce, no host synchronisation)."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    norms = []
    for g in grads:
        if g.numel() == 0:  # adds nothing (and the inf norm of nothing is undefined)
            continue
        if type(g) in PLAIN_TENSOR_TYPES:
            groups[(g.device, g.dtype)].append(g)
            continue
        norm = torch.linalg.vector_norm(g, norm_type, dtype=_accumulation_dtype(g.dtype))
        full_tensor = getattr(norm, "full_tensor", None)
        norms.append(full_tensor() if full_tensor is not None else norm)
    for (_, dtype), tensors in groups.items():
        norms.extend(torch._foreach_norm(tensors, norm_type, dtype=_accumulation_dtype(dtype)))
    return norms


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """float32, float64 for float64 gradients; None (their own) for complex ones, whose norm
    is real in their precision."""
    if dtype.is_complex:
        return None
    return torch.float64 if dtype == torch.float64 else torch.float32


def total_norm(
    grads: list[torch.Tensor],
    norm_type: float = 2.0,
    grad_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ``norm_type``-norm of all ``grads`` viewed as one vector, divided by ``grad_scale``
    (a 1-element tensor: the gradients are still scaled by it), as a 0-d float32 tensor on
    ``grads[0]``'s device (CPU when there are none: 0). Gradients of any shape, dtype and
    device; nothing is written and nothing waits for the device."""
    norm_type = check_norm_type(norm_type)
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    device = grads[0].device
    norms = [n.to(device, non_blocking=True) for n in _per_tensor_norms(grads, norm_type)]
    if not norms:
        result = torch.zeros((), dtype=torch.float32, device=device)
    else:
        result = torch.linalg.vector_norm(torch.stack(norms), norm_type).to(torch.float32)
    if grad_scale is not None:
        result = result / grad_scale.to(device=device, dtype=torch.float32, non_blocking=True)
    return result.reshape(())


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``min(1, max_norm / (norm + 1e-6))`` (0-d float32 on ``norm``'s device), the factor
    ``torch.nn.utils.clip_grad_norm_`` multiplies the gradients by."""
    return torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)

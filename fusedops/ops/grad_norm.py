"""The global gradient norm and clipping coefficient of ``torch.nn.utils.clip_grad_norm_``,
computed without writing the gradients and without a host synchronisation (but for the one a
result on the host needs when gradients live on an accelerator).

``total_norm`` reads every gradient once: one ``torch._foreach_norm`` per (device, dtype) group
(a multi-tensor kernel on CUDA), accumulated and returned in float32 whatever the gradients'
dtype. Each device's norms are combined on that device, then the devices' norms on one of
them (an accelerator where there is one: copies onto it never wait), as ``clip_grad_norm_``
combines them; the result comes back on the first gradient's device. A non-finite gradient
makes the norm non-finite (inf for an inf, NaN for a NaN with ``norm_type`` 2; inf or NaN for
``norm_type`` inf), so the same pass detects it.
``clip_coefficient`` is ``min(1, max_norm / (norm + 1e-6))``, the factor ``clip_grad_norm_``
multiplies the gradients by (NaN for a NaN norm, 0 for an infinite one, as there).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from fusedops.ops._eager import PLAIN_TENSOR_TYPES
from fusedops.ops._transfer import to_device


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


def combine_device(grads: list[torch.Tensor]) -> torch.device:
    """Where ``total_norm`` combines the per-device norms of ``grads``: the first gradient's
    device, unless that is the host and some gradient lives on an accelerator, then the first
    such accelerator, so that every copy into the combination is asynchronous (the host's norms
    go onto the accelerator; the accelerator's would have to be waited for on the host). The
    host when there are no gradients."""
    devices = [g.device for g in grads]
    if not devices:
        return torch.device("cpu")
    return next((d for d in devices if d.type != "cpu"), devices[0])


def _norm_of(norms: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The ``norm_type``-norm of the 0-d ``norms`` (all on one device) viewed as one vector:
    the norm of the vector they are the norms of parts of."""
    if len(norms) == 1:
        return norms[0]  # (a norm: already its own norm)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


def total_norm(
    grads: list[torch.Tensor],
    norm_type: float = 2.0,
    grad_scale: torch.Tensor | None = None,
    *,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The ``norm_type``-norm of all ``grads`` viewed as one vector, divided by ``grad_scale``
    (a 1-element tensor: the gradients are still scaled by it), as a 0-d float32 tensor on
    ``device`` (default ``grads[0]``'s device, as ``clip_grad_norm_``; the host when there are
    no gradients: 0). Gradients of any shape, dtype and device; nothing is written.

    Each device's gradients are reduced on that device, the per-device norms combined on
    ``combine_device(grads)``. Nothing waits for a device, except the one blocking copy that
    brings the result onto the host when ``device`` is the host and some gradient (or
    ``grad_scale``) lives on an accelerator: the host cannot read a value an accelerator is
    still computing (fusedops/ops/_transfer.py)."""
    norm_type = check_norm_type(norm_type)
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    target = grads[0].device if device is None else device
    where = combine_device(grads)
    per_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for norm in _per_tensor_norms(grads, norm_type):
        per_device[norm.device].append(norm)
    if not per_device:
        result = torch.zeros((), dtype=torch.float32, device=where)
    else:
        partials = [_norm_of(norms, norm_type) for norms in per_device.values()]
        result = _norm_of([to_device(p, where) for p in partials], norm_type).to(torch.float32)
    if grad_scale is not None:
        result = result / to_device(grad_scale.reshape(()), where, torch.float32)
    return to_device(result.reshape(()), target)


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``min(1, max_norm / (norm + 1e-6))`` (0-d float32 on ``norm``'s device), the factor
    ``torch.nn.utils.clip_grad_norm_`` multiplies the gradients by."""
    return torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)

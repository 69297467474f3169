"""A backend that is not part of fusedops, as a third party would write one: QuickGELU computed
in float64 on CPU tensors (``tests/test_backends.py`` registers it; ``docs/adding-a-backend.md``
walks through it)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fusedops.dispatch import Backend, Pick

ALPHA = 1.702


def _forward(x: torch.Tensor) -> torch.Tensor:
    wide = x.double()
    return (wide * torch.sigmoid(ALPHA * wide)).to(x.dtype)


def _backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    wide = x.double()
    s = torch.sigmoid(ALPHA * wide)
    return (grad.double() * (s + ALPHA * wide * s * (1.0 - s))).to(x.dtype)


#: op name -> its implementation (the reference's function names and signatures)
IMPLEMENTATIONS = {"quick_gelu": SimpleNamespace(forward=_forward, backward=_backward)}


class Float64(Backend):
    """QuickGELU in float64 on CPU tensors of any floating dtype."""

    name = "float64"
    devices = ("cpu",)
    pick = Pick.VERIFIED  # a kernel family: automatic only once verified (or FUSEDOPS_UNVERIFIED)
    priority = 5  # after fusedops' own kernels where an op has several

    def unavailable(self, op):
        return [] if op.name in IMPLEMENTATIONS else [f"no float64 implementation of {op.name}"]

    def implementation(self, op):
        return IMPLEMENTATIONS[op.name]

    def input_reasons(self, op, tensors):
        main = tensors[0]
        reasons = super().input_reasons(op, tensors)  # the device, from ``devices``
        if not main.dtype.is_floating_point:
            reasons.append(f"dtype {main.dtype}: the float64 backend takes floating inputs")
        return reasons

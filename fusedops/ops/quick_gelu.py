"""QuickGELU: ``y = x * sigmoid(1.702 * x)`` (CLIP's activation; not equal to nn.GELU).

Backward: ``dx = dy * (s + 1.702 * x * s * (1 - s))`` with ``s = sigmoid(1.702 * x)``.
Math in fp32 for fp16/bf16 inputs; output in the input dtype.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): in plain eager
mode the QuickGELU classes' own code, ``x * torch.sigmoid(1.702 * x)`` in x's dtype, with torch's
autograd (what the hooks replace, roundings included: a 16-bit x rounds after each op where the
kernels round once); under torch.compile/export the custom op runs the reference's formula,
torch having no QuickGELU op of its own (no native namespace).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.kernels.shared.constants import QUICK_GELU_ALPHA
from fusedops.ops._checks import check_tensor
from fusedops.ops._define import apply_function, define_module_op
from fusedops.ops._eager import eager_fast_path

__all__ = ["quick_gelu"]

ALPHA = QUICK_GELU_ALPHA


def _reference_forward(x: torch.Tensor) -> torch.Tensor:
    compute = x if x.dtype == torch.float64 else x.float()
    return (compute * torch.sigmoid(ALPHA * compute)).to(x.dtype)


def _reference_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    compute = x if x.dtype == torch.float64 else x.float()
    s = torch.sigmoid(ALPHA * compute)
    dx = grad.to(compute.dtype) * (s + ALPHA * compute * s * (1.0 - s))
    return dx.to(x.dtype)


reference = SimpleNamespace(forward=_reference_forward, backward=_reference_backward)

dispatch.register_op(
    "quick_gelu",
    reference,
    kernels="quick_gelu",
)


def _forward(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return dispatch.select("quick_gelu", x, backend=backend).forward(x)


def _backward_body(grad: torch.Tensor, x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return dispatch.select("quick_gelu", x, backend=backend).backward(grad.contiguous(), x)


def _forward_fake(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_fake(grad: torch.Tensor, x: torch.Tensor, backend: str | None = None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


QUICK_GELU = define_module_op("quick_gelu", globals())


def quick_gelu(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """QuickGELU ``x * sigmoid(1.702 * x)``, elementwise.

    x: any shape, float16/bfloat16/float32 (float64 on the reference backend). Returns a
    contiguous tensor of x's shape and dtype. Differentiable; works under torch.compile.
    backend: "cuda" | "triton" | "native" | "reference" to force one (default: the dispatch rule).
    """
    check_tensor(x, "x")
    x = x.contiguous()
    if eager_fast_path(x):  # plain eager: what QUICK_GELU(...) would check again
        if dispatch.pick("quick_gelu", x, backend=backend) == "native":
            # torch ops differentiated by torch's autograd: the QuickGELU classes' own code (in
            # a 16-bit x's dtype, rounding after each op as they do; fp32/fp64 as the reference)
            return x * torch.sigmoid(ALPHA * x)
        return apply_function(QUICK_GELU.function, (x, backend))
    return QUICK_GELU(x, backend)

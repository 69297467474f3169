"""QuickGELU: ``y = x * sigmoid(1.702 * x)`` (CLIP's activation; not equal to nn.GELU).

Backward: ``dx = dy * (s + 1.702 * x * s * (1 - s))`` with ``s = sigmoid(1.702 * x)``.
Math in fp32 for fp16/bf16 inputs; output in the input dtype.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.ops._checks import check_tensor
from fusedops.ops._eager import eager_fast_path

ALPHA = 1.702


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
    triton_module="fusedops.kernels.triton.quick_gelu",
    cuda_module="fusedops.kernels.cuda.quick_gelu",
)


def _forward(x: torch.Tensor, backend: str | None) -> torch.Tensor:
    return dispatch.select("quick_gelu", x, backend=backend).forward(x)


def _backward_body(grad: torch.Tensor, x: torch.Tensor, backend: str | None) -> torch.Tensor:
    return dispatch.select("quick_gelu", x, backend=backend).backward(grad.contiguous(), x)


# ------------------------------------------------------------------------------------------
# Custom ops (torch.compile, torch.export, subclasses) and the eager autograd.Function: the
# same bodies (see ops/_eager.py).


@torch.library.custom_op("fusedops::quick_gelu", mutates_args=())
def _quick_gelu_op(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return _forward(x, backend)


@_quick_gelu_op.register_fake
def _(x, backend=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("fusedops::quick_gelu_backward", mutates_args=())
def _quick_gelu_backward_op(
    grad: torch.Tensor, x: torch.Tensor, backend: str | None = None
) -> torch.Tensor:
    return _backward_body(grad, x, backend)


@_quick_gelu_backward_op.register_fake
def _(grad, x, backend=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    x, backend = inputs
    ctx.save_for_backward(x)
    # An explicit choice made around the forward (use_backend, env) also holds for the backward.
    ctx.backend = dispatch.requested(backend)


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _quick_gelu_backward_op(grad, x, ctx.backend), None


_quick_gelu_op.register_autograd(_backward, setup_context=_setup_context)


class _QuickGELUFunction(torch.autograd.Function):
    """The eager path (ops/_eager.py); classic ``forward(ctx, ...)`` (cheaper ``apply``)."""

    @staticmethod
    def forward(ctx, x, backend):
        output = _forward(x, backend)
        _setup_context(ctx, (x, backend), output)
        return output

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _backward_body(grad, x, ctx.backend), None


def quick_gelu(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """QuickGELU ``x * sigmoid(1.702 * x)``, elementwise.

    x: any shape, float16/bfloat16/float32 (float64 on the reference backend). Returns a
    contiguous tensor of x's shape and dtype. Differentiable; works under torch.compile.
    backend: "cuda" | "triton" | "reference" to force one (default: the dispatch rule).
    """
    check_tensor(x, "x")
    x = x.contiguous()
    if eager_fast_path(x):
        return _QuickGELUFunction.apply(x, backend)
    return _quick_gelu_op(x, backend)

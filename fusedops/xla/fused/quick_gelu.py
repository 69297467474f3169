"""QuickGELU in XLA: ``x * sigmoid(1.702 x)`` and its derivative, in fp32 for 16-bit inputs."""

from __future__ import annotations

import jax
import torch

from fusedops.kernels.shared.constants import QUICK_GELU_ALPHA as ALPHA
from fusedops.xla.lower_table import register, upcast

fusedops = torch.ops.fusedops


@register(fusedops.quick_gelu.default)
def quick_gelu(x, backend=None):
    c = upcast(x)
    return (c * jax.nn.sigmoid(ALPHA * c)).astype(x.dtype)


@register(fusedops.quick_gelu_backward.default)
def quick_gelu_backward(grad, x, backend=None):
    c = upcast(x)
    s = jax.nn.sigmoid(ALPHA * c)
    return (grad.astype(c.dtype) * (s + ALPHA * c * s * (1.0 - s))).astype(x.dtype)

"""ops/_eager.py: when an op may bypass its custom op for its eager autograd.Function."""

import io

import pytest
import torch

import fusedops
from fusedops.testing import assert_close, random_tensor

# torch.jit is deprecated in torch 2.13, and tracing the ops' argument checks warns
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning"
)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(random_tensor((8,)))
        self.bias = torch.nn.Parameter(random_tensor((8,)))

    def forward(self, x):
        return fusedops.quick_gelu(fusedops.layer_norm(x, (8,), self.weight, self.bias))


def test_jit_trace_records_the_custom_ops_and_the_trace_saves():
    """Under torch.jit.trace the ops are their custom ops (an autograd.Function would be an
    opaque Python call that torch.jit.save refuses)."""
    block, x = _Block(), random_tensor((3, 8))
    traced = torch.jit.trace(block, x)
    graph = str(traced.graph)
    assert "fusedops::layer_norm" in graph and "fusedops::quick_gelu" in graph, graph
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    assert_close(loaded(x), block(x).double())

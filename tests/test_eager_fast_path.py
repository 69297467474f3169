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


def test_fast_path_is_off_under_modes_transforms_and_tracing():
    """eager_fast_path: True in plain eager mode only; False under a dispatch mode (fake
    tensors, profilers...), a torch-function mode, a functorch transform and jit tracing, where
    the ops must be their custom ops."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from fusedops.ops._eager import eager_fast_path

    x = random_tensor((3, 2), torch.float32, "cpu")
    assert eager_fast_path(x)

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Dispatch():
        assert not eager_fast_path(x)
    with Function():
        assert not eager_fast_path(x)
    seen = []

    def record(t):
        seen.append(eager_fast_path())
        return t * 2

    torch.func.vmap(record)(x)
    torch.jit.trace(record, x, check_trace=False)
    assert seen == [False, False]
    assert eager_fast_path(x)

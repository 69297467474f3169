"""QuickGELU against its float64 reference, every backend available here."""

import pytest
import torch

import fusedops
from fusedops.ops.quick_gelu import reference
from fusedops.testing import assert_close, non_contiguous, random_tensor
from tests.op_testing import BACKENDS, DEVICE, DTYPES

SHAPES = [(1,), (1, 1), (7,), (3, 5, 7), (1025,), (2, 2049), (0,), (4, 0, 3)]


def _expected(x64: torch.Tensor, grad64: torch.Tensor):
    return reference.forward(x64), reference.backward(grad64, x64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_match_reference(backend, dtype, shape):
    x = random_tensor(shape, dtype, DEVICE).requires_grad_()
    grad = random_tensor(shape, dtype, DEVICE)
    y = fusedops.quick_gelu(x, backend=backend)
    y.backward(grad)
    y_ref, dx_ref = _expected(x.detach().double(), grad.double())
    assert y.dtype == dtype and x.grad.dtype == dtype
    assert_close(y, y_ref, msg="forward")
    assert_close(x.grad, dx_ref, msg="dx")


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_input(backend):
    base = random_tensor((6, 33), torch.float32, DEVICE)
    x = non_contiguous(base).requires_grad_()
    assert not x.is_contiguous()
    grad = non_contiguous(random_tensor((6, 33), torch.float32, DEVICE))
    y = fusedops.quick_gelu(x, backend=backend)
    y.backward(grad)
    y_ref, dx_ref = _expected(base.double(), grad.double())
    assert_close(y, y_ref)
    assert_close(x.grad, dx_ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_use_backend_context_selects_and_records(backend):
    x = random_tensor((5, 9), torch.float32, DEVICE)
    with fusedops.use_backend(backend):
        fusedops.quick_gelu(x)
    assert fusedops.dispatch.last_used["quick_gelu"] == backend


def test_module_and_math_differs_from_gelu():
    x = random_tensor((64,), torch.float32, DEVICE)
    y = fusedops.nn.QuickGELU()(x)
    assert_close(y, x.double() * torch.sigmoid(1.702 * x.double()))
    assert (y - torch.nn.functional.gelu(x)).abs().max() > 1e-3


def test_gradcheck_reference():
    x = random_tensor((4, 6), torch.float64, "cpu").requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fusedops.quick_gelu(t, backend="reference"), (x,))


def test_torch_compile_no_graph_break():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), fusedops.nn.QuickGELU())
    x = random_tensor((3, 8), torch.float32, DEVICE)
    model = model.to(DEVICE)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert_close(out, model(x).double())


def test_opcheck():
    x = random_tensor((3, 4), torch.float32, DEVICE).requires_grad_()
    torch.library.opcheck(torch.ops.fusedops.quick_gelu.default, (x, None))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ([1.0, 2.0], TypeError, "x must be a torch.Tensor"),
        (torch.ones(3, dtype=torch.int64), TypeError, "x has dtype torch.int64"),
        (torch.ones(3, dtype=torch.bool), TypeError, "x has dtype torch.bool"),
    ],
)
def test_bad_inputs(value, error, match):
    with pytest.raises(error, match=match):
        fusedops.quick_gelu(value)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown backend 'cuda2'"):
        fusedops.quick_gelu(torch.ones(3), backend="cuda2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal message")
def test_forced_cuda_on_cpu_lists_reasons():
    with pytest.raises(fusedops.BackendUnavailableError, match="cuda.*CPU-only build|cuda"):
        fusedops.quick_gelu(torch.ones(3), backend="cuda")


def test_torch_export_keeps_the_custom_op():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), fusedops.nn.QuickGELU())
    x = random_tensor((2, 4), torch.float32, "cpu")
    exported = torch.export.export(model, (x,))
    assert "fusedops.quick_gelu" in str(exported.graph)
    assert_close(exported.module()(x), model(x).double())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_storage_offset(backend, dtype):
    """A contiguous view starting one element into its storage (not 16-byte aligned): the CUDA
    kernel's scalar path instead of its 16-byte vector path."""
    x = random_tensor((1 + 1029,), dtype, DEVICE)[1:].requires_grad_()
    grad = random_tensor((1 + 1029,), dtype, DEVICE)[1:]
    y = fusedops.quick_gelu(x, backend=backend)
    y.backward(grad)
    y_ref, dx_ref = _expected(x.detach().double(), grad.double())
    assert_close(y, y_ref)
    assert_close(x.grad, dx_ref)


def test_triton_kernel_alpha_is_the_shared_constant():
    """The Triton module keeps its own literal (its sources are hashed for verified dispatch)."""
    pytest.importorskip("triton")
    from fusedops.kernels.shared.constants import QUICK_GELU_ALPHA
    from fusedops.kernels.triton import quick_gelu as kernels

    assert kernels.ALPHA == QUICK_GELU_ALPHA == fusedops.ops.quick_gelu.ALPHA

"""LayerNorm and RMSNorm against torch's float64 functions, every backend available here.

The oracle is ``torch.nn.functional.layer_norm`` / ``rms_norm`` in float64 (with autograd for
dx, dweight, dbias), independent of fusedops' own reference (which is one of the backends checked).
"""

import math

import pytest
import torch
import torch.nn.functional as F

import fusedops
from fusedops.testing import assert_close, host_library, non_contiguous, random_tensor
from tests.op_testing import BACKENDS, DEVICE, DTYPES, KERNEL_BACKENDS

OPS = ["layer_norm", "rms_norm"]
EPS = 1e-5


def _params(op, shape, dtype, affine):
    """(weight, bias) of ``shape``: affine is "none", "weight", "bias" or "both"."""
    weight = random_tensor(shape, dtype, DEVICE) if affine in ("weight", "both") else None
    bias = None
    if op == "layer_norm" and affine in ("bias", "both"):
        bias = random_tensor(shape, dtype, DEVICE)
    return weight, bias


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _call(op, x, shape, weight, bias, backend, eps=EPS):
    if op == "layer_norm":
        return fusedops.layer_norm(x, shape, weight, bias, eps, backend=backend)
    return fusedops.rms_norm(x, shape, weight, eps, backend=backend)


def _run(op, x, shape, weight, bias, grad, backend, eps=EPS):
    """Forward and backward through fusedops: (y, dx, dweight, dbias)."""
    x, weight, bias = _leaf(x), _leaf(weight), _leaf(bias)
    y = _call(op, x, shape, weight, bias, backend, eps)
    y.backward(grad)
    return y, x.grad, *(None if p is None else p.grad for p in (weight, bias))


def _oracle(op, x, shape, weight, bias, grad, eps=EPS):
    """The same in float64 through torch.nn.functional."""
    x64 = x.detach().double().requires_grad_()
    w64, b64 = (None if p is None else p.detach().double().requires_grad_() for p in (weight, bias))
    if op == "layer_norm":
        y = F.layer_norm(x64, shape, w64, b64, eps)
    else:
        y = F.rms_norm(x64, shape, w64, eps)
    y.backward(grad.double())
    return y, x64.grad, *(None if p is None else p.grad for p in (w64, b64))


def _error_scales(op, x, shape, weight, grad, eps=EPS):
    """Tolerance scales of (dx, dweight/dbias) for these inputs.

    dx is ``rstd * (g - xhat * c1 - c2)``: a difference of terms of size ``|g| * rstd``, so any
    fp32 kernel's rounding error is relative to that size, not to |dx| (rstd reaches
    1/sqrt(eps) ~ 316 when a row's variance is near 0, as with N = 1). dweight and dbias sum M
    products: rounding grows like sqrt(M)."""
    rows = x.detach().double().reshape(-1, math.prod(shape))
    centered = rows if op == "rms_norm" else rows - rows.mean(dim=1, keepdim=True)
    rstd = torch.rsqrt(centered.square().mean(dim=1, keepdim=True) + eps)
    g = grad.double().reshape(rows.shape).abs()
    if weight is not None:
        g = g * weight.detach().double().reshape(-1).abs()
    terms = (g * rstd).max().item() if rows.numel() else 1.0
    return max(1.0, terms / 3.0), max(1.0, math.sqrt(rows.shape[0]) / 2.0)


def _rounds_terms_in_16_bits(op, x, n, backend):
    """True where the backend runs torch's own CPU LayerNorm on 16-bit x (the native backend's
    eager path): its statistics and each summed product of dweight/dbias are rounded to 16 bits
    before an fp32 accumulation, so their error is a few 16-bit roundoffs of the sum of |terms|
    (whatever the number of rows), not an fp32 sum's. Rows of one element take the reference."""
    return (
        op == "layer_norm"
        and n > 1
        and x.device.type == "cpu"
        and x.dtype in (torch.float16, torch.bfloat16)
        and fusedops.dispatch.select_name("layer_norm", x, backend=backend) == "native"
    )


def _term_magnitudes(op, x, shape, weight, grad, eps=EPS):
    """Sizes of the terms torch's 16-bit CPU LayerNorm rounds (``_rounds_terms_in_16_bits``):
    (dx's, dweight's sum_rows |dy| * (|xhat| + rstd * |mean|), dbias's sum_rows |dy|). dx is
    ``rstd * (g - xhat * mean(g * xhat) - mean(g))`` with ``g = dy * weight`` and mean and rstd
    kept in 16 bits, so xhat carries an error of the 16-bit roundoff of ``|xhat| + rstd *
    |mean|``, in dweight's products too (an x equal to its row's 16-bit mean gives xhat 0
    exactly where the float64 oracle's is 1e-16: the bound must not be |xhat|'s)."""
    n = math.prod(shape)
    rows = x.detach().double().reshape(-1, n)
    mean = rows.mean(dim=1, keepdim=True)
    centered = rows if op == "rms_norm" else rows - mean
    rstd = torch.rsqrt(centered.square().mean(dim=1, keepdim=True) + eps)
    xhat = centered * rstd
    dy = grad.detach().double().reshape(-1, n).abs()
    g = dy if weight is None else dy * weight.detach().double().reshape(1, n).abs()
    xhat_size = xhat.abs() + rstd * mean.abs()
    c1_size = (g * xhat_size).mean(dim=1, keepdim=True)
    dx = rstd * (g + xhat_size * c1_size + g.mean(dim=1, keepdim=True))
    return dx.view(x.shape), (dy * xhat_size).sum(0).view(shape), dy.sum(0).view(shape)


def _check(actual, expected, x_dtype, weight, bias, scales=(1.0, 1.0), term_magnitudes=None):
    """term_magnitudes: (dx's, dweight's, dbias's) where the terms are rounded to x's 16-bit
    dtype (``_rounds_terms_in_16_bits``); None: fp32 arithmetic, bounded by ``scales``."""
    y, dx, dweight, dbias = actual
    y_ref, dx_ref, dweight_ref, dbias_ref = expected
    dx_scale, sum_scale = scales
    assert y.dtype == x_dtype and dx.dtype == x_dtype
    assert_close(y, y_ref, msg="forward")
    if term_magnitudes is None:
        assert_close(dx, dx_ref, scale=dx_scale, msg="dx")
    else:
        rounded = {"dtype": x_dtype, "compute": x_dtype, "magnitude": term_magnitudes[0]}
        assert_close(dx, dx_ref, msg="dx", **rounded)
    for name, grad, grad_ref, param, i in (
        ("dweight", dweight, dweight_ref, weight, 1),
        ("dbias", dbias, dbias_ref, bias, 2),
    ):
        if param is None:
            assert grad is None
            continue
        assert grad.dtype == param.dtype
        if term_magnitudes is None:
            assert_close(grad, grad_ref, scale=sum_scale, msg=name)
        else:
            magnitude = term_magnitudes[i]
            assert_close(
                grad, grad_ref, dtype=x_dtype, compute=x_dtype, magnitude=magnitude, msg=name
            )


def _case(op, lead, normalized, dtype, affine, backend, weight_dtype=None, eps=EPS):
    x = random_tensor((*lead, *normalized), dtype, DEVICE)
    grad = random_tensor(x.shape, dtype, DEVICE)
    weight, bias = _params(op, normalized, weight_dtype or dtype, affine)
    actual = _run(op, x, normalized, weight, bias, grad, backend, eps)
    expected = _oracle(op, x, normalized, weight, bias, grad, eps)
    scales = _error_scales(op, x, normalized, weight, grad, eps)
    magnitudes = None
    if _rounds_terms_in_16_bits(op, x, math.prod(normalized), backend):
        magnitudes = _term_magnitudes(op, x, normalized, weight, grad, eps)
    _check(actual, expected, dtype, weight, bias, scales, magnitudes)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 64, 1000, 1023, 4096, 5000])
@pytest.mark.parametrize("affine", ["both", "none"])
@pytest.mark.parametrize("op", OPS)
def test_rows_match_float64(op, affine, n, dtype, backend):
    _case(op, (3, 5), (n,), dtype, affine, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("lead", "normalized"),
    [
        ((0,), (8,)),
        ((), (9,)),
        ((1,), (33,)),
        ((2, 3), (17,)),
        ((2, 1, 3), (5,)),
        ((4,), (6, 5)),
        ((), (6, 5)),  # x of two dims, both normalized: one row
    ],
)
@pytest.mark.parametrize("op", OPS)
def test_leading_and_normalized_dims(op, lead, normalized, dtype, backend):
    _case(op, lead, normalized, dtype, "both", backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalized", [(40,), (4, 10)])
@pytest.mark.parametrize("affine", ["weight", "bias"])
def test_layer_norm_weight_or_bias_alone(affine, normalized, backend):
    """One parameter given, of one normalized dim or two (its gradient in its own shape)."""
    _case("layer_norm", (6,), normalized, torch.float32, affine, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", OPS)
def test_fp32_parameters_with_half_input(op, dtype, backend):
    """As under autocast: output in x's dtype, dweight/dbias in fp32."""
    _case(op, (4, 3), (100,), dtype, "both", backend, weight_dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_under_autocast_output_keeps_the_input_dtype(backend):
    linear = torch.nn.Linear(16, 16).to(DEVICE)
    norm = fusedops.nn.LayerNorm(16).to(DEVICE)
    x = random_tensor((4, 16), torch.float32, DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16), fusedops.use_backend(backend):
        h = linear(x)
        y = norm(h)
        y.float().sum().backward()
    assert h.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    assert norm.weight.grad.dtype == torch.float32 and norm.bias.grad.dtype == torch.float32
    expected = F.layer_norm(h.double(), (16,), norm.weight.double(), norm.bias.double())
    assert_close(y, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_input(op, backend):
    base = random_tensor((6, 33), torch.float32, DEVICE)
    x = non_contiguous(base)
    assert not x.is_contiguous()
    grad = non_contiguous(random_tensor((6, 33), torch.float32, DEVICE))
    weight, bias = _params(op, (33,), torch.float32, "both")
    actual = _run(op, x, (33,), weight, bias, grad, backend)
    _check(actual, _oracle(op, base, (33,), weight, bias, grad), torch.float32, weight, bias)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_default_eps_is_finfo_eps(backend):
    x = random_tensor((4, 16), torch.bfloat16, DEVICE) * 1e-2  # eps matters for small values
    y = fusedops.rms_norm(x, (16,), backend=backend)
    expected = F.rms_norm(x.double(), (16,), eps=torch.finfo(torch.bfloat16).eps)
    assert_close(y, expected)


def _force_looped(monkeypatch, backend):
    if backend == "triton":
        from fusedops.kernels.triton import layer_norm as kernels

        monkeypatch.setattr(kernels, "MAX_FUSED_N", 32)
        monkeypatch.setattr(kernels, "MAX_FUSED_N_FORWARD", 32)
        monkeypatch.setattr(kernels, "LOOP_BLOCK_N", 32)
    else:
        from fusedops.kernels.cuda import layer_norm as kernels

        monkeypatch.setattr(kernels, "MAX_REGISTER_N", 32)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 100: whole 16-byte vectors of fp32 (the CUDA looped kernels' vector access); 264 and 2056:
# of 16-bit too, 2056 over more than one pass of a block's 256 threads x 8 elements
@pytest.mark.parametrize("n", [33, 100, 257, 264, 2056])
@pytest.mark.parametrize("affine", ["both", "none"])
@pytest.mark.parametrize("op", OPS)
def test_looped_path_matches_float64(monkeypatch, op, affine, n, dtype, backend):
    """Rows longer than the register threshold (lowered here) take the looped two-pass path."""
    _force_looped(monkeypatch, backend)
    _case(op, (5,), (n,), dtype, affine, backend)


def _vector_access_matches_float64(monkeypatch, op, affine, n, dtype, vector_access=True):
    """The CUDA register path with 16-byte accesses (VECTOR_ACCESS, the default), or with one
    element per access (VECTOR_ACCESS off), through the C++ autograd op: warp rows and block
    rows, N a multiple of the vector width or not (1000 with 16-bit types falls back to one
    element per access)."""
    from fusedops.kernels.cuda import layer_norm as kernels

    monkeypatch.setattr(kernels, "VECTOR_ACCESS", vector_access)
    _case(op, (37,), (n,), dtype, affine, "cuda")


def _several_rows_per_block_match_float64(monkeypatch, op, n, vector_access):
    """The CUDA register-path backward with more rows than blocks (16 per SM at most: several
    rows per block, so the dweight/dbias sums of a block, in registers or shared memory, add
    rows), warp rows (N 300, 1000) and block rows (4096, 5000)."""
    from fusedops.kernels.cuda import layer_norm as kernels

    monkeypatch.setattr(kernels, "VECTOR_ACCESS", vector_access)
    rows = 16 * torch.cuda.get_device_properties(DEVICE).multi_processor_count + 3
    _case(op, (rows,), (n,), torch.bfloat16, "both", "cuda", weight_dtype=torch.float32)


def _eager_calls_use_the_cpp_autograd_op(monkeypatch, op, weight_dtype):
    """On the CUDA backend an eager call is one extension op whose backward is C++; weights of
    another dtype than fp32 or x's (fp16 with bf16 x) take the autograd.Function instead."""
    python_calls = _count_python_function_forwards(monkeypatch)
    _case(op, (2, 3), (4, 96), torch.bfloat16, "both", "cuda", weight_dtype=weight_dtype)
    assert bool(python_calls) == (weight_dtype == torch.float16)


def _count_python_function_forwards(monkeypatch):
    """A list that gets an entry each time a LayerNorm/RMSNorm Python autograd.Function's
    forward runs: the op's Function, or the eager path's ``_PickedNormFunction``. The eager path
    calls them through the C ``apply`` (ops/_define.py), which looks ``forward`` up on the
    class: patching ``apply`` would count nothing."""
    from fusedops.ops import layer_norm as ops

    python_calls = []
    functions = (ops.LAYER_NORM.function, ops.RMS_NORM.function, ops._PickedNormFunction)
    for function in functions:
        forward = function.forward
        monkeypatch.setattr(
            function, "forward", staticmethod(lambda *a, f=forward: python_calls.append(1) or f(*a))
        )
    return python_calls


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b not in ("cuda", "native")])
@pytest.mark.parametrize("op", OPS)
def test_python_function_counter_sees_eager_calls(monkeypatch, op, backend):
    """The counter of the gpu-only C++ autograd check, where the Function runs (the fusedops
    kernels but CUDA's C++ op; native calls torch's op): each eager call with a gradient is
    seen, and the results stay the oracle's."""
    python_calls = _count_python_function_forwards(monkeypatch)
    _case(op, (2, 3), (4, 96), torch.bfloat16, "both", backend)
    assert python_calls


def _cpp_op_cases():
    """(check, arguments) of the CUDA C++ op's cases, with ids."""
    cases = [
        pytest.param(_vector_access_matches_float64, (op, affine, n, dtype),
                     id=f"vector-{op}-{affine}-{n}-{str(dtype)[6:]}")
        for op in OPS
        for affine in ("both", "none")
        # 1536: a block row whose last warps hold no vector (16-bit) or uneven counts (fp32)
        for n in (8, 24, 64, 96, 1000, 1024, 1536, 2048, 4096, 8192)
        for dtype in DTYPES
    ]  # fmt: skip
    cases += [
        pytest.param(_vector_access_matches_float64, (op, "both", n, dtype, False),
                     id=f"element-{op}-both-{n}-{str(dtype)[6:]}")
        for op in OPS
        for n in (8, 24, 64, 96, 1000, 1024, 2048, 4096, 8192)
        for dtype in DTYPES
    ]  # fmt: skip
    cases += [
        pytest.param(_several_rows_per_block_match_float64, (op, n, vector_access),
                     id=f"rows-per-block-{op}-{n}-{'vector' if vector_access else 'element'}")
        for op in OPS
        for n in (300, 1000, 4096, 5000)
        for vector_access in (False, True)
    ]  # fmt: skip
    cases += [
        pytest.param(_eager_calls_use_the_cpp_autograd_op, (op, weight_dtype),
                     id=f"cpp-autograd-{op}-{str(weight_dtype)[6:]}-weight")
        for op in OPS
        for weight_dtype in (torch.bfloat16, torch.float32, torch.float16)
    ]  # fmt: skip
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize(("check", "args"), _cpp_op_cases())
def test_cuda_cpp_op(monkeypatch, check, args):
    """gpu-only: the CUDA extension's C++ layer_norm/rms_norm op itself (its 16-byte vector
    access, its C++ autograd, its backward over more rows than blocks) runs only on CUDA
    tensors. The comparisons are those every backend
    runs (``_case`` against torch's float64 functions); the fallbacks for misaligned rows and
    fp32 parameters run on every backend in
    ``test_rows_not_16_byte_aligned_and_fp32_parameters``."""
    check(monkeypatch, *args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_rows_not_16_byte_aligned_and_fp32_parameters(monkeypatch, op, backend):
    """Rows not 16-byte aligned (a view one element into its storage) and fp32 parameters
    beside bf16 x: the same results as float64. On the CUDA backend with its 16-byte accesses
    (VECTOR_ACCESS) on, which these rows must not take (a vector access there would fault)."""
    if backend == "cuda":
        from fusedops.kernels.cuda import layer_norm as kernels

        monkeypatch.setattr(kernels, "VECTOR_ACCESS", True)
    _case(op, (9,), (256,), torch.bfloat16, "both", backend, weight_dtype=torch.float32)
    rows, n = 5, 64
    storage = random_tensor((rows * n + 1,), torch.bfloat16, DEVICE).requires_grad_()
    x = storage[1:].view(rows, n)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    weight, bias = _params(op, (n,), torch.bfloat16, "both")
    grad = random_tensor((rows, n), torch.bfloat16, DEVICE)
    y = _call(op, x, (n,), weight, bias, backend)
    y.backward(grad)
    y_ref, dx_ref, *_ = _oracle(op, x, (n,), weight, bias, grad)
    assert_close(y, y_ref, msg="forward")
    dx_scale = _error_scales(op, x, (n,), weight, grad)[0]
    assert_close(storage.grad[1:].view(rows, n), dx_ref, scale=dx_scale, msg="dx")


def _spy_forward_loop(monkeypatch) -> list:
    """Record the grids the Triton forward's looped kernel is launched with."""
    from fusedops.kernels.triton import layer_norm as kernels

    calls = []
    original = kernels._forward_loop_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return original[grid]

    monkeypatch.setattr(kernels, "_forward_loop_kernel", Spy())
    return calls


def test_looped_path_is_taken_when_forced(monkeypatch):
    if "triton" not in KERNEL_BACKENDS:
        pytest.skip("needs the triton backend")
    from fusedops.kernels.triton import layer_norm as kernels

    calls = _spy_forward_loop(monkeypatch)
    fusedops.layer_norm(random_tensor((2, 40), device=DEVICE), 40, backend="triton")
    assert not calls
    monkeypatch.setattr(kernels, "MAX_FUSED_N_FORWARD", 32)
    fusedops.layer_norm(random_tensor((2, 40), device=DEVICE), 40, backend="triton")
    assert calls == [(2,)]


@pytest.mark.parametrize(
    ("backend", "looped"), [(b, False) for b in BACKENDS] + [(b, True) for b in KERNEL_BACKENDS]
)
def test_variance_survives_a_large_offset(monkeypatch, backend, looped):
    """Rows offset by 100 (x^2 ~ 1e4 while the variance is ~3): a one-pass E[x^2] - E[x]^2 in fp32
    would lose ~1e-4 of the variance here; the register path's two passes and the looped path's
    shifted sums must not. (Any fp32 mean is off by up to ~ulp(100) = 8e-6, hence scale=2.)"""
    if looped:
        _force_looped(monkeypatch, backend)
    x = random_tensor((4, 300), torch.float32, DEVICE) + 100.0
    expected = F.layer_norm(x.double(), (300,))
    assert_close(fusedops.layer_norm(x, 300, backend=backend), expected, scale=2)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_bitwise_deterministic(monkeypatch, op, looped, backend):
    # several programs (partial rows) contribute to dweight/dbias in both paths
    rows, n = (9, 40) if looped else (45, 64)
    if looped:
        _force_looped(monkeypatch, backend)
    x = random_tensor((rows, n), torch.bfloat16, DEVICE)
    grad = random_tensor(x.shape, torch.bfloat16, DEVICE)
    weight, bias = _params(op, (n,), torch.float32, "both")
    first = _run(op, x, (n,), weight, bias, grad, backend)
    second = _run(op, x, (n,), weight, bias, grad, backend)
    for a, b in zip(first, second):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_reference(op):
    x = random_tensor((3, 2, 5), torch.float64, "cpu").requires_grad_()
    weight = random_tensor((2, 5), torch.float64, "cpu").requires_grad_()
    bias = random_tensor((2, 5), torch.float64, "cpu").requires_grad_()
    if op == "layer_norm":
        fn = lambda x, w, b: fusedops.layer_norm(x, (2, 5), w, b, backend="reference")
        assert torch.autograd.gradcheck(fn, (x, weight, bias))
    else:
        fn = lambda x, w: fusedops.rms_norm(x, (2, 5), w, 1e-6, backend="reference")
        assert torch.autograd.gradcheck(fn, (x, weight))


def test_torch_compile_no_graph_break():
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), fusedops.nn.LayerNorm(8), fusedops.nn.RMSNorm(8)
    ).to(DEVICE)
    x = random_tensor((3, 8), torch.float32, DEVICE)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert model[1].weight.grad is not None and model[2].weight.grad is not None
    assert_close(out, model(x).double())


@pytest.mark.parametrize("with_params", [True, False])
def test_opcheck(with_params):
    x = random_tensor((3, 10), torch.float32, DEVICE).requires_grad_()
    w = random_tensor((10,), torch.float32, DEVICE).requires_grad_() if with_params else None
    b = random_tensor((10,), torch.float32, DEVICE).requires_grad_() if with_params else None
    torch.library.opcheck(torch.ops.fusedops.layer_norm.default, (x, w, b, 1e-5, None))
    torch.library.opcheck(torch.ops.fusedops.rms_norm.default, (x, w, 1e-5, None))
    xd = x.detach()
    y, mean, rstd = torch.ops.fusedops.layer_norm(xd, w, b, 1e-5, None)
    dy = random_tensor(y.shape, torch.float32, DEVICE)
    wd, bd = (None if p is None else p.detach() for p in (w, b))
    torch.library.opcheck(
        torch.ops.fusedops.layer_norm_backward.default, (dy, xd, wd, bd, mean, rstd, None)
    )
    _, rstd = torch.ops.fusedops.rms_norm(xd, wd, 1e-5, None)
    torch.library.opcheck(torch.ops.fusedops.rms_norm_backward.default, (dy, xd, wd, rstd, None))


def test_torch_export_keeps_the_custom_ops():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), fusedops.nn.LayerNorm(4))
    x = random_tensor((2, 4), torch.float32, "cpu")
    exported = torch.export.export(model, (x,))
    assert "fusedops.layer_norm" in str(exported.graph)
    assert_close(exported.module()(x), model(x).double())


BAD_INPUTS = [
    ({"normalized_shape": (4,)}, ValueError, r"normalized_shape \[4\] does not match"),
    ({"normalized_shape": (2, 5)}, ValueError, "normalized_shape .* trailing dims of x"),
    ({"normalized_shape": ()}, ValueError, "normalized_shape"),
    ({"normalized_shape": "5"}, TypeError, "normalized_shape must be"),
    ({"weight": torch.ones(4)}, ValueError, r"weight has shape \[4\]"),
    ({"bias": torch.ones(5, 1)}, ValueError, r"bias has shape \[5, 1\]"),
    ({"weight": torch.ones(5, device="meta")}, ValueError, "weight is on meta but x is on"),
    ({"x": torch.ones(3, 5, dtype=torch.int64)}, TypeError, "x has dtype torch.int64"),
    ({"weight": torch.ones(5, dtype=torch.int32)}, TypeError, "weight has dtype torch.int32"),
    ({"x": [[1.0] * 5]}, TypeError, "x must be a torch.Tensor"),
]


@pytest.mark.parametrize(
    ("op", "kwargs", "error", "match"),
    [
        (op, *case)
        for op in OPS
        for case in BAD_INPUTS
        if op == "layer_norm" or "bias" not in case[0]
    ],
)
def test_bad_inputs_name_the_argument(op, kwargs, error, match):
    args = {"x": torch.ones(3, 5), "normalized_shape": (5,), "weight": None}
    if op == "layer_norm":
        args["bias"] = None
    args.update(kwargs)
    with pytest.raises(error, match=match):
        getattr(fusedops, op)(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal message")
def test_forced_cuda_on_cpu_lists_reasons():
    with pytest.raises(fusedops.BackendUnavailableError, match="layer_norm.*cuda"):
        fusedops.layer_norm(torch.ones(2, 3), 3, backend="cuda")


def test_float64_takes_native_and_kernels_refuse_it():
    x = random_tensor((2, 6), torch.float64, "cpu")
    fusedops.layer_norm(x, 6)
    assert fusedops.dispatch.last_used["layer_norm"] == "native"
    if "triton" in KERNEL_BACKENDS:
        with pytest.raises(fusedops.BackendUnavailableError, match="dtype torch.float64"):
            fusedops.layer_norm(x, 6, backend="triton")


@pytest.mark.parametrize("shape", [(2, 3, 40), (6, 40)])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_output_can_be_modified_in_place(op, backend, shape):
    """The output is not a view to autograd: in-place ops on it (relu_, dropout(inplace=True))
    work and their gradients flow, as with torch's LayerNorm; x of rows (the Function returns
    the body's output as it is) and of more dims (a reshape of it)."""
    x = random_tensor(shape, torch.float32, DEVICE)
    weight, bias = _params(op, (40,), torch.float32, "both")
    grad = random_tensor(x.shape, torch.float32, DEVICE)
    results = {}
    for name in (backend, "reference"):
        leaf = _leaf(x)
        y = _call(op, leaf, (40,), weight, bias, name)
        y.mul_(2.0).add_(1.0)
        y.backward(grad)
        results[name] = (y.detach(), leaf.grad)
    for mine, theirs in zip(results[backend], results["reference"]):
        assert_close(mine, theirs, scale=_error_scales(op, x, (40,), weight, grad)[0] * 2)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "native"])
@pytest.mark.parametrize("op", OPS)
def test_double_backward_raises(op, backend):
    """The backward is not differentiable: asking for its graph raises, never a silent zero
    (native runs torch's own op in eager mode, whose backward torch differentiates:
    test_native_double_backward)."""
    x = _leaf(random_tensor((3, 16), torch.float32, DEVICE))
    weight, _ = _params(op, (16,), torch.float32, "weight")
    loss = _call(op, x, (16,), weight, None, backend).square().sum()
    # the CUDA op refuses create_graph itself; the Python Function when differentiated again
    with pytest.raises(RuntimeError, match="differentiate twice|double backward"):
        (dx,) = torch.autograd.grad(loss, x, create_graph=True)
        dx.sum().backward()


@pytest.mark.parametrize("op", OPS)
def test_native_double_backward(op):
    """native in eager mode is torch's op with torch's autograd: its gradient is differentiable
    and matches float64 autograd through the same op."""
    x = random_tensor((3, 16), torch.float32, DEVICE)
    weight, _ = _params(op, (16,), torch.float32, "weight")
    results = []
    for dtype in (torch.float32, torch.float64):
        leaf = _leaf(x.to(dtype))
        loss = _call(op, leaf, (16,), _leaf(weight.to(dtype)), None, "native").square().sum()
        (dx,) = torch.autograd.grad(loss, leaf, create_graph=True)
        results.append(torch.autograd.grad(dx.square().sum(), leaf)[0])
    assert_close(results[0], results[1], scale=16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_op_without_autograd_state(op, backend):
    """Inference mode (no autograd key), no_grad, and only x requiring grad."""
    x = random_tensor((5, 300), torch.float32, DEVICE)
    weight, bias = _params(op, (300,), torch.float32, "both")
    expected = _oracle(op, x, (300,), weight, bias, torch.ones_like(x))[0]
    with torch.inference_mode():
        assert_close(_call(op, x, (300,), weight, bias, backend), expected, msg="inference")
    with torch.no_grad():
        y = _call(op, _leaf(x), (300,), _leaf(weight), _leaf(bias), backend)
        assert not y.requires_grad
        assert_close(y, expected, msg="no_grad")
    grad = random_tensor(x.shape, torch.float32, DEVICE)
    leaf = _leaf(x)  # the only input that requires grad
    dx = torch.autograd.grad(_call(op, leaf, (300,), weight, bias, backend), leaf, grad)[0]
    expected_dx = _oracle(op, x, (300,), weight, bias, grad)[1]
    dx_scale = _error_scales(op, x, (300,), weight, grad)[0]
    assert_close(dx, expected_dx, scale=dx_scale, msg="dx")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("n", [8192, 8193, 65536])
@pytest.mark.parametrize("op", OPS)
def test_long_rows(op, n, backend):
    """Rows at the register threshold, one past it, and the longest the benchmark uses (the
    looped path), with the default thresholds: 40 rows on a GPU, 2 here on a CPU (Triton's
    interpreter)."""
    rows = 40 if DEVICE.type == "cuda" else 2
    _case(op, (rows,), (n,), torch.bfloat16, "both", backend, weight_dtype=torch.float32)


@pytest.mark.parametrize("n", [9000, 20000])
@pytest.mark.parametrize("op", OPS)
def test_forward_register_path_of_wide_rows(monkeypatch, op, n):
    """Rows of 8193..32768 take the forward's register path (16 or 32 warps) and the looped
    backward: both checked here through Triton (the interpreter on a CPU machine)."""
    if "triton" not in KERNEL_BACKENDS:
        pytest.skip("triton is not available here")
    from fusedops.kernels.triton import layer_norm as kernels

    assert kernels.MAX_FUSED_N < n <= kernels.MAX_FUSED_N_FORWARD
    loop_calls = _spy_forward_loop(monkeypatch)
    _case(op, (2,), (n,), torch.float32, "both", "triton")
    assert not loop_calls  # the forward held the rows in registers


@pytest.mark.parametrize("op", OPS)
def test_forward_second_pass_in_chunks(monkeypatch, op):
    """fp32 rows on 32 warps' 32768 lanes (N = 20000): x takes half the 64 registers a thread
    has, so the forward's second pass reads x again in chunks (no spills; 16-bit x stays in
    registers): the same bits as the second pass over the rows held in registers."""
    if "triton" not in KERNEL_BACKENDS:
        pytest.skip("triton is not available here")
    from fusedops.kernels.triton import layer_norm as kernels

    n = 20000
    block_m, block_n, warps = kernels._register_tile(n)
    assert kernels._forward_chunk(block_m, block_n, warps, 2) == block_n
    x = random_tensor((3, n), torch.float32, DEVICE)
    weight, bias = _params(op, (n,), torch.float32, "both")
    chunk, chunks = kernels._forward_chunk, []

    def recorded(*args):
        chunks.append(chunk(*args))
        return chunks[-1]

    monkeypatch.setattr(kernels, "_forward_chunk", recorded)
    in_chunks = _call(op, x, (n,), weight, bias, "triton")
    monkeypatch.setattr(kernels, "_forward_chunk", lambda block_m, block_n, *_: block_n)
    whole = _call(op, x, (n,), weight, bias, "triton")
    assert chunks == [8192] and block_n == 32768
    assert torch.equal(in_chunks, whole)


@pytest.mark.skipif("triton" not in KERNEL_BACKENDS, reason="needs the Triton backend")
@pytest.mark.parametrize("rows", [1, 5, 64, 65, 200, 528])
@pytest.mark.parametrize("dtypes", [[torch.float32], [torch.bfloat16, torch.float32]], ids=str)
def test_triton_column_sums_of_partial_rows(rows, dtypes):
    """The Triton backward's dweight/dbias reduction (also bias_dropout_add's bias gradient):
    rows of fp32 partial sums of one matrix or two (dweight's and dbias's, summed in the same
    launches) added in one stage up to SPLIT_ROWS (64) rows, in two past it (65: a split of one
    row; 528: an H100's 4 x 132 partial rows), against float64, and the same bits on a second
    call."""
    from fusedops.kernels.triton import layer_norm as kernels

    partial = random_tensor((len(dtypes), rows, 300), torch.float32, DEVICE)
    sums = kernels._column_sums(partial, dtypes)
    for m, (total, dtype) in enumerate(zip(sums, dtypes, strict=True)):
        assert total.dtype == dtype and total.shape == (300,)
        expected, magnitude = partial[m].double().sum(0), partial[m].double().abs().sum(0)
        assert_close(total, expected, terms=rows, magnitude=magnitude)
    again = kernels._column_sums(partial, dtypes)
    assert all(torch.equal(a, b) for a, b in zip(sums, again, strict=True))


# layer_norm.cu's dweight/dbias reduction (column_sum_kernel and its two-launch host side,
# launch_column_sum) compiled by g++ as host code: each launch runs its blocks and threads one
# after another, checking the kernel's index arithmetic on machines without a GPU. The blocks
# run in launch order or in reverse: the first launch adds in place, and a block that read a
# row another block writes (a race on a GPU) gets a different result in one of the two orders.
_COLUMN_SUM_SHIM = """
#include <cstdint>
#include <functional>
#define __global__
#define __launch_bounds__(...)
typedef void* cudaStream_t;
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static dim3 blockIdx(0), threadIdx(0);
static bool reverse_blocks = false;
constexpr int kThreads = %(threads)d;
constexpr int64_t kSplitRows = %(split_rows)d;
template <typename W> W from_float(float v) { return v; }
static void host_launch(dim3 grid, int threads, const std::function<void()>& body) {
  const unsigned blocks = grid.x * grid.y * grid.z;
  for (unsigned b = 0; b < blocks; ++b) {
    const unsigned block = reverse_blocks ? blocks - 1 - b : b;
    blockIdx.x = block %% grid.x;
    blockIdx.y = block / grid.x %% grid.y;
    blockIdx.z = block / (grid.x * grid.y);
    for (threadIdx.x = 0; threadIdx.x < unsigned(threads); ++threadIdx.x) body();
  }
}
"""
_COLUMN_SUM_API = """
extern "C" void host_column_sums(float* partial0, float* out0, float* partial1, float* out1,
                                 int64_t rows, int cols, int reverse) {
  reverse_blocks = reverse != 0;
  launch_column_sums<float>(partial0, out0, partial1, out1, rows, cols, nullptr);
}
"""


def _cut(source: str, start: str) -> str:
    """The text of ``source`` from ``start`` to the end of the function that follows it."""
    first = source.index(start)
    return source[first : source.index("\n}\n", first) + 3]


def _layer_norm_cu() -> str:
    """The text of fusedops/kernels/cuda/layer_norm.cu (skips the test without g++)."""
    import shutil
    from pathlib import Path

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    return (Path(fusedops.__file__).parent / "kernels/cuda/layer_norm.cu").read_text()


def _constants(source: str, *names: str) -> dict[str, int]:
    """The values of integer ``constexpr`` constants of a CUDA source, by name."""
    import re

    return {
        name: int(re.search(rf"constexpr \w+ {name} = (\d+);", source).group(1)) for name in names
    }


@pytest.fixture(scope="module")
def host_column_sums(tmp_path_factory):
    """layer_norm.cu's launch_column_sums<float> as a host function (ctypes)."""
    import re

    source = _layer_norm_cu()
    constants = _constants(source, "kThreads", "kSplitRows")
    first = source.index("template <typename W>\nstruct ColumnSums {")
    code = source[first : source.index("};\n", first) + 3]
    code += _cut(source, "template <typename W>\n__global__ void __launch_bounds__(kThreads)\n"
                 "    column_sum_kernel")  # fmt: skip
    code += _cut(source, "template <typename W>\nvoid launch_column_sums(")
    # name<W><<<grid, threads, 0, stream>>>(args); -> host_launch(dim3(grid), threads, ...)
    code, launches = re.subn(
        r"(\w+<\w+>)<<<(.+?), (\w+), 0, stream>>>\((.*?)\);",
        r"host_launch(dim3(\2), \3, [&] { \1(\4); });",
        code,
        flags=re.DOTALL,
    )
    assert launches == 2, code
    shim = _COLUMN_SUM_SHIM % dict(
        threads=constants["kThreads"], split_rows=constants["kSplitRows"]
    )
    folder = tmp_path_factory.mktemp("column_sum_host")
    return host_library(folder, "column_sum", shim + code + _COLUMN_SUM_API).host_column_sums


@pytest.mark.parametrize("rows", [1, 16, 17, 264, 528])
@pytest.mark.parametrize("cols", [1, 300])
@pytest.mark.parametrize("given", ["dweight", "dbias", "both"])
def test_cuda_column_sums_as_host_code(host_column_sums, rows, cols, given):
    """The CUDA backward's reduction of (rows, cols) fp32 partial rows of dweight, dbias or
    both (one matrix or two in the same launches; one launch up to kSplitRows rows, two past
    it: 17 is a run of one row, 264 an H100's 2 x 132) against float64, the same bits with the
    blocks of each launch run in either order."""
    import ctypes

    partials = [
        random_tensor((rows, cols), torch.float32, torch.device("cpu"))
        if given in (name, "both")
        else None
        for name in ("dweight", "dbias")
    ]
    results = []
    for reverse in (0, 1):
        works = [None if p is None else p.clone() for p in partials]  # the first launch writes
        outs = [None if p is None else torch.full((cols,), float("nan")) for p in partials]
        pointers = [
            ctypes.c_void_p(None if t is None else t.data_ptr())
            for pair in zip(works, outs, strict=True)
            for t in pair
        ]
        host_column_sums(*pointers, ctypes.c_int64(rows), ctypes.c_int(cols), ctypes.c_int(reverse))
        for p, out in zip(partials, outs, strict=True):
            if p is not None:
                magnitude = p.double().abs().sum(0)
                assert_close(out, p.double().sum(0), terms=rows, magnitude=magnitude)
        results.append([o for o in outs if o is not None])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True)), (
        "the result depends on the order of the blocks"
    )


# layer_norm.cu's Moments, merge_moments and block_moments compiled by g++ as host code: a block
# of kThreads host threads calls block_moments, __syncthreads being a barrier of all of them and
# __shfl_xor_sync an exchange through memory between two barriers (every thread of the block
# calls block_moments's shuffles, so a block-wide barrier stands in for the warp's).
_MOMENTS_SHIM = """
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#define __host__
#define __device__
#define __forceinline__ inline
constexpr int kWarp = %(warp)d;
constexpr int kThreads = %(threads)d;
constexpr int kWarpsPerBlock = kThreads / kWarp;
struct HostIndex {
  unsigned x;
};
static thread_local HostIndex threadIdx;
static std::mutex barrier_mutex;
static std::condition_variable barrier_done;
static int barrier_waiting = 0;
static unsigned barrier_generation = 0;
static void __syncthreads() {
  std::unique_lock<std::mutex> lock(barrier_mutex);
  const unsigned generation = barrier_generation;
  if (++barrier_waiting == kThreads) {
    barrier_waiting = 0;
    ++barrier_generation;
    barrier_done.notify_all();
  } else {
    barrier_done.wait(lock, [&] { return barrier_generation != generation; });
  }
}
static float exchange[kThreads];
static float __shfl_xor_sync(unsigned, float v, int offset) {
  exchange[threadIdx.x] = v;
  __syncthreads();
  const float other = exchange[threadIdx.x ^ offset];
  __syncthreads();
  return other;
}
"""
_MOMENTS_API = """
extern "C" void host_block_moments(const Moments* in, Moments* out) {
  static float shared[3 * kWarpsPerBlock];
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([=] {
      threadIdx.x = t;
      out[t] = block_moments(in[t], shared);
    });
  }
  for (std::thread& thread : threads) thread.join();
}
"""


@pytest.fixture(scope="module")
def block_moments(tmp_path_factory):
    """layer_norm.cu's block_moments run by a block of host threads (g++, ctypes): a function
    of the threads' (kThreads,) Moments (a ctypes array) giving each thread's result."""
    import ctypes

    source = _layer_norm_cu()
    constants = _constants(source, "kWarp", "kThreads")
    first = source.index("struct Moments {")
    code = source[first : source.index("};\n", first) + 3]
    code += _cut(source, "__host__ __device__ __forceinline__ Moments merge_moments(")
    code += _cut(source, "__device__ __forceinline__ Moments block_moments(")
    shim = _MOMENTS_SHIM % dict(warp=constants["kWarp"], threads=constants["kThreads"])
    folder = tmp_path_factory.mktemp("moments_host")
    library = host_library(folder, "moments", shim + code + _MOMENTS_API)

    class Moments(ctypes.Structure):
        _fields_ = [("n", ctypes.c_float), ("mean", ctypes.c_float), ("m2", ctypes.c_float)]

    threads = constants["kThreads"]

    def run(moments: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
        assert len(moments) == threads
        out = (Moments * threads)()
        library.host_block_moments((Moments * threads)(*moments), out)
        return [(m.n, m.mean, m.m2) for m in out]

    return run


@pytest.mark.parametrize(
    ("cols", "vec"),
    # fp32 (4 a vector) and 16-bit (8) block rows: 2048 / 4 and 8192 / 8 give every thread the
    # same count; 3000 / 4 and 5000 / 8 two counts; 1032 / 8 and 1536 / 8 leave threads (1032:
    # 127, and 3 whole warps) without values, whose empty sets the merges must skip
    [(2048, 4), (3000, 4), (1032, 8), (1536, 8), (5000, 8), (8192, 8)],
)
@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_cuda_block_moments_match_float64(block_moments, cols, vec, offset):
    """The CUDA forward's one-exchange statistics of a block row read ``vec`` elements at a
    time: each of 256 threads' count, mean and M2 over its values (thread t holds vectors t,
    t + 256, ...; none past the row end), merged by layer_norm.cu's block_moments (a warp
    butterfly, then the warps in order through shared memory), give every thread the same
    bits and the row's mean and variance within fp32's bound (also for values far from 0,
    where a sum of squares minus the squared mean would cancel)."""
    x = random_tensor((cols,), torch.float32, torch.device("cpu")) + offset
    vectors = x.view(-1, vec)
    lanes = []
    for t in range(256):
        own = vectors[t::256].flatten()
        if own.numel() == 0:
            lanes.append((0.0, 0.0, 0.0))
            continue
        mean = own.sum() / own.numel()
        lanes.append((own.numel(), mean.item(), ((own - mean) ** 2).sum().item()))
    results = block_moments(lanes)
    assert len(set(results)) == 1, "threads disagree"
    n, mean, m2 = results[0]
    assert n == cols
    x64 = x.double()
    deviation = (x64 - x64.mean()).abs().sum()
    assert_close(torch.tensor(mean), x64.mean(), terms=cols, magnitude=x64.abs().sum() / cols)
    # M2 from merged means: its error is that of the deviations it sums (each off by the
    # mean's error), in units of the squared deviations' sum
    var = torch.tensor(m2 / cols)
    assert_close(var, x64.var(unbiased=False), terms=cols, magnitude=(deviation**2 / cols) / cols)

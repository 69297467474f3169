"""Bias-dropout-add against its float64 reference on every backend available here, the Philox
mask (statistics, bit-identical on every backend), the backward's mask, the edge cases of p,
the module and the functional names, torch.compile / export, and bad inputs."""

import math

import pytest
import torch

import fusedops
from fusedops.kernels.device import same_device
from fusedops.kernels.shared import philox
from fusedops.ops.bias_dropout_add import draw_seed, keep_mask, native, native_drop_mask, reference
from fusedops.testing import assert_close, non_contiguous, random_tensor
from tests.op_testing import BACKENDS, DEVICE, DTYPES, KERNEL_BACKENDS

# (shape, with bias): quads aligned with rows (H % 4 == 0) or not, one row, larger than a tile
SHAPES = [
    ((1,), True),
    ((1, 1), True),
    ((7,), False),
    ((3, 5, 7), True),
    ((3, 5, 7), False),
    ((4, 36), True),
    ((2, 2050), True),
    ((1025,), False),
    ((0,), True),
    ((4, 0, 3), True),
    ((3, 0), True),
]
P = 0.3


def _seed_of_next_call(seed: int) -> torch.Tensor:
    """The seed an op called right after ``torch.manual_seed(seed)`` draws."""
    torch.manual_seed(seed)
    return draw_seed(torch.device(DEVICE))


def _inputs(shape, dtype, with_bias, residual_dtype=None):
    x = random_tensor(shape, dtype, DEVICE).requires_grad_()
    bias = random_tensor(shape[-1:], dtype, DEVICE).requires_grad_() if with_bias else None
    residual = random_tensor(shape, residual_dtype or dtype, DEVICE).requires_grad_()
    return x, bias, residual


def _expected(x, bias, residual, grad, seed, p, backend="reference"):
    """The float64 reference output and gradients (x, bias, residual) for this seed, with the
    mask ``backend`` draws by default (Philox; native: torch's, ``native_drop_mask``)."""
    impl = native if backend == "native" else reference
    x64, r64 = x.detach().double(), residual.detach().double()
    b64 = None if bias is None else bias.detach().double()
    out = impl.forward(x64, b64, r64, seed, p)
    bias_dtype = None if bias is None else torch.float64
    grad_x, grad_bias = impl.backward(grad.double(), seed, p, torch.float64, bias_dtype)
    return out, grad_x, grad_bias, grad.double()


def _out_bound(backend, x, bias, residual, p=P):
    """assert_close's bound for the output: native on inputs sharing a 16-bit dtype computes in
    it, rounding after each of its three ops (x + bias, the dropout scale, + residual) at the
    intermediates' magnitude, as the torch code it replaces; every other case rounds once."""
    dtypes = {x.dtype, residual.dtype} | ({bias.dtype} if bias is not None else set())
    if backend != "native" or dtypes - {torch.float16, torch.bfloat16} or len(dtypes) > 1:
        return {}
    v = x.detach().double() + (0 if bias is None else bias.detach().double())
    magnitude = v.abs() / (1 - p) + residual.detach().double().abs()
    return {"compute": x.dtype, "terms": 3, "magnitude": magnitude}


def _bias_grad_bound(backend, x, bias, residual, grad_x):
    """assert_close's bound for grad_bias, a sum over rows of grad_x's elements: relative to the
    sum of their magnitudes. Native on inputs sharing a 16-bit dtype rounds each term to it
    before torch's fp32 accumulation (compute in that dtype, one rounding per term); the other
    cases sum fp32 terms (an fp32 rounding per summed row)."""
    columns = bias.shape[-1]
    magnitude = grad_x.abs().reshape(-1, columns).sum(0) if columns else grad_x.new_zeros(0)
    if _out_bound(backend, x, bias, residual):
        return {"compute": x.dtype, "magnitude": magnitude}
    return {"terms": max(1, grad_x.numel() // max(columns, 1)), "magnitude": magnitude}


def _run(backend, x, bias, residual, grad, seed_value, p=P, **kwargs):
    torch.manual_seed(seed_value)
    out = fusedops.bias_dropout_add(x, bias, residual, p, backend=backend, **kwargs)
    out.backward(grad)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "with_bias"), SHAPES)
def test_forward_backward_match_reference(backend, dtype, shape, with_bias):
    x, bias, residual = _inputs(shape, dtype, with_bias)
    grad = random_tensor(shape, dtype, DEVICE)
    out = _run(backend, x, bias, residual, grad, 7)
    bound = _out_bound(backend, x, bias, residual)
    want = _expected(x, bias, residual, grad, _seed_of_next_call(7), P, backend)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, want[0], msg="out", **bound)
    assert_close(x.grad, want[1], msg="grad_x")
    if bias is not None:
        bias_bound = _bias_grad_bound(backend, x, bias, residual, want[1])
        assert_close(bias.grad, want[2], msg="grad_bias", **bias_bound)
    assert_close(residual.grad, want[3], msg="grad_residual")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wider_residual_upcasts_x_and_bias(backend, dtype):
    """An fp32 residual stream with 16-bit x and bias: fp32 output, gradients in each input's
    own dtype."""
    x, bias, residual = _inputs((5, 12), dtype, True, residual_dtype=torch.float32)
    grad = random_tensor((5, 12), torch.float32, DEVICE)
    out = _run(backend, x, bias, residual, grad, 3)
    want = _expected(x, bias, residual, grad, _seed_of_next_call(3), P, backend)
    assert out.dtype == torch.float32
    assert (x.grad.dtype, bias.grad.dtype, residual.grad.dtype) == (dtype, dtype, torch.float32)
    assert_close(out, want[0], dtype=torch.float32)
    assert_close(x.grad, want[1])
    assert_close(bias.grad, want[2])
    assert_close(residual.grad, want[3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_and_broadcast_residual(backend):
    base = random_tensor((6, 20), torch.float32, DEVICE)
    x = non_contiguous(base).requires_grad_()
    bias = random_tensor((1, 20), torch.float32, DEVICE).requires_grad_()  # (1, H) bias
    residual = random_tensor((20,), torch.float32, DEVICE).requires_grad_()  # broadcasts
    grad = non_contiguous(random_tensor((6, 20), torch.float32, DEVICE))
    assert not x.is_contiguous() and not grad.is_contiguous()
    out = _run(backend, x, bias, residual, grad, 11)
    seed = _seed_of_next_call(11)
    full_residual = residual.detach().expand(6, 20)
    want = _expected(base, bias.reshape(20), full_residual, grad, seed, P, backend)
    assert_close(out, want[0])
    assert_close(x.grad, want[1])
    assert bias.grad.shape == (1, 20) and residual.grad.shape == (20,)
    assert_close(bias.grad, want[2].view(1, 20))
    assert_close(residual.grad, grad.double().sum(0))


def _kept_output(backend, shape, p, seed, with_bias=True):
    """The output of ones + 0 bias + 0 residual: scale where kept, 0 where dropped."""
    x = torch.ones(shape, device=DEVICE)
    bias = torch.zeros(shape[-1:], device=DEVICE) if with_bias else None
    residual = torch.zeros(shape, device=DEVICE)
    generator = torch.Generator(DEVICE).manual_seed(seed)
    return fusedops.bias_dropout_add(x, bias, residual, p, generator=generator, backend=backend)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize(
    ("shape", "with_bias"), [((9, 37), True), ((8, 64), True), ((999,), False)]
)
def test_kernel_masks_equal_the_reference_bit_for_bit(backend, shape, with_bias):
    """The same (seed, offset) gives the same mask on the kernel as in the reference's integer
    arithmetic, on both of the kernels' mask paths (quads along rows or per element)."""
    for p in (0.1, 0.5, 0.9):
        out = _kept_output(backend, shape, p, seed=5, with_bias=with_bias)
        want = _kept_output("reference", shape, p, seed=5, with_bias=with_bias)
        assert torch.equal(out, want), p


def test_mask_is_philox_words_against_the_threshold():
    """The reference's mask is its own definition: words of counter offset + i // 4, kept iff
    >= floor(p * 2^32); Philox4x32-10 matches the published known-answer vectors."""

    def words(*values):
        return [int(w) for w in philox.philox4x32_10(*torch.tensor(values))]

    counter, key = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)
    assert words(*counter, *key) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    assert words(0, 0, 0, 0, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    # seed [key 12345, offset 678]: elements 8..11 take the words of counter 678 + 2
    mask = keep_mask(torch.tensor([12345, 678]), 0.5, 12)
    assert mask[8:12].tolist() == [w >= 2**31 for w in words(678 + 2, 0, 0, 0, 12345, 0)]
    assert philox.keep_threshold(0.25) == 2**30 and philox.keep_threshold(1.0) == 2**32


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_scale(p):
    """Over 1e6 elements the kept fraction is within 4 standard deviations of 1 - p, and kept
    values are x * 1 / (1 - p) exactly (float64 reference; fp32 and the interpreted Triton
    kernel on 2^16 elements)."""
    cases = [("reference", torch.float64, 10**6), ("native", torch.float32, 10**6)]
    cases += [(backend, torch.float32, 2**16) for backend in KERNEL_BACKENDS]
    for backend, dtype, n in cases:
        x = torch.ones(n, dtype=dtype, device=DEVICE)
        out = fusedops.bias_dropout_add(x, None, torch.zeros_like(x), p, backend=backend)
        kept = out != 0
        fraction = kept.double().mean().item()
        assert abs(fraction - (1 - p)) <= 4 * math.sqrt(p * (1 - p) / n), (backend, fraction)
        scale = torch.tensor(1 / (1 - p), dtype=torch.float64).to(dtype)
        assert torch.all(out[kept] == scale), backend


@pytest.mark.parametrize("how", ["argument", "env"])
def test_portable_mask_is_the_philox_mask_on_native(monkeypatch, how):
    """portable_mask=True (or FUSEDOPS_PORTABLE_DROPOUT=1) gives native the reference's Philox
    mask bit for bit, forward and backward. Without it native draws ``native_drop_mask``: on
    the CPU torch's uniform numbers below p (other bits), on other devices the Philox words
    themselves (no host sync), so there the flag changes nothing (the 2026-11-26 H200 run:
    equal)."""
    kwargs = {"portable_mask": True} if how == "argument" else {}
    if how == "env":
        monkeypatch.setenv("FUSEDOPS_PORTABLE_DROPOUT", "1")
    x, bias, residual = _inputs((9, 37), torch.float32, True)
    grad = random_tensor((9, 37), torch.float32, DEVICE)
    out = _run("native", x, bias, residual, grad, 4, p=0.5, **kwargs)
    want = _expected(x, bias, residual, grad, _seed_of_next_call(4), 0.5)
    assert torch.equal(out == residual, want[0] == residual.double())
    assert torch.equal(x.grad == 0, want[1] == 0)
    assert_close(out, want[0])
    assert_close(x.grad, want[1])
    monkeypatch.delenv("FUSEDOPS_PORTABLE_DROPOUT", raising=False)
    torch.manual_seed(4)
    default = fusedops.bias_dropout_add(x, bias, residual, 0.5, backend="native") == residual
    assert torch.equal(default, native_drop_mask(_seed_of_next_call(4), 0.5, x.shape))
    philox_drop = out == residual
    if DEVICE.type == "cpu":  # torch's uniform numbers: other bits
        assert not torch.equal(default, philox_drop)
    else:  # the Philox words: portable_mask changes nothing
        assert torch.equal(default, philox_drop)
    with pytest.raises(TypeError, match="portable_mask"):
        fusedops.bias_dropout_add(x, bias, residual, 0.5, portable_mask="yes")


def test_native_mask_is_seeded_by_the_op_seed_and_drops_nan():
    """The native drop mask is torch's uniform numbers below p from the seed's key (CPU; the
    Philox words on other devices): the same seed, the same mask; dropped elements are 0 even
    where x is NaN/inf, in eager mode (torch's autograd) and in the custom op (the native
    namespace)."""
    seed = draw_seed(DEVICE)
    first, again = (native_drop_mask(seed, 0.3, (50, 40)) for _ in range(2))
    assert torch.equal(first, again) and first.shape == (50, 40)
    assert not torch.equal(first, native_drop_mask(draw_seed(DEVICE), 0.3, (50, 40)))
    if seed.device.type == "cpu":
        # a fresh generator seeded with the key, whatever masks this thread drew before
        native_drop_mask(draw_seed(DEVICE), 0.7, (3, 5))
        fresh = torch.Generator().manual_seed(seed.tolist()[0])
        expected = torch.rand((50, 40), generator=fresh) < 0.3
        assert torch.equal(native_drop_mask(seed, 0.3, (50, 40)), expected)
    x = torch.full((50, 40), float("nan"), device=DEVICE)
    x[::2] = float("inf")
    residual = torch.zeros_like(x)
    eager = fusedops.bias_dropout_add(x, None, residual, 0.3, backend="native")
    assert eager.isnan().any() and torch.all(eager[~(eager.isnan() | eager.isinf())] == 0)
    torch.manual_seed(1)
    eager = fusedops.bias_dropout_add(x, None, residual, 0.3, backend="native")
    torch.manual_seed(1)
    op_seed = draw_seed(DEVICE)
    from_op = torch.ops.fusedops.bias_dropout_add(x, None, residual, op_seed, 0.3, "native", False)
    assert torch.equal(eager.isnan() | eager.isinf(), from_op.isnan() | from_op.isinf())
    assert torch.equal(eager == 0, native_drop_mask(op_seed, 0.3, x.shape))


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_mask_different_calls_different_masks(backend):
    x = random_tensor((8, 32), torch.float32, DEVICE)
    residual = torch.zeros_like(x)
    torch.manual_seed(0)
    first = fusedops.bias_dropout_add(x, None, residual, 0.5, backend=backend)
    second = fusedops.bias_dropout_add(x, None, residual, 0.5, backend=backend)
    torch.manual_seed(0)
    again = fusedops.bias_dropout_add(x, None, residual, 0.5, backend=backend)
    assert torch.equal(first, again)
    assert not torch.equal(first == 0, second == 0)
    # generator=: reproducible on its own, and the default generator is left alone
    state = torch.random.get_rng_state()
    outs = [_kept_output(backend, (8, 32), 0.5, seed=9) for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(6, 40), (5, 7)])
def test_backward_mask_equals_forward_mask(backend, shape):
    """grad_x is 0 exactly where the output took no x, scale * grad where it did; grad_bias is
    grad_x summed over the leading dims."""
    x, bias, _ = _inputs(shape, torch.float32, True)
    residual = torch.zeros(shape, device=DEVICE)
    out = fusedops.bias_dropout_add(x, bias, residual, 0.4, backend=backend)
    grad = random_tensor(shape, torch.float32, DEVICE)
    out.backward(grad)
    took_x = out != 0  # x + bias is never exactly 0 here with probability 1
    assert torch.all(x.grad[~took_x] == 0)
    assert_close(x.grad[took_x], grad[took_x].double() / 0.6)
    assert_close(bias.grad, x.grad.double().sum(0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_p0_p1_and_inference_are_exact_and_draw_nothing(backend):
    x, bias, residual = _inputs((4, 12), torch.float32, True)
    plain = (x + bias) + residual
    state = torch.random.get_rng_state()
    for p, training in ((0.0, True), (0.7, False)):
        out = fusedops.bias_dropout_add(x, bias, residual, p, training=training, backend=backend)
        assert torch.equal(out, plain)
    out = fusedops.bias_dropout_add(x, bias, residual, 1.0, backend=backend)
    assert torch.equal(out, residual)
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert torch.equal(bias.grad, torch.zeros_like(bias))
    assert torch.equal(residual.grad, torch.ones_like(residual))
    assert torch.equal(state, torch.random.get_rng_state())


def test_info_lists_the_op():
    """``python -m fusedops info`` prints every op of this table."""
    fusedops.ops.load_all()
    assert "bias_dropout_add" in fusedops.dispatch.availability()


def test_module_train_eval_and_state_dict():
    module = fusedops.nn.BiasDropoutAdd(0.5)
    assert module.state_dict() == {} and "p=0.5" in repr(module)
    x, bias, residual = _inputs((4, 16), torch.float32, True)
    torch.manual_seed(2)
    out = module(x, bias, residual)
    torch.manual_seed(2)
    assert torch.equal(out, fusedops.bias_dropout_add(x, bias, residual, 0.5))
    assert torch.equal(module.eval()(x, bias, residual), (x + bias) + residual)


def test_megatron_and_seed_runtime_names():
    x, bias, residual = _inputs((3, 8), torch.float32, True)
    torch.manual_seed(4)
    out = fusedops.bias_dropout_add_fused_train((x, bias), residual, 0.2)
    torch.manual_seed(4)
    assert torch.equal(out, fusedops.bias_dropout_add(x, bias, residual, 0.2))
    inference = fusedops.bias_dropout_add_fused_inference((x, None), residual, 0.2)
    assert torch.equal(inference, x + residual)
    torch.manual_seed(4)
    out = fusedops.nn.dropout_add_fused_train(x, residual, 0.2)
    torch.manual_seed(4)
    assert torch.equal(out, fusedops.bias_dropout_add(x, None, residual, 0.2))
    assert torch.equal(fusedops.nn.dropout_add_fused(x, residual, 0.2), x + residual)


def test_gradcheck_reference():
    x = random_tensor((3, 8), torch.float64, "cpu").requires_grad_()
    bias = random_tensor((8,), torch.float64, "cpu").requires_grad_()
    residual = random_tensor((3, 8), torch.float64, "cpu").requires_grad_()

    def fn(x, bias, residual):
        generator = torch.Generator().manual_seed(1)  # the same mask on every call
        return fusedops.bias_dropout_add(
            x, bias, residual, 0.3, generator=generator, backend="reference"
        )

    assert torch.autograd.gradcheck(fn, (x, bias, residual))


class Block(torch.nn.Module):
    """h = x W^T, then x + dropout(h + b) through fusedops.nn.BiasDropoutAdd."""

    def __init__(self, dim=8, p=0.25):
        super().__init__()
        self.linear = torch.nn.Linear(dim, dim)
        self.drop_add = fusedops.nn.BiasDropoutAdd(p)

    def forward(self, x):
        h = torch.nn.functional.linear(x, self.linear.weight)
        return self.drop_add(h, self.linear.bias, x)


def test_torch_compile_no_graph_break_same_mask_as_eager():
    torch._dynamo.reset()
    model = Block().to(DEVICE)
    x = random_tensor((5, 8), torch.float32, DEVICE).requires_grad_()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.manual_seed(6)
    out = compiled(x)
    out.sum().backward()
    grads = [x.grad.clone(), model.linear.bias.grad.clone()]
    x.grad = None
    model.zero_grad()
    torch.manual_seed(6)
    want = model(x)
    want.sum().backward()
    assert torch.equal(out, want)
    assert torch.equal(grads[0], x.grad) and torch.equal(grads[1], model.linear.bias.grad)


def test_opcheck():
    x, bias, residual = _inputs((3, 8), torch.float32, True)
    seed = draw_seed(x.device)
    op = torch.ops.fusedops.bias_dropout_add.default
    for args in ((x, bias, residual, seed, 0.3, None), (x, None, residual, None, 0.0, None)):
        torch.library.opcheck(op, args)
    grad = random_tensor((3, 8), torch.float32, DEVICE)
    backward = torch.ops.fusedops.bias_dropout_add_backward.default
    torch.library.opcheck(backward, (grad, seed, 0.3, torch.float32, torch.float32, None))


def test_torch_export_keeps_the_custom_op():
    model = Block()
    x = random_tensor((2, 8), torch.float32, "cpu")
    exported = torch.export.export(model, (x,))
    assert "fusedops.bias_dropout_add" in str(exported.graph)
    torch.manual_seed(8)
    got = exported.module()(x)
    torch.manual_seed(8)
    assert torch.equal(got, model(x))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r, "0.1"), TypeError, "p must be"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r, 1.5), ValueError, "p must be"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r, -0.1), ValueError, "p must be"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r, math.nan), ValueError, "p must be"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r, True), TypeError, "p must be"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b[:3], r, 0.1), ValueError, "bias has"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r[:, :3], 0.1), ValueError, "residual"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r.T, 0.1), ValueError, "residual"),
        (lambda x, b, r: fusedops.bias_dropout_add(x.long(), b, r, 0.1), TypeError, "x has"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b.int(), r, 0.1), TypeError, "bias has"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r.long(), 0.1), TypeError, "residual"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b, r.to("meta"), 0.1), ValueError,
         "residual is on meta"),
        (lambda x, b, r: fusedops.bias_dropout_add(x, b.to("meta"), r, 0.1), ValueError,
         "bias is on meta"),
        (lambda x, b, r: fusedops.bias_dropout_add([1.0], b, r, 0.1), TypeError, "x must be"),
        (lambda x, b, r: fusedops.bias_dropout_add_fused_train(x, r, 0.1), TypeError,
         "x_with_bias"),
        (lambda x, b, r: fusedops.bias_dropout_add_fused_train((x, b), r, 2), ValueError,
         "prob must be"),
        (lambda x, b, r: fusedops.nn.dropout_add_fused_train(x, r[:1, :2], 0.1), ValueError,
         "to_add"),
        (lambda x, b, r: fusedops.nn.dropout_add_fused(x, r, None), TypeError, "drop_rate"),
        (lambda x, b, r: fusedops.nn.BiasDropoutAdd(7), ValueError, "p must be"),
    ],
)  # fmt: skip
def test_bad_inputs_name_the_argument(call, error, match):
    x, bias, residual = torch.ones(4, 6), torch.ones(6), torch.ones(4, 6)
    with pytest.raises(error, match=match):
        call(x, bias, residual)


def test_zero_dim_x_with_a_bias_is_refused_and_without_runs_everywhere():
    """A bias is added along x's last dim: a 0-d x has none (ValueError naming x); without a
    bias a 0-d x is one element, on every backend."""
    x, bias, residual = torch.tensor(1.5), torch.ones(1), torch.tensor(0.25)
    with pytest.raises(ValueError, match="x is 0-d.*bias"):
        fusedops.bias_dropout_add(x, bias, residual, 0.0)
    with pytest.raises(ValueError, match=r"x_with_bias\[0\] is 0-d"):
        fusedops.bias_dropout_add_fused_train((x, bias), residual, 0.1)
    for backend in BACKENDS:
        x = torch.tensor(1.5, device=DEVICE).requires_grad_()
        out = fusedops.bias_dropout_add(x, None, residual.to(DEVICE), 0.0, backend=backend)
        assert out.shape == () and out.item() == 1.75
        out.backward()
        assert x.grad.shape == () and x.grad.item() == 1.0


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_a_float64_bias_is_not_taken_by_the_kernels(backend):
    """fp64 anywhere means fp64 math (the module docstring): an fp64 bias with fp32 x and
    residual must not run the fp32 kernels, which an explicit choice of one reports."""
    x, residual = torch.ones(3, 8, device=DEVICE), torch.ones(3, 8, device=DEVICE)
    bias = torch.ones(8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(fusedops.BackendUnavailableError, match="bias has dtype torch.float64"):
        fusedops.bias_dropout_add(x, bias, residual, 0.1, backend=backend)
    chosen = fusedops.dispatch.select_name("bias_dropout_add", x, residual, bias.float())
    assert chosen == ("native" if DEVICE.type == "cpu" else "cuda")


@pytest.mark.parametrize("backend", [None, "reference"])
def test_a_float64_bias_runs_float64_math_in_both_directions(backend):
    """An fp64 bias with fp32 x and residual: the automatic pick (None) runs no kernel (they
    refuse fp64, see above) and, like the forced reference, computes in float64: the float64
    formula's output rounded once to x's dtype, an fp64 bias gradient."""
    x, _, residual = _inputs((4, 8), torch.float32, False)
    bias = random_tensor((8,), torch.float64, DEVICE).requires_grad_()
    grad = random_tensor((4, 8), torch.float32, DEVICE)  # out's dtype: autograd would round it
    out = _run(backend, x, bias, residual, grad, 5)
    assert fusedops.dispatch.last_used["bias_dropout_add"] not in KERNEL_BACKENDS
    mask_of = "native" if backend is None else backend  # the pick runs native
    want = _expected(x, bias, residual, grad, _seed_of_next_call(5), P, mask_of)
    assert out.dtype == torch.float32 and bias.grad.dtype == torch.float64
    assert_close(out, want[0], msg="out")
    assert_close(x.grad, want[1], msg="grad_x")
    assert_close(bias.grad, want[2], scale=math.sqrt(4), msg="grad_bias")


def test_generator_on_another_device_is_named():
    x = torch.ones(3, device="meta")
    with pytest.raises(ValueError, match="generator is on cpu but x is on meta"):
        fusedops.bias_dropout_add(x, None, x, 0.5, generator=torch.Generator())


def test_generator_device_without_index_is_the_current_device(monkeypatch):
    """``torch.Generator("cuda").device`` has no index while a tensor's has one: the check
    compares types and indices, None read as the current device (0 before CUDA starts, found
    without starting it), so only another type or another index is refused."""
    cuda, cuda0, cuda1 = (torch.device(d) for d in ("cuda", "cuda:0", "cuda:1"))
    started = torch.cuda.is_initialized()
    assert same_device(cuda, cuda0) and same_device(cuda0, cuda) and same_device(cuda1, cuda1)
    assert not same_device(cuda, cuda1) and not same_device(cuda0, cuda1)
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cpu"), cuda0) and not same_device(
        cuda, torch.device("meta")
    )
    assert torch.cuda.is_initialized() == started  # asking started nothing
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device(cuda, cuda1) and not same_device(cuda, cuda0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generator_of_the_device_type_without_index_is_accepted(backend):
    """A generator made from the bare type name (``torch.Generator("cpu")`` /
    ``torch.Generator("cuda")``) drives the op on a tensor of that device, the same mask from
    the same seed as a generator with the index."""
    x = torch.ones(4, 33, device=DEVICE)
    zeros = torch.zeros_like(x)
    bare = torch.Generator(x.device.type).manual_seed(21)
    indexed = torch.Generator(x.device).manual_seed(21)
    out = fusedops.bias_dropout_add(x, None, zeros, 0.5, generator=bare, backend=backend)
    want = fusedops.bias_dropout_add(x, None, zeros, 0.5, generator=indexed, backend=backend)
    assert torch.equal(out, want) and bool((out == 0).any())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "with_bias"), [((33, 1028), True), ((7, 9), True), ((4097,), False)]
)
def test_every_backend_and_the_cpu_reference_share_the_mask(backend, dtype, shape, with_bias):
    """The same generator seed (a fresh one each run) gives the same mask from every backend
    here on DEVICE and from the reference on the CPU. x is ones, bias and residual zeros, so
    the output is exactly the mask times 1 / (1 - p): compared bit for bit."""
    generator = torch.Generator(DEVICE)
    generator.seed()
    seed = draw_seed(DEVICE, generator)
    x = torch.ones(shape, dtype=dtype, device=DEVICE)
    bias = torch.zeros(shape[-1:], dtype=dtype, device=DEVICE) if with_bias else None
    residual = torch.zeros(shape, dtype=dtype, device=DEVICE)
    op = fusedops.ops.bias_dropout_add.BIAS_DROPOUT_ADD
    # portable=True: native draws the Philox mask too (its default on the CPU is torch's mask)
    want = op(x.cpu(), None if bias is None else bias.cpu(), residual.cpu(), seed.cpu(), 0.5,
              "reference", True)  # fmt: skip
    assert 0 < torch.count_nonzero(want) < want.numel()  # some kept, some dropped
    out = op(x, bias, residual, seed, 0.5, backend, True)
    assert out.device.type == DEVICE.type
    assert torch.equal(out.cpu(), want), backend


@pytest.mark.gpu
def test_cuda_is_picked_automatically_and_runs_without_host_sync(monkeypatch):
    """gpu-only: the automatic pick for CUDA tensors and the absence of host syncs (CUDA's
    sync debug mode) exist only on a GPU."""
    # the automatic pick takes kernels not verified on a GPU only with FUSEDOPS_UNVERIFIED=1
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    x, bias, residual = _inputs((64, 256), torch.bfloat16, True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fusedops.bias_dropout_add(x, bias, residual, 0.1)
        out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert fusedops.dispatch.last_used["bias_dropout_add"] == "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_and_wide_rows(backend):
    """Storage offsets that break 16-byte alignment: 1 element (the CUDA kernel's one-element
    accesses) and 4 elements (8 bytes: a quad per access), and rows wider than a block (several
    column blocks in the backward)."""

    def shifted(shape, offset):
        n = math.prod(shape)
        return random_tensor((n + offset,), torch.float16, DEVICE)[offset:].view(shape)

    for shape, offset in (((3, 4100), 1), ((5, 9000), 1), ((5, 9000), 4)):
        x = shifted(shape, offset).requires_grad_()
        bias = random_tensor(shape[-1:], torch.float16, DEVICE).requires_grad_()
        residual = shifted(shape, offset)
        grad = shifted(shape, offset)
        out = _run(backend, x, bias, residual, grad, 13)
        want = _expected(x, bias, residual, grad, _seed_of_next_call(13), P, backend)
        assert_close(out, want[0], **_out_bound(backend, x, bias, residual))
        assert_close(x.grad, want[1])
        assert_close(bias.grad, want[2], scale=math.sqrt(shape[0]))

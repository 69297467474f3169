"""Window attention against its float64 reference, every backend available here.

The shape matrix covers N in {1, 16, 49, 64, 144, 256} and d in {16, 32, 64} (and 128) across
the cases, with and without bias and mask, -100 and -inf masks, window counts that are not a
multiple of any block, fp32/fp16/bf16; not the full cross product (Triton runs interpreted on
a CPU machine).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fusedops
from fusedops._env import triton_interpreter
from fusedops.ops.window_attention import reference
from fusedops.testing import TF32, TF32X3, assert_close, non_contiguous, random_tensor
from tests.op_testing import BACKENDS, DEVICE, KERNEL_BACKENDS

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
GRAD_SCALE = 4.0

# (windows Z = batch * nW, heads, N, d, bias, mask: None | (nW, fill value), dtype)
CASES = [
    (3, 2, 1, 16, True, None, F32),
    # a program's d_bias partial sums 2 windows on the CPU (fp32: in memory, 16-bit: registers)
    (4, 1, 16, 16, True, None, F32),
    (4, 1, 16, 16, True, None, BF16),
    (4, 3, 16, 32, True, (2, -100.0), F16),
    (6, 2, 49, 32, True, (3, -100.0), BF16),  # Swin: 7x7 windows, shift mask
    (5, 1, 49, 16, False, (5, float("-inf")), F32),
    (2, 2, 64, 64, True, None, BF16),
    (3, 1, 33, 64, False, None, F16),
    (2, 1, 144, 16, True, (1, -100.0), F32),  # 12x12 windows: several blocks
    (1, 1, 256, 32, True, (1, float("-inf")), F16),
    (2, 1, 20, 128, True, (2, -100.0), F32),
    (2, 1, 49, 128, True, (2, -100.0), BF16),  # one query block, two key blocks of 32
    # fp32 (3-pass TF32 on a GPU) at d = 128 over several key blocks: the sweep's second-tier
    # launches, query blocks of 16 in the backward and the dq kernel
    (2, 1, 40, 128, True, (2, -100.0), F32),
]


def _case_id(case):
    z, h, n, d, bias, mask, dtype = case
    masked = "nomask" if mask is None else f"mask{mask[1]:g}"
    return f"Z{z}-H{h}-N{n}-d{d}-{'bias' if bias else 'nobias'}-{masked}-{str(dtype)[6:]}"


def _mask(windows: int, n: int, fill: float, dtype=F32) -> torch.Tensor:
    """A (windows, n, n) mask of 0 and ``fill``, at least one key of each row left open."""
    keep = torch.rand(windows, n, n, device=DEVICE) > 0.4
    keep[:, :, 0] = True
    return torch.zeros(windows, n, n, dtype=dtype, device=DEVICE).masked_fill(~keep, fill)


def _inputs(z, h, n, d, dtype, bias=True, mask=None):
    q, k, v = (random_tensor((z, h, n, d), dtype, DEVICE).requires_grad_() for _ in range(3))
    b = random_tensor((h, n, n), dtype, DEVICE).requires_grad_() if bias else None
    m = _mask(mask[0], n, mask[1]) if mask is not None else None
    return q, k, v, b, m


def _expected(q, k, v, bias, mask, dout, scale):
    """Output and (dq, dk, dv, dbias) from the reference in float64."""
    c = [t.detach().double() if t is not None else None for t in (q, k, v, bias, mask)]
    out, lse = reference.forward(*c, scale)
    grads = reference.backward(dout.double(), *c, lse, scale, bias is not None)
    return out, grads


def _check(q, k, v, bias, mask, backend, scale=None, compute=None):
    out = fusedops.window_attention(q, k, v, bias, mask, scale, backend=backend)
    dout = random_tensor(out.shape, out.dtype, DEVICE)
    out.backward(dout)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = q.dtype  # the precision the kernels compute in, whatever the bias dtype
    if compute is None and backend == "triton" and dtype == F32:
        # fp32 products on tensor cores: three TF32 passes while torch's allow_tf32 is off
        from fusedops.kernels.triton import window_attention as kernels

        compute = TF32 if kernels.tf32_allowed() else TF32X3
    expected, (dq, dk, dv, dbias) = _expected(q, k, v, bias, mask, dout, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close(out, expected, dtype=dtype, compute=compute, msg="out")
    # 16-bit kernels round P and dS to the input dtype before the products (as flash attention
    # does): up to ~1.1x the table's tolerance measured (Triton, interpreted), whatever N
    assert_close(q.grad, dq, dtype=dtype, scale=GRAD_SCALE, compute=compute, msg="dq")
    assert_close(k.grad, dk, dtype=dtype, scale=GRAD_SCALE, compute=compute, msg="dk")
    assert_close(v.grad, dv, dtype=dtype, scale=GRAD_SCALE, compute=compute, msg="dv")
    if bias is not None:
        assert bias.grad.dtype == bias.dtype
        windows = max(1.0, math.sqrt(q.shape[0] / 4))  # a sum over windows
        assert_close(
            bias.grad, dbias, dtype=dtype, scale=GRAD_SCALE * windows, compute=compute, msg="dbias"
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_and_gradients_match_reference(backend, case):
    z, h, n, d, bias, mask, dtype = case
    _check(*_inputs(z, h, n, d, dtype, bias, mask), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zeros_not_nan(backend):
    q, k, v, bias, _ = _inputs(4, 2, 16, 16, F32)
    mask = _mask(2, 16, float("-inf"))
    mask[0, 3, :] = float("-inf")  # row 3 of every even window sees no key
    mask[1, :, :] = float("-inf")  # every row of every odd window
    out = fusedops.window_attention(q, k, v, bias, mask, backend=backend)
    assert torch.equal(out[0::2, :, 3], torch.zeros_like(out[0::2, :, 3]))
    assert torch.equal(out[1::2], torch.zeros_like(out[1::2]))
    q.grad = k.grad = v.grad = bias.grad = None
    _check(q, k, v, bias, mask, backend)
    for t in (q.grad, k.grad, v.grad, bias.grad):
        assert torch.isfinite(t).all()
    assert torch.equal(q.grad[1::2], torch.zeros_like(q.grad[1::2]))


def _softmax_oracle(q, k, v, bias, mask, scale):
    """torch.softmax(scores) @ v in float64, a row of -inf alone giving zeros."""
    c = [t.detach().double() if t is not None else None for t in (q, k, v, bias, mask)]
    s = c[0] @ c[1].transpose(-1, -2) * scale + c[3]
    s = (s.view(-1, c[4].shape[0], *s.shape[1:]) + c[4][None, :, None]).view(s.shape)
    probs = torch.where(torch.isneginf(s).all(-1, keepdim=True), 0.0, torch.softmax(s, -1))
    return probs @ c[2]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("backend", [*BACKENDS, "xla"])
def test_rows_with_nan_or_inf_scores_give_nan_rows(backend):
    """As the Swin softmax: a score row holding NaN or +inf gives a NaN output row (softmax
    is NaN there, as torch's), even where the row's other scores are all -inf; a row of -inf
    alone gives zeros."""
    q, k, v, bias, _ = _inputs(4, 2, 16, 16, F32)
    mask = _mask(2, 16, float("-inf"))
    mask[1, 3, :] = float("-inf")  # row 3 of the odd windows: fully masked...
    mask[1, 3, 9] = float("nan")  # ... but for a NaN
    mask[1, 5, :] = float("-inf")  # row 5 of the odd windows: fully masked
    mask[0, 6, 2] = float("nan")
    mask[0, 7, 4] = float("inf")
    if backend == "xla":
        jnp = pytest.importorskip("jax.numpy")
        from fusedops.xla import lower

        args = [jnp.asarray(t.detach().cpu().numpy()) for t in (q, k, v, bias, mask)]
        out, _ = lower.LOWERINGS[torch.ops.fusedops.window_attention.default](*args, 0.25)
        out = torch.from_numpy(np.asarray(out).copy()).to(DEVICE)
    else:
        out = fusedops.window_attention(q, k, v, bias, mask, 0.25, backend=backend)
    expected = _softmax_oracle(q, k, v, bias, mask, 0.25)
    for window, row in ((1, 3), (0, 6), (0, 7)):
        assert expected[window::2, :, row].isnan().all()
    assert torch.equal(
        expected[1::2, :, 5], torch.zeros(2, 2, 16, dtype=torch.float64, device=DEVICE)
    )
    assert_close(out, expected)  # NaN exactly where the oracle has NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_dtype_and_bias_dtype_may_differ_from_q(backend):
    """fp32 bias and mask with bf16 q, as under autocast with Swin's fp32 parameters."""
    q, k, v, _, mask = _inputs(4, 2, 49, 32, BF16, bias=False, mask=(2, -100.0))
    bias = random_tensor((2, 49, 49), F32, DEVICE).requires_grad_()
    _check(q, k, v, bias, mask.to(BF16), backend)
    assert bias.grad.dtype == F32


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_explicit_scale(backend):
    """q, k, v as HF models pass them ((B, N, H, d) transposed), and with a unit-stride-free
    last dim; an explicit scale."""
    z, h, n, d = 3, 2, 20, 16
    q, k = (random_tensor((z, n, h, d), F32, DEVICE).transpose(1, 2) for _ in range(2))
    v = non_contiguous(random_tensor((z, h, n, d), F32, DEVICE))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert not q.is_contiguous() and v.stride(-1) == 2
    bias = random_tensor((h, n, n), F32, DEVICE).requires_grad_()
    _check(q, k, v, bias, _mask(3, n, -100.0), backend, scale=0.3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend):
    q, k, v, bias, mask = _inputs(0, 2, 16, 16, F32, mask=(1, -100.0))
    out = fusedops.window_attention(q, k, v, bias, mask, backend=backend)
    assert out.shape == (0, 2, 16, 16)
    out.sum().backward()
    assert q.grad.shape == q.shape
    assert torch.equal(bias.grad, torch.zeros_like(bias))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_bias_gradient_is_deterministic(backend):
    q, k, v, bias, mask = _inputs(7, 2, 49, 32, F16, mask=(7, -100.0))
    dout = random_tensor(q.shape, F16, DEVICE)
    grads = []
    for _ in range(2):
        bias.grad = None
        fusedops.window_attention(q, k, v, bias, mask, backend=backend).backward(dout)
        grads.append(bias.grad.clone())
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("n", [49, 144])
def test_fp32_products_follow_torch_tf32_setting(monkeypatch, n):
    """Triton's fp32 products run on tensor cores with torch matmul's contract: plain TF32
    where ``torch.backends.cuda.matmul`` allows it (then TF32 tolerances), 3-pass TF32
    otherwise; the short-window kernels (N <= 64) and the blocked ones (N = 144) alike."""
    from fusedops.kernels import device
    from fusedops.kernels.triton import window_attention as kernels

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        for precision, allowed in (("tf32", True), ("ieee", False)):
            matmul.fp32_precision = precision
            assert device.tf32_allowed() is allowed
    finally:
        matmul.fp32_precision = before
    for tf32, precision in ((False, "tf32x3"), (True, "tf32")):
        for options in kernels.launch_options(n, 16, F32, tf32=tf32).values():
            assert options["PRECISION"] == precision
    if "triton" not in KERNEL_BACKENDS:
        return
    seen = []
    monkeypatch.setattr(kernels, "tf32_allowed", lambda: True)
    options = kernels._options
    monkeypatch.setattr(kernels, "_options", lambda q: seen.append(options(q)) or seen[-1])
    q, k, v, bias, mask = _inputs(2, 2, n, 16, F32, mask=(2, -100.0))
    _check(q, k, v, bias, mask, "triton", compute=TF32)
    assert len(seen) == 2 and all(
        o["PRECISION"] == "tf32" for launches in seen for o in launches.values()
    )
    assert ("_short_forward_kernel" in seen[0]) == (n <= kernels.SHORT_BLOCK)


@pytest.mark.parametrize(("n", "d", "dtype"), [(144, 32, BF16), (144, 32, F32), (100, 128, F16)])
def test_the_a100_launches_compute_the_same(monkeypatch, n, d, dtype):
    """The blocked kernels at the launches a GPU of compute capability 8.x gets
    (LONG_LAUNCHES_SM80: other query and key blocks than sm_90's at these shapes), forward and
    backward against the reference."""
    from fusedops.kernels.triton import window_attention as kernels

    if "triton" not in KERNEL_BACKENDS:
        pytest.skip("no Triton backend here")
    seen = []

    def a100_options(q):
        n, d = q.shape[-2:]
        interpreter, tf32 = triton_interpreter(), kernels.tf32_allowed()
        seen.append(kernels.launch_options(n, d, q.dtype, interpreter, tf32, arch=80))
        return seen[-1]

    monkeypatch.setattr(kernels, "_options", a100_options)
    q, k, v, bias, mask = _inputs(2, 2, n, d, dtype, mask=(2, -100.0))
    _check(q, k, v, bias, mask, "triton")
    blocks = {
        name: (o["BLOCK_M"], o["BLOCK_N"]) for launches in seen for name, o in launches.items()
    }
    assert blocks != {
        name: (o["BLOCK_M"], o["BLOCK_N"])
        for name, o in kernels.launch_options(n, d, dtype, arch=90).items()
    }
    assert "_backward_dq_kernel" in blocks


def test_the_output_is_not_saved_for_the_backward():
    """No backend reads out in the backward (the softmax rowsum comes from P dP): it is not an
    argument of the backward op, and autograd does not keep it (one (Z, H, N, d) activation
    per layer)."""
    schema = torch.ops.fusedops.window_attention_backward.default._schema
    assert [a.name for a in schema.arguments][:7] == ["dout", "q", "k", "v", "bias", "mask", "lse"]
    q, k, v, bias, mask = _inputs(2, 1, 16, 16, F32, mask=(1, -100.0))
    # the custom op's autograd (native in eager mode is torch's own autograd of its ops)
    out = fusedops.window_attention(q, k, v, bias, mask, backend="reference")
    saved = [t for t in out.grad_fn.saved_tensors if t is not None]
    assert len(saved) == 6 and all(t.data_ptr() != out.data_ptr() for t in saved)


def test_gradcheck_reference():
    q, k, v, bias, _ = _inputs(4, 2, 5, 16, torch.float64)
    mask = _mask(2, 5, -100.0, torch.float64)

    def fn(q, k, v, bias):
        return fusedops.window_attention(q, k, v, bias, mask, backend="reference")

    assert torch.autograd.gradcheck(fn, (q, k, v, bias), fast_mode=True)


def test_mask_row_of_window_b_is_mask_b_mod_nw():
    """Window z reads mask[z % nW]: windows of one image are consecutive (Swin's layout)."""
    q, k, v, _, _ = _inputs(6, 1, 16, 16, F32)
    mask = _mask(3, 16, -100.0)
    out = fusedops.window_attention(q, k, v, None, mask, backend="reference")
    for z in range(6):
        alone = fusedops.window_attention(
            q[z : z + 1], k[z : z + 1], v[z : z + 1], None, mask[z % 3 : z % 3 + 1]
        )
        assert_close(out[z : z + 1], alone.double())


class _WindowBlock(torch.nn.Module):
    """A Swin-like attention block: learned bias, fixed shift mask."""

    def __init__(self, heads=2, n=16, d=16):
        super().__init__()
        self.qkv = torch.nn.Linear(heads * d, 3 * heads * d)
        self.bias = torch.nn.Parameter(torch.randn(heads, n, n))
        self.heads, self.d = heads, d

    def forward(self, x, mask):
        z, n, _ = x.shape
        q, k, v = self.qkv(x).view(z, n, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        out = fusedops.window_attention(q, k, v, self.bias, mask)
        return out.transpose(1, 2).reshape(z, n, -1)


def _block_inputs():
    torch.manual_seed(0)
    block = _WindowBlock().to(DEVICE)
    x = random_tensor((4, 16, 32), F32, DEVICE)
    return block, x, _mask(2, 16, -100.0)


def test_torch_compile_no_graph_break():
    block, x, mask = _block_inputs()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(x, mask)
    out.square().sum().backward()
    grad = block.bias.grad.clone()
    block.zero_grad()
    expected = block(x, mask)
    expected.square().sum().backward()
    assert_close(out, expected.double())
    assert_close(grad, block.bias.grad.double(), scale=4.0)


def test_opcheck():
    q, k, v, bias, mask = _inputs(4, 2, 16, 16, F32, mask=(2, -100.0))
    torch.library.opcheck(torch.ops.fusedops.window_attention.default, (q, k, v, bias, mask, 0.25))
    torch.library.opcheck(torch.ops.fusedops.window_attention.default, (q, k, v, None, None, 0.25))


def test_torch_export_keeps_the_custom_op():
    block, x, mask = _block_inputs()
    exported = torch.export.export(block, (x, mask))
    assert "fusedops.window_attention" in str(exported.graph)
    assert_close(exported.module()(x, mask), block(x, mask).double())


def test_partial_trace_lowers_into_one_xla_program_per_direction():
    pytest.importorskip("jax")
    from fusedops.xla import partial_trace

    torch._dynamo.reset()
    block, x, mask = _block_inputs()
    x = x.cpu().requires_grad_()
    block, mask = block.cpu(), mask.cpu()
    traced = partial_trace(block, fullgraph=True)
    out = traced(x, mask)
    out.square().sum().backward()
    assert traced.stats.programs == 2 and traced.stats.regions == 1
    got = [x.grad.clone(), block.bias.grad.clone()]
    x.grad = None
    block.zero_grad()
    expected = block(x, mask)
    expected.square().sum().backward()
    assert_close(out, expected.double(), scale=4.0)
    for name, actual, want in zip(("dx", "dbias"), got, (x.grad, block.bias.grad)):
        assert_close(actual, want.double(), scale=8.0, msg=name)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_xla_lowerings_match_reference(dtype):
    """The lowerings of the op and its backward, run on JAX arrays as inside a program, with a
    fully masked row."""
    jnp = pytest.importorskip("jax.numpy")
    from fusedops.xla import lower

    def to_jax(t):
        return (
            None
            if t is None
            else jnp.asarray(t.detach().float().cpu().numpy()).astype(lower.jax_dtype(t.dtype))
        )

    def to_torch(a):
        return torch.from_numpy(jnp.asarray(a, jnp.float32).__array__().copy())

    q, k, v, bias, mask = _inputs(4, 2, 16, 16, dtype, mask=(2, float("-inf")))
    mask[1, 5, :] = float("-inf")
    dout = random_tensor(q.shape, dtype, DEVICE)
    ops = torch.ops.fusedops
    out, lse = lower.LOWERINGS[ops.window_attention.default](
        *map(to_jax, (q, k, v, bias, mask)), 0.25
    )
    grads = lower.LOWERINGS[ops.window_attention_backward.default](
        *map(to_jax, (dout, q, k, v, bias, mask)), lse, 0.25, True
    )
    expected, expected_grads = _expected(q, k, v, bias, mask, dout, 0.25)
    assert_close(to_torch(out), expected, dtype=dtype, msg="out")
    for name, actual, want in zip(("dq", "dk", "dv", "dbias"), grads, expected_grads):
        assert_close(to_torch(actual), want, dtype=dtype, scale=GRAD_SCALE, msg=name)


def _bad(**changes):
    z, h, n, d = 4, 2, 16, 16
    args = dict(
        q=torch.ones(z, h, n, d),
        k=torch.ones(z, h, n, d),
        v=torch.ones(z, h, n, d),
        relative_pos_bias=torch.ones(h, n, n),
        attn_mask=torch.zeros(2, n, n),
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (_bad(q=[1.0]), TypeError, "q must be a torch.Tensor"),
        (_bad(k=torch.ones(4, 2, 16, 16, dtype=torch.int64)), TypeError, "k has dtype"),
        (_bad(q=torch.ones(2, 16, 16)), ValueError, "q must be 4-D"),
        (_bad(k=torch.ones(4, 2, 17, 16)), ValueError, "k has shape"),
        (_bad(v=torch.ones(4, 1, 16, 16)), ValueError, "v has shape"),
        (_bad(v=torch.ones(4, 2, 16, 16, dtype=F16)), TypeError, "v has dtype"),
        (_bad(relative_pos_bias=torch.ones(2, 16, 15)), ValueError, r"relative_pos_bias.*\(heads"),
        (_bad(relative_pos_bias=torch.ones(3, 16, 16)), ValueError, "relative_pos_bias has shape"),
        (_bad(attn_mask=torch.zeros(2, 16, 17)), ValueError, r"attn_mask has shape.*\(nW, N, N\)"),
        (_bad(attn_mask=torch.zeros(16, 16)), ValueError, "attn_mask has shape"),
        (_bad(attn_mask=torch.zeros(3, 16, 16)), ValueError, "attn_mask has nW=3.*multiple of nW"),
        (_bad(attn_mask=torch.zeros(2, 16, 16, requires_grad=True)), ValueError, "attn_mask"),
        (
            _bad(
                **{t: torch.ones(4, 2, 257, 16) for t in "qkv"},
                relative_pos_bias=None,
                attn_mask=None,
            ),
            ValueError,
            "q has N=257.*1 to 256",
        ),
        (
            _bad(**{t: torch.ones(4, 2, 16, 48) for t in "qkv"}),
            ValueError,
            r"q has head dim d=48.*\(16, 32, 64, 128\)",
        ),
        (_bad(relative_pos_bias=torch.ones(2, 16, 16, dtype=torch.int32)), TypeError, "relative"),
    ],
)
def test_bad_inputs(args, error, match):
    with pytest.raises(error, match=match):
        fusedops.window_attention(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal message")
def test_forced_cuda_on_cpu_lists_reasons():
    q, k, v, bias, mask = _inputs(2, 1, 16, 16, F32, mask=(1, -100.0))
    with pytest.raises(fusedops.BackendUnavailableError, match="window_attention.*cuda"):
        fusedops.window_attention(q, k, v, bias, mask, backend="cuda")


class _EmulatedSoftmaxKernels:
    """window_attention.cu's two launchers as window_attention.h states them, in torch on the
    CPU: lets the CUDA path's Python side (products, transposes, scale, d_bias partials) run
    here."""

    @staticmethod
    def _logits(scores, bias, mask, scale):
        x = scores * scale + (bias if bias is not None else 0.0)
        if mask is not None:
            x = (x.view(-1, mask.shape[0], *x.shape[1:]) + mask[None, :, None]).view(x.shape)
        return x

    def window_attention_softmax_forward(self, scores, bias, mask, scale, probs, lse):
        x = self._logits(scores, bias, mask, scale)
        row_lse = torch.logsumexp(x, dim=-1)
        lse.copy_(torch.where(torch.isneginf(row_lse), float("inf"), row_lse))
        probs.copy_(torch.exp(x - lse[..., None]))

    def window_attention_softmax_backward(
        self, scores, dprobs, bias, mask, lse, scale, probs, dscores, partial, groups
    ):
        p = torch.exp(self._logits(scores, bias, mask, scale) - lse[..., None])
        ds = p * (dprobs - (p * dprobs).sum(-1, keepdim=True))
        probs.copy_(p)
        dscores.copy_(ds * scale)
        if partial is not None:
            for g in range(groups):
                partial[g] = ds[g::groups].sum(0)


@pytest.mark.parametrize("mask_fill", [-100.0, float("-inf")])
def test_cuda_path_python_side_with_emulated_kernels(monkeypatch, mask_fill):
    from fusedops.kernels.cuda import window_attention as cuda_path

    monkeypatch.setattr(cuda_path, "library", _EmulatedSoftmaxKernels)
    monkeypatch.setattr(cuda_path, "multiprocessors", lambda device: 3)
    q, k, v, bias, mask = _inputs(6, 2, 20, 16, F32, mask=(3, mask_fill))
    mask[1, 4, :] = mask_fill  # a fully masked row when the fill is -inf
    scale = 0.3
    out, lse = cuda_path.forward(q, k, v, bias, mask, scale)
    dout = random_tensor(out.shape, F32, DEVICE)
    assert cuda_path._groups(q) == 3  # 96 warps over 2 heads x 20 rows: 3 window groups
    grads = cuda_path.backward(dout, q, k, v, bias, mask, lse, scale, True)
    expected, expected_grads = _expected(q, k, v, bias, mask, dout, scale)
    # fp32 products in torch's own blocked order: the bounds at each result's magnitude (at
    # 1.0 the gradients, up to ~5, went over it in 15 of 600 runs (300 seeds, 2 fills); at their
    # magnitude the worst of the 600 used 0.26 of it)
    assert_close(out, expected, magnitude=float(expected.abs().max()))
    for name, actual, want in zip(("dq", "dk", "dv", "dbias"), grads, expected_grads):
        assert_close(actual, want, scale=GRAD_SCALE, magnitude=float(want.abs().max()), msg=name)


# ------------------------------------------------------------------------------------------
# Swin-T's shapes, every N x d, grid limits (smaller on the CPU); the backend picked
# automatically and the CUDA extension on a GPU.

SWIN_STAGES = [(64, 3), (16, 6), (4, 12), (1, 24)]  # (nW, heads) at 224px, 7x7 windows, d = 32
ON_GPU = DEVICE.type == "cuda"


# On the CPU (Triton interpreted: ~5 s a stage) fp32 stages only, Triton's N x d on a diagonal.
STAGE_CASES = [
    (backend, dtype, *stage)
    for backend in BACKENDS
    for dtype in (F32, F16, BF16)
    for stage in SWIN_STAGES
    if ON_GPU or dtype == F32
]
N_D_CASES = [
    (backend, n, d)
    for backend in BACKENDS
    for i, n in enumerate([1, 16, 49, 64, 100, 144, 256])
    for j, d in enumerate([16, 32, 64, 128])
    if ON_GPU or backend != "triton" or i % 4 == j
]


@pytest.mark.parametrize(("backend", "dtype", "windows", "heads"), STAGE_CASES, ids=str)
def test_swin_t_stage_shapes(backend, dtype, windows, heads):
    """Batch 4 on a GPU; one image on the CPU."""
    batch = 4 if ON_GPU else 1
    q, k, v, bias, mask = _inputs(batch * windows, heads, 49, 32, dtype, mask=(windows, -100.0))
    _check(q, k, v, bias, mask, backend)


@pytest.mark.parametrize(("backend", "n", "d"), N_D_CASES, ids=str)
def test_every_n_and_d(backend, n, d):
    """6 windows of 2 heads on a GPU, 2 of 1 on the CPU."""
    z, h = (6, 2) if ON_GPU else (2, 1)
    _check(*_inputs(z, h, n, d, BF16, mask=(z // 2, float("-inf"))), backend)


def _grid_cases():
    """(backend, batch, nW, d, grid-dim-1/2 limit): 2 x 2 windows x 4 heads past a limit
    lowered to 3 on every backend here; Swin-B stage 1 at batch 256 on a GPU (256 * 64
    windows x 4 heads = 65536 window-heads, one more than CUDA allows grid dims 1 and 2)."""
    cases = [(backend, 2, 2, d, 3) for backend in BACKENDS for d in (32, 128)]
    real = [(b, 256, 64, d, None) for b in ("triton", "cuda") for d in (32, 128)]
    # big_memory: the float64 oracle of 65536 window-heads takes up to ~38 GiB; out of memory
    # beside 13 other workers on the H100 run of 2026-11-26 (passed alone)
    marks = [pytest.mark.gpu, pytest.mark.big_memory]
    return cases + [pytest.param(*c, marks=marks) for c in real]


@pytest.mark.parametrize(("backend", "batch", "nw", "d", "limit"), _grid_cases(), ids=str)
def test_more_window_heads_than_a_grid_dim_1_takes(grid_limit, backend, batch, nw, d, limit):
    """The Triton kernels put window-heads on grid dim 0 and cap the window groups of the
    backward at the dim-1/2 limit (every launch checked against it); d = 128: two key blocks,
    the dq kernel runs too."""
    from fusedops.kernels.triton import window_attention as triton_attention

    grids = grid_limit(triton_attention, limit) if limit and backend == "triton" else None
    q, k, v, bias, mask = _inputs(batch * nw, 4, 49, d, F16, mask=(nw, -100.0))
    _check(q, k, v, bias, mask, backend)
    if grids is not None:  # the window-heads did pass the lowered limit, on dim 0
        assert max(g[0] for g in grids) == batch * nw * 4 > limit


def test_attention_core_fuses_without_dropout_and_keeps_dropout_semantics():
    """``attention_core`` (the Swin hook's ``_window_attention_core`` signature): the fused op
    when there is no attention dropout, the unfused math with it."""
    from fusedops.ops.window_attention import attention_core

    q, k, v, bias, mask = _inputs(4, 2, 16, 16, F32, mask=(2, -100.0))
    fusedops.dispatch.last_used.pop("window_attention", None)
    out = attention_core(q, k, v, bias[None], mask, 0.25, dropout_p=0.5, training=False)
    assert "window_attention" in fusedops.dispatch.last_used
    expected, _ = _expected(q, k, v, bias, mask, torch.zeros_like(q), 0.25)
    assert_close(out, expected)
    torch.manual_seed(3)
    dropped = attention_core(q, k, v, bias, mask, 0.25, dropout_p=0.5, training=True)
    torch.manual_seed(3)
    scores = q @ k.transpose(-1, -2) * 0.25 + bias + mask.repeat(2, 1, 1)[:, None]
    probs = torch.nn.functional.dropout(torch.softmax(scores, -1), p=0.5, training=True)
    assert_close(dropped, (probs @ v).double())


def test_unsupported_reasons_is_the_one_place_of_the_limits():
    """``unsupported_reasons``: N and d refused by every backend (the public ValueError), a
    bias or mask outside fp32/fp16/bf16 by the kernels only, which dispatch then skips."""
    from fusedops.ops.window_attention import unsupported_reasons

    q, k, v, _, _ = _inputs(2, 1, 16, 16, torch.float64, bias=False)
    bias = random_tensor((1, 16, 16), torch.float64, DEVICE)
    assert unsupported_reasons("reference", q, k, v, bias, None) == []
    for backend in ("cuda", "triton"):
        (reason,) = unsupported_reasons(backend, q, k, v, bias, None)
        assert reason.startswith("relative_pos_bias has dtype torch.float64")
    wide = torch.ones(2, 1, 257, 48, device=DEVICE)
    for backend in fusedops.dispatch.backend_names():
        n_reason, d_reason = unsupported_reasons(backend, wide, wide, wide)
        assert "N=257" in n_reason and "d=48" in d_reason
    with pytest.raises(ValueError, match="N=257.*; .*d=48"):
        fusedops.window_attention(wide, wide, wide)
    with pytest.raises(fusedops.BackendUnavailableError, match="relative_pos_bias has dtype"):
        fusedops.window_attention(q, k, v, bias, backend="triton")


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_attention_core_unfused_outside_the_ops_limits(need_weights, bias):
    """``attention_core`` on what ``window_attention`` refuses (d = 24, N = 257) or when the
    weights are asked for: scores, the Swin softmax (a zero bias where there is none),
    products; the weights returned with ``need_weights``."""
    from fusedops.ops.window_attention import attention_core

    for n, d in ((16, 24), (257, 16)) if not need_weights else ((16, 16),):
        q, k, v, b, mask = _inputs(2, 2, n, d, F32, bias=bias, mask=(1, -100.0))
        fusedops.dispatch.last_used.pop("window_attention", None)
        result = attention_core(q, k, v, b, mask, 0.3, need_weights=need_weights)
        assert "window_attention" not in fusedops.dispatch.last_used
        scores = q.double() @ k.double().transpose(-1, -2) * 0.3 + mask.double()[None]
        if b is not None:
            scores = scores + b.double()
        probs = torch.softmax(scores, -1)
        out, weights = result if need_weights else (result, None)
        # an error e in a row's fp32 scores moves its probabilities by up to 2e relatively:
        # magnitudes from the terms each score sums (d products, the bias), per row
        sums = q.detach().abs().double() @ k.detach().abs().double().transpose(-1, -2) * 0.3
        if b is not None:
            sums = sums + b.detach().abs().double()
        shift = 2 * sums.amax(-1, keepdim=True)
        terms = max(n, d)
        assert_close(out, probs @ v.double(), terms=terms, magnitude=(1 + shift) * v.abs().max())
        if need_weights:
            assert_close(weights, probs, terms=terms, magnitude=shift)

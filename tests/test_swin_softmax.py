"""Swin attention softmax (bias + shift mask + softmax, fused) against a float64 oracle written
with torch.softmax, every backend available here."""

import math

import numpy as np
import pytest
import torch

import fusedops
from fusedops.nn import FusedSwinFmha
from fusedops.testing import assert_close, non_contiguous, random_tensor, run_on_side_stream
from tests.op_testing import BACKENDS, DEVICE, DTYPES

F32 = torch.float32
# (batch, windows per image nW, heads, N, mask): N from 1 to 256, Swin's -100 mask, -inf masks
# with fully masked rows, no mask, batch 0.
CASES = [
    (2, 3, 2, 49, "-100"),
    (1, 1, 1, 1, None),
    (2, 2, 3, 64, "-inf"),
    (1, 4, 1, 144, None),
    (1, 2, 1, 256, "-100"),
    (0, 2, 2, 49, "-100"),
]


def make_mask(windows, n, kind, device=DEVICE):
    """(nW, N, N) fp32: Swin's 0/-100 shift mask, or 0/-inf with fully masked rows."""
    if kind is None:
        return None
    masked = torch.rand(windows, n, n, device=device) < 0.4
    if kind == "-inf":
        masked[:, 0] = True  # row 0 of every window: all -inf
        return torch.where(masked, -math.inf, 0.0)
    return torch.where(masked, -100.0, 0.0)


def oracle(attn, bias, mask):
    """softmax(attn + bias + mask[b % nW]) in float64; fully -inf rows -> 0."""
    z = attn.double() + bias.double()
    if mask is not None:
        nw, heads, n = mask.shape[0], attn.shape[1], attn.shape[2]
        z = (z.view(-1, nw, heads, n, n) + mask.double()[None, :, None]).view(attn.shape)
    probs = torch.softmax(z, dim=-1)
    return torch.where(torch.isneginf(z).all(dim=-1, keepdim=True), 0.0, probs)


def oracle_backward(probs, grad):
    dz = probs * (grad - (probs * grad).sum(dim=-1, keepdim=True))
    return dz, dz.sum(dim=0)


def _inputs(b, nw, heads, n, kind, dtype):
    attn = random_tensor((b * nw, heads, n, n), dtype, DEVICE).requires_grad_()
    bias = random_tensor((heads, n, n), torch.float32, DEVICE).requires_grad_()
    return attn, bias, make_mask(nw, n, kind)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_backward_match_oracle(backend, dtype, case):
    b, nw, heads, n, kind = case
    attn, bias, mask = _inputs(b, nw, heads, n, kind, dtype)
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    expected = oracle(attn.detach(), bias.detach(), mask)
    assert probs.dtype == dtype and not probs.isnan().any()
    assert_close(probs, expected, msg="probs")
    grad = random_tensor(probs.shape, dtype, DEVICE)
    probs.backward(grad)
    d_attn, d_bias = oracle_backward(expected, grad.double())
    assert_close(attn.grad, d_attn, msg="d_attn")
    assert bias.grad.dtype == torch.float32
    assert_close(bias.grad, d_bias, dtype=dtype, scale=max(1, b * nw) ** 0.5, msg="d_bias")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zeros_not_nan(backend):
    attn = random_tensor((4, 2, 5, 5), torch.float32, DEVICE).requires_grad_()
    bias = random_tensor((2, 5, 5), torch.float32, DEVICE)
    mask = torch.zeros(2, 5, 5, device=DEVICE)
    mask[1] = -math.inf  # every row of window 1 (and 3)
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    assert torch.equal(probs[1::2], torch.zeros_like(probs[1::2]))
    assert_close(probs[0::2].sum(-1), torch.ones(2, 2, 5, dtype=torch.float64, device=DEVICE))
    probs.backward(random_tensor(probs.shape, torch.float32, DEVICE))
    assert not attn.grad.isnan().any() and torch.equal(
        attn.grad[1::2], torch.zeros_like(probs[1::2])
    )


def _xla_softmax(attn, bias, mask):
    """The XLA lowering of fusedops::swin_attention_softmax, run on JAX arrays."""
    jnp = pytest.importorskip("jax.numpy")
    from fusedops.xla import lower

    lowering = lower.LOWERINGS[torch.ops.fusedops.swin_attention_softmax.default]
    args = [jnp.asarray(t.detach().cpu().numpy()) for t in (attn, bias, mask)]
    return torch.from_numpy(np.asarray(lowering(*args)).copy())


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("backend", [*BACKENDS, "xla"])
def test_rows_with_nan_or_inf_give_nan_as_torch_softmax(backend):
    """A row holding NaN or +inf gives NaN (torch.softmax's answer), also a row whose other
    entries are all -inf; only a row of -inf alone is "fully masked" and gives zeros."""
    attn = random_tensor((4, 2, 5, 5), torch.float32, DEVICE)
    bias = random_tensor((2, 5, 5), torch.float32, DEVICE)
    mask = torch.zeros(2, 5, 5, device=DEVICE)
    mask[1, 2] = -math.inf  # row 2 of windows 1 and 3: fully masked
    attn[0, 0, 1, 2] = math.nan
    attn[0, 1, 3, 0] = math.inf
    attn[3, 1, 2, 4] = math.nan  # in a fully masked row
    attn[2, 0, 4] = -math.inf
    attn[2, 0, 4, 1] = math.inf  # -inf everywhere but one +inf
    if backend == "xla":
        probs = _xla_softmax(attn, bias, mask)
    else:
        probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    expected = oracle(attn, bias, mask)
    assert expected[0, 0, 1].isnan().all() and expected[3, 1, 2].isnan().all()
    assert expected[2, 0, 4].isnan().all() and torch.equal(
        expected[1, :, 2], torch.zeros(2, 5, dtype=torch.float64, device=DEVICE)
    )
    assert_close(probs, expected)  # NaN exactly where torch has NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_gradient_is_deterministic(backend):
    attn, bias, mask = _inputs(4, 4, 3, 49, "-100", torch.float32)
    grad = random_tensor(attn.shape, torch.float32, DEVICE)
    runs = []
    for _ in range(2):
        probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
        runs.append(torch.autograd.grad(probs, (attn, bias), grad))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_and_16_bit_bias(backend):
    attn = non_contiguous(random_tensor((4, 2, 7, 7), torch.float32, DEVICE))
    bias = random_tensor((2, 7, 7), torch.bfloat16, DEVICE).requires_grad_()
    mask = non_contiguous(make_mask(2, 7, "-100"))
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    expected = oracle(attn, bias.detach(), mask)
    assert_close(probs, expected)
    grad = random_tensor(probs.shape, torch.float32, DEVICE)
    probs.backward(grad)
    assert bias.grad.dtype == torch.bfloat16
    assert_close(bias.grad, oracle_backward(expected, grad.double())[1])


def test_seed_runtime_name():
    b, nw, heads, n = 2, 3, 2, 9
    attn, bias, mask = _inputs(b, nw, heads, n, "-100", torch.float32)
    probs = FusedSwinFmha.apply(attn, bias, mask, b, nw, heads, n)
    assert_close(probs, oracle(attn.detach(), bias.detach(), mask))
    with pytest.raises(ValueError, match="attn has shape"):
        FusedSwinFmha.apply(attn, bias, mask, b, nw + 1, heads, n)


def test_gradcheck_reference():
    attn = random_tensor((4, 2, 5, 5), torch.float64, "cpu").requires_grad_()
    bias = random_tensor((2, 5, 5), torch.float64, "cpu").requires_grad_()
    mask = make_mask(2, 5, "-100", "cpu").double()
    assert torch.autograd.gradcheck(
        lambda a, b: fusedops.swin_attention_softmax(a, b, mask, backend="reference"), (attn, bias)
    )


def _scores_to_probs(attn, bias, mask):
    return fusedops.swin_attention_softmax(attn * 0.5, bias, mask)


def test_torch_compile_no_graph_break():
    attn, bias, mask = _inputs(2, 2, 2, 9, "-100", torch.float32)
    compiled = torch.compile(_scores_to_probs, fullgraph=True, backend="aot_eager")
    probs = compiled(attn, bias, mask)
    probs.square().sum().backward()
    assert_close(probs, oracle(attn.detach() * 0.5, bias.detach(), mask))
    assert attn.grad is not None and bias.grad is not None


def test_opcheck():
    attn, bias, mask = _inputs(2, 2, 2, 9, "-100", torch.float32)
    ops = torch.ops.fusedops
    torch.library.opcheck(ops.swin_attention_softmax.default, (attn, bias, mask, None))
    torch.library.opcheck(ops.swin_attention_softmax.default, (attn, bias, None, None))
    probs = fusedops.swin_attention_softmax(attn, bias, mask).detach()
    grad = random_tensor(probs.shape, torch.float32, DEVICE)
    torch.library.opcheck(ops.swin_attention_softmax_backward.default, (grad, probs, None))


def test_torch_export_keeps_the_custom_op():
    class Softmax(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(random_tensor((2, 9, 9), torch.float32, "cpu"))
            self.register_buffer("mask", make_mask(2, 9, "-100", "cpu"))

        def forward(self, attn):
            return _scores_to_probs(attn, self.bias, self.mask)

    module = Softmax()
    attn = random_tensor((4, 2, 9, 9), torch.float32, "cpu")
    exported = torch.export.export(module, (attn,))
    assert "fusedops.swin_attention_softmax" in str(exported.graph)
    assert_close(exported.module()(attn), oracle(attn * 0.5, module.bias.detach(), module.mask))


def test_partial_trace_lowers_into_one_xla_program_per_direction():
    pytest.importorskip("jax")
    from fusedops.xla import partial_trace

    torch._dynamo.reset()
    traced = partial_trace(_scores_to_probs, fullgraph=True)
    attn, bias, mask = _inputs(2, 2, 2, 9, "-inf", torch.float32)
    probs = traced(attn, bias, mask)
    expected = oracle(attn.detach() * 0.5, bias.detach(), mask)
    assert_close(probs, expected)
    grad = random_tensor(probs.shape, torch.float32, DEVICE)
    probs.backward(grad)
    d_attn, d_bias = oracle_backward(expected, grad.double())
    assert_close(attn.grad, 0.5 * d_attn)
    assert_close(bias.grad, d_bias)
    assert traced.stats.programs == 2 and traced.stats.regions == 1
    assert not traced.stats.eager_ops


def test_backward_chunks_ask_the_device_once(monkeypatch):
    """The chunk count of the bias-gradient reduction (every backward call) reads the device's
    multiprocessor count from fusedops.kernels.device's cache, not from CUDA each time."""
    from types import SimpleNamespace

    from fusedops.kernels import device
    from fusedops.kernels.shared.swin_chunks import backward_chunks

    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(multi_processor_count=10)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    device._multiprocessors.cache_clear()
    try:
        gpu = torch.device("cuda", 0)
        # 40 programs wanted over 3 row groups: 14 chunks, then balanced (8 windows a chunk)
        assert [backward_chunks(100, 3, gpu) for _ in range(3)] == [13, 13, 13]
        assert backward_chunks(5, 3, gpu) == 5 and backward_chunks(100, 3, torch.device("cpu")) == 2
        # 8 programs a multiprocessor (the Triton backward's): 27 chunks, then 25 of 4 windows
        assert backward_chunks(100, 3, gpu, 8) == 25
    finally:
        device._multiprocessors.cache_clear()
    assert asked == [0]


@pytest.mark.parametrize("chunking", ["device", "one-window-a-chunk"])
def test_triton_backward_64_bit_offsets(monkeypatch, chunking):
    """A chunk of windows whose scores pass 32-bit offsets (the kernel's MAX_OFFSET, lowered
    here below one window's scores, so any chunk passes it) takes the 64-bit path (WIDE): the
    same bits as the 32-bit path, and the oracle's gradients. Chunks of the device's choice
    (several windows each under the interpreter) and of one window each (as on a GPU with
    many multiprocessors: the H100 run of 2026-11-26 found the test's old limit, exactly one
    window's scores, never passed there)."""
    from fusedops.kernels.triton import swin_softmax as triton_softmax

    if chunking == "one-window-a-chunk":
        monkeypatch.setattr(triton_softmax, "backward_chunks", lambda windows, *a: windows)
    heads, n = 2, 49
    attn, bias, mask = _inputs(2, 3, heads, n, "-100", torch.bfloat16)
    grad = random_tensor(attn.shape, torch.bfloat16, DEVICE)
    meta, wide = triton_softmax.backward_meta, []

    def recorded(*args):
        wide.append(meta(*args)["WIDE"])
        return meta(*args)

    def grads():
        probs = fusedops.swin_attention_softmax(attn, bias, mask, backend="triton")
        return torch.autograd.grad(probs, (attn, bias), grad)

    monkeypatch.setattr(triton_softmax, "backward_meta", recorded)
    narrow = grads()
    monkeypatch.setattr(triton_softmax, "MAX_OFFSET", heads * n * n - 1)
    wide_grads = grads()
    assert wide == [False, True]
    assert all(torch.equal(a, b) for a, b in zip(narrow, wide_grads, strict=True))
    d_attn, d_bias = oracle_backward(oracle(attn.detach(), bias.detach(), mask), grad.double())
    assert_close(wide_grads[0], d_attn)
    assert_close(wide_grads[1], d_bias, dtype=torch.bfloat16, scale=attn.shape[0] ** 0.5)


ATTN = torch.zeros(4, 2, 3, 3)
BIAS = torch.zeros(2, 3, 3)
MASK = torch.zeros(2, 3, 3)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((ATTN.int(), BIAS, MASK), TypeError, "attn has dtype torch.int32"),
        ((ATTN, BIAS.long(), MASK), TypeError, "relative_pos_bias has dtype torch.int64"),
        ((ATTN, BIAS, MASK.bool()), TypeError, "attn_mask has dtype torch.bool"),
        ((ATTN[0], BIAS, MASK), ValueError, "attn must be 4-D"),
        ((ATTN[..., :2], BIAS, MASK), ValueError, "attn must be 4-D"),
        ((ATTN, BIAS[:1], MASK), ValueError, r"relative_pos_bias must have shape \(heads, N, N\)"),
        ((ATTN, BIAS, MASK[:, :2]), ValueError, r"attn_mask must have shape \(nW, N, N\)"),
        ((ATTN, BIAS, torch.zeros(3, 3, 3)), ValueError, "attn has 4 windows .* nW=3"),
        ((ATTN, BIAS.to("meta"), MASK), ValueError, "relative_pos_bias is on meta"),
        ((ATTN, BIAS, MASK.to("meta")), ValueError, "attn_mask is on meta"),
        ((ATTN, BIAS, MASK.clone().requires_grad_()), ValueError, "attn_mask requires grad"),
        (([0.0], BIAS, MASK), TypeError, "attn must be a torch.Tensor"),
    ],
)
def test_bad_inputs(args, error, match):
    with pytest.raises(error, match=match):
        fusedops.swin_attention_softmax(*args)


# Many windows (several bias-gradient chunks) on a GPU; few on the CPU (the reference, and
# Triton interpreted: there N past 256 on the reference only, the interpreter takes ~10 s each).
LENGTHS = [1, 16, 33, 49, 64, 100, 144, 256, 576, 1024]
SCORES, MAX_WINDOWS = (2**21, 2**21) if DEVICE.type == "cuda" else (2**12, 8)
LENGTH_CASES = [
    (backend, n)
    for backend in BACKENDS
    for n in LENGTHS
    if DEVICE.type == "cuda" or backend == "reference" or n <= 256
]


@pytest.mark.parametrize(("backend", "n"), LENGTH_CASES, ids=str)
def test_window_lengths_and_deterministic_bias_grad(backend, n):
    """Every lanes-per-row configuration of the CUDA kernel (N up to its 1024), many windows
    (several chunks); the bias gradient is the same bits on a second run."""
    windows = max(1, min(SCORES // (n * n), MAX_WINDOWS))
    heads = 2 if DEVICE.type == "cuda" or n <= 256 else 1
    attn, bias, mask = _inputs(
        windows // 4 or 1, 4 if windows >= 4 else 1, heads, n, "-inf", torch.bfloat16
    )
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    expected = oracle(attn.detach(), bias.detach(), mask)
    assert_close(probs, expected)
    grad = random_tensor(probs.shape, torch.bfloat16, DEVICE)
    first = torch.autograd.grad(probs, (attn, bias), grad, retain_graph=True)
    second = torch.autograd.grad(probs, (attn, bias), grad)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    d_attn, d_bias = oracle_backward(expected, grad.double())
    assert_close(first[0], d_attn)
    assert_close(first[1], d_bias, dtype=torch.bfloat16, scale=attn.shape[0] ** 0.5)


def _grid_cases():
    """(backend, b, nW, heads, N, grid-dim-1/2 limit): small shapes past a limit lowered to 3
    on every backend here; the real counts (65535 + 1) on a GPU."""
    small = [(1, 1, 16, 16), (5, 2, 1, 4)]  # 4 row blocks of 64 rows; 10 windows
    cases = [(backend, *shape, 3) for backend in BACKENDS for shape in small]
    real = [
        ("triton", 1, 1, 16, 4096, [pytest.mark.big_memory]),  # 65536 row blocks of one window
        ("triton", 1025, 64, 1, 16, []),  # 65600 windows
        ("cuda", 1025, 64, 1, 16, []),
    ]
    cases += [pytest.param(*c[:-1], None, marks=[pytest.mark.gpu, *c[-1]]) for c in real]
    return cases


@pytest.mark.parametrize(("backend", "b", "nw", "heads", "n", "limit"), _grid_cases(), ids=str)
def test_grids_past_the_grid_dim_limit(grid_limit, backend, b, nw, heads, n, limit):
    """Counts that CUDA's grid dims 1 and 2 cannot hold (65535 at most; ``limit`` when lowered):
    the Triton forward's grid is 1-D and the backward's chunks are capped, every Triton launch
    fits (checked); the CUDA kernels stride over rows."""
    from fusedops.kernels.triton import swin_softmax as triton_softmax

    grids = grid_limit(triton_softmax, limit) if limit and backend == "triton" else None
    attn, bias, mask = _inputs(b, nw, heads, n, "-100", torch.bfloat16)
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    expected = oracle(attn.detach(), bias.detach(), mask)
    assert_close(probs, expected)
    grad = random_tensor(probs.shape, torch.bfloat16, DEVICE)
    probs.backward(grad)
    d_attn, d_bias = oracle_backward(expected, grad.double())
    assert_close(attn.grad, d_attn)
    assert_close(bias.grad, d_bias, dtype=torch.bfloat16, scale=attn.shape[0] ** 0.5)
    if grids is not None:  # the count did pass the lowered limit, on dim 0
        assert len(grids) == 2 and grids[0][0] > limit


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_rows_past_the_cuda_kernel(backend):
    """N = 2304 (48x48 windows): past the CUDA kernel's 1024, the automatic pick on a GPU takes
    Triton; the reference and Triton compute it on every device; forcing cuda refuses with the
    limit in the message (BackendUnavailableError), never a launch past it."""
    n = 2304 if DEVICE.type == "cuda" else 1040
    attn, bias, mask = _inputs(1, 2 if DEVICE.type == "cuda" else 1, 1, n, "-100", F32)
    if backend == "cuda":
        with pytest.raises(fusedops.dispatch.BackendUnavailableError, match=f"N={n} > 1024"):
            fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
        return
    probs = fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)
    assert_close(probs, oracle(attn.detach(), bias.detach(), mask))
    if DEVICE.type == "cuda":
        fusedops.swin_attention_softmax(attn, bias, mask)
        assert fusedops.dispatch.last_used["swin_attention_softmax"] == "triton"


@pytest.mark.parametrize("backend", BACKENDS)
def test_side_stream(backend):
    """On a side stream ordered after the current one (waits for the inputs, records them):
    the same probabilities; on the CPU the same calls with torch.cpu's streams."""
    shape = (64, 16, 3, 49) if DEVICE.type == "cuda" else (2, 2, 3, 49)
    attn, bias, mask = _inputs(*shape, "-100", torch.float16)

    def softmax(attn, bias, mask):
        return fusedops.swin_attention_softmax(attn, bias, mask, backend=backend)

    probs = run_on_side_stream(softmax, attn.detach(), bias.detach(), mask)
    assert_close(probs, oracle(attn.detach(), bias.detach(), mask))

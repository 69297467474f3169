"""Swin window gathers (shift + partition, reverse + shift) against a float64 oracle written with
torch.roll and view/permute, every backend available here."""

import pytest
import torch

import fusedops
from fusedops.nn import WindowProcess, WindowProcessReverse
from fusedops.testing import assert_close, non_contiguous, random_tensor, run_on_side_stream
from tests.op_testing import BACKENDS, DEVICE, DTYPES

# (B, H, W, C, window_size, shift): H != W, shift 0 / 3 / -3 / larger than the window and than
# H, window as a pair, batch 1 and 0, C = 1 and 0.
CASES = [
    (2, 14, 21, 5, 7, -3),
    (1, 14, 21, 3, 7, 3),
    (1, 8, 8, 3, 4, 0),
    (2, 8, 12, 2, (4, 3), (5, -7)),
    (3, 6, 4, 1, 2, 9),
    (0, 4, 4, 3, 2, 1),
    (2, 4, 6, 0, 2, 1),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def oracle_partition(x, window, shift):
    """window_partition(torch.roll(x, shift, (1, 2)), window), in x's dtype."""
    (wh, ww), (sh, sw) = _pair(window), _pair(shift)
    b, h, w, c = x.shape
    rolled = torch.roll(x, (sh, sw), dims=(1, 2))
    grid = rolled.view(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return grid.reshape(b * (h // wh) * (w // ww), wh, ww, c)


def oracle_reverse(windows, window, h, w, shift):
    """torch.roll(window_reverse(windows, window, h, w), shift, (1, 2))."""
    (wh, ww), (sh, sw) = _pair(window), _pair(shift)
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // wh) * (w // ww))
    grid = windows.view(b, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return torch.roll(grid.reshape(b, h, w, c), (sh, sw), dims=(1, 2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_partition_and_reverse_match_oracle(backend, dtype, case):
    b, h, w, c, window, shift = case
    x = random_tensor((b, h, w, c), dtype, DEVICE).requires_grad_()
    out = fusedops.window_partition_roll(x, window, shift, backend=backend)
    expected = oracle_partition(x.detach().double(), window, shift)
    assert out.dtype == dtype and out.is_contiguous()
    assert_close(out, expected, msg="partition")
    grad = random_tensor(out.shape, dtype, DEVICE)
    out.backward(grad)
    neg = tuple(-s for s in _pair(shift))
    assert_close(x.grad, oracle_reverse(grad.double(), window, h, w, neg), msg="partition dx")

    windows = random_tensor(out.shape, dtype, DEVICE).requires_grad_()
    back = fusedops.window_reverse_roll(windows, window, h, w, shift, backend=backend)
    assert_close(
        back, oracle_reverse(windows.detach().double(), window, h, w, shift), msg="reverse"
    )
    grad = random_tensor(back.shape, dtype, DEVICE)
    back.backward(grad)
    assert_close(windows.grad, oracle_partition(grad.double(), window, neg), msg="reverse dx")


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_with_swin_signs_and_records_backend(backend):
    x = random_tensor((2, 12, 8, 6), torch.float32, DEVICE)
    windows = fusedops.window_partition_roll(x, 4, -2, backend=backend)
    assert torch.equal(fusedops.window_reverse_roll(windows, 4, 12, 8, 2, backend=backend), x)
    assert fusedops.dispatch.last_used["window_partition_roll"] == backend
    assert fusedops.dispatch.last_used["window_reverse_roll"] == backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs(backend):
    base = random_tensor((2, 8, 12, 5), torch.float32, DEVICE)
    x = non_contiguous(base).requires_grad_()
    out = fusedops.window_partition_roll(x, 4, (3, -5), backend=backend)
    assert_close(out, oracle_partition(base.double(), 4, (3, -5)))
    grad = non_contiguous(random_tensor(out.shape, torch.float32, DEVICE))
    out.backward(grad)
    assert_close(x.grad, oracle_reverse(grad.double(), 4, 8, 12, (-3, 5)))
    windows = non_contiguous(random_tensor(out.shape, torch.float32, DEVICE))
    back = fusedops.window_reverse_roll(windows, 4, 8, 12, 1, backend=backend)
    assert_close(back, oracle_reverse(windows.double(), 4, 8, 12, 1))


def test_seed_runtime_names_follow_the_call_site_sign_convention():
    b, h, w, c, ws, shift = 2, 14, 7, 4, 7, 3
    x = random_tensor((b, h, w, c), torch.float32, DEVICE).requires_grad_()
    windows = WindowProcess.apply(x, b, h, w, c, -shift, ws)  # Swin passes -shift_size here
    assert_close(windows, oracle_partition(x.detach().double(), ws, -shift))
    back = WindowProcessReverse.apply(windows, b, h, w, c, shift, ws)  # and +shift_size here
    assert_close(back, x.detach().double())
    back.sum().backward()
    assert_close(x.grad, torch.ones_like(x, dtype=torch.float64))


def test_gradcheck_reference():
    x = random_tensor((2, 4, 6, 3), torch.float64, "cpu").requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: fusedops.window_partition_roll(t, (2, 3), (1, -4), backend="reference"), (x,)
    )
    windows = random_tensor((8, 2, 3, 3), torch.float64, "cpu").requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: fusedops.window_reverse_roll(t, (2, 3), 4, 6, 5, backend="reference"), (windows,)
    )


def _swin_block_shuffle(x):
    windows = fusedops.window_partition_roll(x, 4, -2)
    return fusedops.window_reverse_roll(windows * 2.0, 4, 8, 8, 2)


def test_torch_compile_no_graph_break():
    x = random_tensor((2, 8, 8, 3), torch.float32, DEVICE).requires_grad_()
    out = torch.compile(_swin_block_shuffle, fullgraph=True, backend="aot_eager")(x)
    out.sum().backward()
    assert_close(out, 2.0 * x.detach().double())
    assert_close(x.grad, torch.full(x.shape, 2.0, dtype=torch.float64))


def test_opcheck():
    ops = torch.ops.fusedops
    x = random_tensor((2, 4, 6, 3), torch.float32, DEVICE).requires_grad_()
    windows = random_tensor((8, 2, 3, 3), torch.float32, DEVICE).requires_grad_()
    torch.library.opcheck(ops.window_partition_roll.default, (x, 2, 3, 1, 5, None))
    torch.library.opcheck(ops.window_reverse_roll.default, (windows, 2, 3, 4, 6, 3, 1, None))
    torch.library.opcheck(
        ops.window_partition_roll_backward.default, (windows.detach(), 2, 3, 4, 6, 1, 5, None)
    )
    torch.library.opcheck(ops.window_reverse_roll_backward.default, (x.detach(), 2, 3, 3, 1, None))


def test_torch_export_keeps_the_custom_ops():
    class Shuffle(torch.nn.Module):
        def forward(self, x):
            return _swin_block_shuffle(x)

    x = random_tensor((1, 8, 8, 2), torch.float32, "cpu")
    exported = torch.export.export(Shuffle(), (x,))
    graph = str(exported.graph)
    assert "fusedops.window_partition_roll" in graph and "fusedops.window_reverse_roll" in graph
    assert_close(exported.module()(x), 2.0 * x.double())


def test_partial_trace_lowers_into_one_xla_program_per_direction():
    pytest.importorskip("jax")
    from fusedops.xla import partial_trace

    torch._dynamo.reset()
    traced = partial_trace(_swin_block_shuffle, fullgraph=True)
    x = random_tensor((2, 8, 8, 3), torch.float32, "cpu").requires_grad_()
    out = traced(x)
    weights = random_tensor(out.shape, torch.float32, "cpu")
    (out * weights).sum().backward()
    assert_close(out, 2.0 * x.detach().double())
    assert_close(x.grad, 2.0 * weights.double())
    assert traced.stats.programs == 2 and traced.stats.regions == 1
    assert not traced.stats.eager_ops


@pytest.mark.parametrize(("b", "c"), [(2, 0), (0, 3)], ids=["no-channels", "no-batch"])
def test_xla_lowerings_of_empty_maps(b, c):
    """The four lowerings (both gathers and their backward ops) on maps with no channels or no
    images, as they run inside a program."""
    jnp = pytest.importorskip("jax.numpy")
    from fusedops.xla import lower

    ops = torch.ops.fusedops
    x = jnp.zeros((b, 4, 6, c), jnp.float32)
    windows = lower.LOWERINGS[ops.window_partition_roll.default](x, 2, 3, 1, -1)
    dx = lower.LOWERINGS[ops.window_partition_roll_backward.default](windows, 2, 3, 4, 6, 1, -1)
    back = lower.LOWERINGS[ops.window_reverse_roll.default](windows, 2, 3, 4, 6, 1, 2)
    dwindows = lower.LOWERINGS[ops.window_reverse_roll_backward.default](back, 2, 3, 1, 2)
    assert windows.shape == dwindows.shape == (b * 4, 2, 3, c)
    assert dx.shape == back.shape == (b, 4, 6, c)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fusedops.window_partition_roll([1.0], 2), TypeError, "x must be a torch.Tensor"),
        (
            lambda: fusedops.window_partition_roll(torch.ones(2, 4, 4, 3, dtype=torch.int32), 2),
            TypeError,
            "x has dtype torch.int32",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(4, 4, 3), 2),
            ValueError,
            "x must be 4-D",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(1, 14, 21, 3), 4),
            ValueError,
            "x: height 14 is not divisible by window_size 4",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(1, 8, 6, 3), (4, 4)),
            ValueError,
            "x: width 6 is not divisible by window_size 4",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(1, 4, 4, 3), 0),
            ValueError,
            "window_size",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(1, 4, 4, 3), 2.0),
            TypeError,
            "window_size",
        ),
        (
            lambda: fusedops.window_partition_roll(torch.ones(1, 4, 4, 3), 2, "1"),
            TypeError,
            "shift",
        ),
        (
            lambda: fusedops.window_reverse_roll(torch.ones(3, 2, 2, 1), 2, 4, 4),
            ValueError,
            "windows has 3 windows, not a multiple of the 4",
        ),
        (
            lambda: fusedops.window_reverse_roll(torch.ones(4, 2, 2, 1), 2, 5, 4),
            ValueError,
            "height 5 is not divisible",
        ),
        (
            lambda: fusedops.window_reverse_roll(torch.ones(4, 2, 3, 1), 2, 4, 4),
            ValueError,
            "windows has windows of",
        ),
        (
            lambda: fusedops.window_reverse_roll(torch.ones(4, 2, 2, 1), 2, 4.0, 4),
            TypeError,
            "height must be an int",
        ),
        (
            lambda: WindowProcess.apply(torch.ones(1, 4, 4, 3), 1, 4, 4, 5, 0, 2),
            ValueError,
            "x has shape",
        ),
        (
            lambda: WindowProcessReverse.apply(torch.ones(4, 2, 2, 3), 1, 4, 4, 5, 0, 2),
            ValueError,
            "C=5",
        ),
    ],
)
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _batch_cases():
    """(backend, windows, grid-dim-1/2 limit): 6 windows past a limit lowered to 3 on every
    backend here; 70000 windows (more than CUDA's 65535 of grid dims 1 and 2) on a GPU."""
    cases = [(backend, 6, 3) for backend in BACKENDS]
    real = [("triton", 70000, None), ("cuda", 70000, None)]
    # big_memory: about 3 GiB of float64 inputs each; out of memory beside 13 other workers on
    # the H100 run of 2026-11-26 (passed alone)
    marks = [pytest.mark.gpu, pytest.mark.big_memory]
    return cases + [pytest.param(*c, marks=marks) for c in real]


@pytest.mark.parametrize(("backend", "windows", "limit"), _batch_cases(), ids=str)
def test_large_batch_and_side_stream(grid_limit, backend, windows, limit):
    """More windows than a grid dimension holds, odd channel counts (narrow accesses), launched
    on a side stream ordered after the stream that wrote x (torch.cpu's streams on the CPU); the
    Triton kernel puts the windows on grid dim 0 (every launch checked against the limit)."""
    from fusedops.kernels.triton import window_process as triton_process

    grids = grid_limit(triton_process, limit) if limit and backend == "triton" else None

    def there_and_back(x):
        out = fusedops.window_partition_roll(x, 7, -3, backend=backend)
        return out, fusedops.window_reverse_roll(out, 7, 7, 7, 3, backend=backend)

    for c in (3, 96, 97):
        x = random_tensor((windows, 7, 7, c), torch.float16, DEVICE)
        out, back = run_on_side_stream(there_and_back, x)
        assert torch.equal(out, oracle_partition(x, 7, -3))
        assert torch.equal(back, x)
    if grids is not None:
        assert max(g[0] for g in grids) == windows > limit


@pytest.mark.gpu
@pytest.mark.big_memory
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_64_bit_offsets(backend):
    """More than 2^31 elements: offsets past int32. GPU only: the kernels compute offsets in
    int64 always (no limit to lower for a small CPU case), so only 2^31 real elements test it
    (13 GB: x, the windows and back)."""
    x = torch.zeros((2, 1024, 1024, 1040), dtype=torch.float16, device="cuda")
    x.view(-1)[::9973] = 1.0
    x[-1, -1, -1, -1] = 7.0
    windows = fusedops.window_partition_roll(x, 8, -4, backend=backend)
    assert windows[-1, -5, -5, -1].item() == 7.0  # shifted by 4 inside the last window
    back = fusedops.window_reverse_roll(windows, 8, 1024, 1024, 4, backend=backend)
    assert torch.equal(back, x)

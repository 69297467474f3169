"""The CPU-specific lowerings behind partial_trace's speed on Hugging Face models
(``bench_xla.py --hf``): each against eager torch through ``partial_trace(fullgraph=True)``,
forward and backward, with a check that the fast path is the one that ran."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from fusedops.testing import tolerance
from tests.xla.traced import check_traced, no_cpu_tune  # noqa: F401

pytest.importorskip("jax")

from fusedops.xla import lower_depthwise  # noqa: E402


@pytest.fixture
def depthwise_calls(monkeypatch):
    """Counts of ``lower_depthwise``'s forward / input-gradient / weight-gradient calls."""
    calls = {"forward": 0, "input": 0, "weight": 0}
    for key, name in (
        ("forward", "depthwise"),
        ("input", "depthwise_input_grad"),
        ("weight", "depthwise_weight_grad"),
    ):
        original = getattr(lower_depthwise, name)

        def spy(*args, _original=original, _key=key):
            calls[_key] += 1
            return _original(*args)

        monkeypatch.setattr(lower_depthwise, name, spy)
    return calls


_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}

# (input shape, weight shape, conv keyword arguments): ConvNeXt's 7x7, channel multiplier 2,
# stride and dilation per dim, a kernel larger than the input (padding keeps it valid), 1-D,
# 3-D, one sample
DEPTHWISE = [
    ((3, 8, 9, 9), (8, 1, 7, 7), {"padding": 3, "groups": 8}),
    ((2, 4, 9, 11), (8, 1, 3, 5), {"padding": (1, 2), "stride": (2, 3), "dilation": (2, 1)}),
    ((2, 4, 2, 3), (4, 1, 7, 7), {"padding": 3}),
    ((2, 3, 10), (6, 1, 5), {"padding": 2, "stride": 2}),
    ((2, 2, 4, 5, 6), (2, 1, 3, 3, 3), {"padding": 1}),
    ((1, 5, 7, 6), (5, 1, 3, 3), {"padding": 0, "stride": 2}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kwargs"), DEPTHWISE, ids=str)
def test_depthwise_convolution_matches_eager(depthwise_calls, x_shape, w_shape, kwargs):
    kwargs = {"groups": x_shape[1], **kwargs}
    conv = _CONV[len(x_shape)]
    cpu = torch.device("cpu")
    x, w = torch.randn(x_shape, device=cpu), torch.randn(w_shape, device=cpu)
    b = torch.randn(w_shape[0], device=cpu)
    # the longest sums: over the taps (forward, input gradient) or batch x positions (weight)
    terms = max(math.prod(w_shape[2:]), x_shape[0] * math.prod(x_shape[2:]))
    magnitude = _largest_term_sum(lambda x, w: conv(x, w, None, **kwargs), x, w)
    check_traced(lambda x, w, b: conv(x, w, b, **kwargs), x, w, b, terms=terms, magnitude=magnitude)
    assert depthwise_calls == {"forward": 1, "input": 1, "weight": 1}, depthwise_calls


def _largest_term_sum(conv, x, w) -> float:
    """The largest sum of |terms| behind one element of the output or of a gradient (x, w, the
    bias) under check_traced's cotangent (randn from seed 0): a convolution is bilinear, so
    these are the output and gradients of the same convolution of |x|, |w| and |cotangent|."""
    x_abs, w_abs = x.abs().requires_grad_(), w.abs().requires_grad_()
    out = conv(x_abs, w_abs)
    generator = torch.Generator().manual_seed(0)
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=generator).abs()
    grad_x, grad_w = torch.autograd.grad(out, (x_abs, w_abs), cotangent)
    grad_b = cotangent.sum(dim=[d for d in range(cotangent.dim()) if d != 1])
    return max(t.max().item() for t in (out, grad_x, grad_w, grad_b))


def test_depthwise_convolution_float16(depthwise_calls):
    """16-bit inputs are summed in fp32 and rounded once; eager's fp16 CPU convolution may round
    in fp16 along its 9-term sums, so the tolerance is fp16's over 9 terms at their scale."""
    x = torch.randn(2, 6, 8, 8, dtype=torch.float16, device="cpu")
    w = torch.randn(6, 1, 3, 3, dtype=torch.float16, device="cpu")
    scale = F.conv2d(x.abs().float(), w.abs().float(), padding=1, groups=6).max().item()
    check_traced(
        lambda x, w: F.conv2d(x, w, padding=1, groups=6),
        x,
        w,
        terms=9,
        magnitude=scale,  # the largest sum |x w| of an output
        compute=x.dtype,
    )
    assert depthwise_calls["forward"] == 1 and depthwise_calls["weight"] == 1


def test_grouped_convolution_with_several_channels_per_group_is_not_depthwise(depthwise_calls):
    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 2, 3, 3)
    # the longest sums: the weight gradient's, over batch x positions (2 x 36)
    check_traced(lambda x, w: F.conv2d(x, w, padding=1, groups=2), x, w, terms=72)
    assert depthwise_calls == {"forward": 0, "input": 0, "weight": 0}


# (logits shape, target shape, cross_entropy keyword arguments): the masked-LM head's (ignored
# positions, mean), class weights, a per-pixel loss (nll_loss2d), no reduction, one sample
CROSS_ENTROPY = [
    ((12, 9), (12,), {"ignore_index": -100}),
    ((12, 9), (12,), {"weight": "random", "ignore_index": 3, "reduction": "sum"}),
    ((2, 5, 3, 4), (2, 3, 4), {"weight": "random", "ignore_index": 1}),
    ((6, 7), (6,), {"reduction": "none", "ignore_index": 0}),
    ((7,), (), {}),
]


@pytest.fixture
def one_hot_scatters(monkeypatch):
    """The scatters ``lower_shape._scatter`` ran as a compare (one index per row)."""
    from fusedops.xla import lower_shape

    hits = []
    original = lower_shape._one_per_row

    def spy(x, dim, index):
        found = original(x, dim, index)
        if found:
            hits.append(tuple(x.shape))
        return found

    monkeypatch.setattr(lower_shape, "_one_per_row", spy)
    return hits


@pytest.mark.parametrize(("x_shape", "t_shape", "kwargs"), CROSS_ENTROPY, ids=str)
def test_cross_entropy_backward_matches_eager(one_hot_scatters, x_shape, t_shape, kwargs):
    """nll_loss's backward (decomposed to a one-hot scatter) is a compare against the class
    index, not a scatter into zeros: gradients of log_softmax + nll_loss with ignored targets,
    class weights and every reduction."""
    classes = x_shape[1] if len(x_shape) > 1 else x_shape[0]
    target = torch.randint(0, classes, t_shape)
    if "ignore_index" in kwargs and target.dim():
        target.view(-1)[::3] = kwargs["ignore_index"]  # some positions ignored
    if kwargs.get("weight") == "random":
        kwargs = {**kwargs, "weight": torch.rand(classes) + 0.5}
    x = torch.randn(x_shape)
    check_traced(lambda x, t: F.cross_entropy(x, t, **kwargs), x, target, terms=x.numel())
    assert one_hot_scatters, "the backward's one-hot scatter did not take the compare path"


# (x shape, dim, index shape): one index per row along the last dim, the first, a middle one;
# then two per row and a partial index (the general scatter)
SCATTERS = [
    ((6, 9), -1, (6, 1)),
    ((5, 4, 3), 0, (1, 4, 3)),
    ((2, 7, 3), 1, (2, 1, 3)),
    ((6, 9), 1, (6, 2)),
    ((6, 9), 1, (4, 1)),
]


@pytest.mark.parametrize("with_src", [False, True], ids=["value", "src"])
@pytest.mark.parametrize(("x_shape", "dim", "i_shape"), SCATTERS, ids=str)
def test_scatter_with_one_index_per_row_is_a_compare(
    one_hot_scatters, x_shape, dim, i_shape, with_src
):
    """scatter with one index per row (the decomposed nll_loss backward's one-hot) is lowered
    as a compare against the index; other scatters as scatters; both match eager, forward
    and backward (src's gradient included)."""
    d = dim % len(x_shape)
    index = torch.stack(
        [torch.randperm(x_shape[d])[: i_shape[d]] for _ in range(math.prod(i_shape) // i_shape[d])]
    )  # distinct indices along dim in each row, so the result does not depend on write order
    index = index.reshape(*i_shape[:d], *i_shape[d + 1 :], i_shape[d]).movedim(-1, d)
    x = torch.randn(x_shape)
    if with_src:
        src = torch.randn(i_shape)
        check_traced(lambda x, s: torch.scatter(x, dim, index, s), x, src, rtol=0, atol=0)
    else:
        check_traced(lambda x: torch.scatter(x, dim, index, -1.5), x, rtol=0, atol=0)
    one_per_row = (
        i_shape[d] == 1 and i_shape[:d] + i_shape[d + 1 :] == x_shape[:d] + x_shape[d + 1 :]
    )
    assert bool(one_hot_scatters) == one_per_row


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_cpu_results_cross_to_torch_without_copy_or_warning(dtype):
    """A CPU program's results become torch tensors viewing the result buffers (NumPy views;
    bfloat16 by DLPack), silently, and torch may write them in place."""
    import warnings

    import jax

    from fusedops.xla import bridge, lower

    with jax.enable_x64(True):
        value = jax.device_put(jax.numpy.arange(1, 7).reshape(2, 3), jax.devices("cpu")[0])
        value = value.astype(lower.jax_dtype(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = bridge.to_torch(value)
        with bridge.quiet_crossings():
            again = bridge.to_torch(value)
    assert out.dtype == dtype and out.data_ptr() == value.unsafe_buffer_pointer()
    assert again.data_ptr() == out.data_ptr()
    out[0, 0] = 0
    assert not bool(again[0, 0])


def _aten_graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def test_outputs_that_are_views_of_inputs_are_made_by_torch():
    """A program output that is views of an input (AOTAutograd saving ``weight.t()``) is a
    torch view of the input tensor, not a copy out of the program; computed outputs still come
    from the program; with views_in_torch=False (xla_trace) every output is the program's."""
    from fusedops.xla.program import JaxProgram

    def fn(w, x):
        return w.t(), (x * 2).view(-1), w.view(3, 4).unsqueeze(0)[:, 1:], x.detach()

    w, x = torch.randn(4, 3), torch.randn(2, 5)
    gm = _aten_graph(fn, w, x)
    program = JaxProgram(gm)
    outs = program([w, x])
    for out, expected in zip(outs, fn(w, x)):
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert outs[0].data_ptr() == w.data_ptr() and outs[0].stride() == (1, 3)
    assert outs[2].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert outs[3].data_ptr() == x.data_ptr()
    assert outs[1].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    copied = JaxProgram(gm, views_in_torch=False)([w, x])
    assert copied[0].data_ptr() != w.data_ptr()
    torch.testing.assert_close(copied[0], w.t(), rtol=0, atol=0)
    # an input with other strides than traced: the view becomes a reshape, same values
    wide = torch.randn(3, 4).t()
    torch.testing.assert_close(program([wide, x])[2], wide.reshape(3, 4)[None, 1:])


@contextlib.contextmanager
def _recording(record):
    """Inside: each program call first hands its ``JaxProgram`` to ``record``."""
    from fusedops.xla import program

    original = program.JaxProgram.__call__

    def spy(self, args):
        record(self)
        return original(self, args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(program.JaxProgram, "__call__", spy)
        yield


def _traced_copy(eager: torch.nn.Module, record):
    """(a copy of ``eager``, it under ``partial_trace(fullgraph=True)``, ``_recording(record)``)."""
    import copy

    from fusedops.xla import partial_trace

    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    return model, partial_trace(model, fullgraph=True), _recording(record)


def test_training_with_saved_weight_views_matches_eager():
    """A tied-embedding masked-LM head (the backward reads the weight's transpose, saved as a
    view of the weight) trains under partial_trace as eagerly, gradients included."""

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 6)
            self.norm = torch.nn.LayerNorm(6)

        def forward(self, ids, labels):
            h = self.norm(self.embed(ids))
            logits = h @ self.embed.weight.t()
            return F.cross_entropy(logits.view(-1, 11), labels.view(-1), ignore_index=-100)

    ids = torch.randint(0, 11, (3, 4))
    labels = torch.where(torch.rand(3, 4) < 0.5, ids, -100)
    labels[0, 0] = ids[0, 0]
    eager = Head()
    views = []
    model, traced, recording = _traced_copy(eager, lambda p: views.extend(n.name for n in p._views))
    with recording:
        for _ in range(2):  # the second step runs the compiled programs again
            expected, actual = eager(ids, labels), traced(ids, labels)
            expected.backward()
            actual.backward()
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
            for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert views, "no output was made as a view of an input"


def test_permuted_inputs_cross_as_their_dense_base(monkeypatch):
    """An input that is a permutation of a dense tensor (w.t(), a permuted activation) crosses
    as its base, transposed back inside the program: same results as contiguous inputs, one
    compiled function per layout; expanded or sliced inputs are made contiguous as before.
    (Inputs this small would cross packed: packing is off here.)"""
    from fusedops.xla import bridge, program
    from fusedops.xla.program import JaxProgram

    monkeypatch.setattr(program, "PACK_MAX_ELEMENTS", 0)

    w, x = torch.randn(4, 3), torch.randn(2, 3, 5)
    assert bridge.contiguous_order(w.t()) == (1, 0)
    assert bridge.contiguous_order(x.permute(2, 0, 1)) == (1, 2, 0)
    assert bridge.contiguous_order(x) is None
    assert bridge.contiguous_order(torch.randn(3, 1).expand(3, 4)) is None
    assert bridge.contiguous_order(x[:, :, ::2]) is None
    assert bridge.contiguous_order(torch.nn.Parameter(w.t())) is None

    def fn(a, b):
        return a @ b.sum(-1), b * 2

    gm = _aten_graph(fn, torch.randn(3, 4), torch.randn(4, 2, 3))
    program = JaxProgram(gm)
    rtol, atol = tolerance(torch.float32, terms=12)  # a @ b.sum(-1): sums of 3 x 4 terms
    x4 = torch.randn(2, 3, 4)
    for a, b in [
        (w.t(), x4.permute(2, 0, 1)),  # both permuted
        (w.t().contiguous(), x4.permute(2, 0, 1).contiguous()),
        (w.t(), x[..., :4].permute(2, 0, 1)),  # b sliced along its innermost dim: copied
    ]:
        got = program([a, b])
        for out, expected in zip(got, fn(a, b)):
            torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    layouts = sorted(str(layout) for _, layout, _ in program._functions)
    assert layouts == ["((1, 0), (1, 2, 0))", "((1, 0), None)", "None"], layouts


def test_small_inputs_and_results_cross_packed(monkeypatch):
    """On the CPU, inputs and results of at most ``PACK_MAX_ELEMENTS`` elements cross as one
    flat buffer per dtype each way (a permuted, a sliced and a 0-d input among them), larger
    ones and views of inputs as before; the results are eager's, and each packed result is a
    tensor of its own (no view: written in place, it changes nothing else)."""
    from fusedops.xla import bridge, program
    from fusedops.xla.program import JaxProgram

    monkeypatch.setattr(program, "PACK_MAX_ELEMENTS", 64)

    def fn(a, b, c, s, n, big):
        return (a * s, b + 1, c.sum(0), n + 1, (n * 2).view(-1), big * s, big[:2], a.t())

    a, b, c = torch.randn(4, 6), torch.randn(3, 5), torch.randn(7, 3)
    s, n, big = torch.randn(()), torch.arange(6).view(2, 3), torch.randn(10, 10)
    gm = _aten_graph(fn, a, b, c, s, n, big)
    rtol, atol = tolerance(torch.float32, terms=7)  # c.sum(0): XLA's order of 7 terms
    packed = JaxProgram(gm)
    packs = [(str(p.dtype), p.positions) for p in packed._in_packs]
    assert packs == [("torch.float32", (0, 1, 2, 3))], packs
    assert [(str(p.dtype), len(p.positions)) for p in packed._out_packs] == [
        ("torch.float32", 3),
        ("torch.int64", 2),
    ]
    crossed = {"to_jax": 0, "to_torch": 0}
    for name in crossed:
        original = getattr(bridge, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            crossed[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(bridge, name, spy)
    # a permuted and a sliced input: packed copies of them, same values
    calls = [
        (a, b, c, s, n, big),
        (a.t().contiguous().t(), b, torch.randn(7, 6)[:, ::2], s, n, big),
    ]
    for args in calls:
        crossed.update(to_jax=0, to_torch=0)
        outs = packed(list(args))
        # apart: n (int64 alone among the inputs) and big; one flat float32 buffer
        assert crossed == {"to_jax": 3, "to_torch": 1}, crossed  # big * s alone comes back
        for out, expected in zip(outs, fn(*args)):
            torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    assert outs[6].data_ptr() == big.data_ptr()  # a view of an input: made by torch
    for i in (0, 1, 2, 3, 4):  # packed results: tensors of their own
        assert outs[i]._base is None
    before = [o.clone() for o in outs[:5]]
    outs[1].add_(100)
    for i in (0, 2, 3, 4):
        torch.testing.assert_close(outs[i], before[i], rtol=0, atol=0)
    monkeypatch.setenv("FUSEDOPS_XLA_PACK", "0")
    apart = JaxProgram(gm)
    assert not apart._in_packs and not apart._out_packs
    for out, expected in zip(apart(list(calls[0])), fn(*calls[0])):
        torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)


def test_training_with_packed_crossings_matches_eager():
    """A small conv net with batch norm (its parameters, statistics and their updates cross
    packed) trains under partial_trace as eagerly: losses, gradients, running statistics,
    and in-place updates of its outputs."""

    torch.manual_seed(0)
    eager = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
    )
    packs = []
    model, traced, recording = _traced_copy(
        eager, lambda p: packs.extend(p._in_packs + p._out_packs)
    )
    rtol, atol = tolerance(torch.float32, terms=8 * 4 * 4 * 9)
    with recording:
        for _ in range(3):
            x = torch.randn(2, 3, 4, 4)
            expected, actual = eager(x), traced(x)
            expected.mul_(2)  # in place on the output, as a model's caller may
            actual.mul_(2)
            expected.square().mean().backward()
            actual.square().mean().backward()
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
            for (name, p), q in zip(eager.named_parameters(), model.parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=name)
            for (name, b), c in zip(eager.named_buffers(), model.buffers()):
                torch.testing.assert_close(c, b, rtol=rtol, atol=atol, msg=name)
    assert packs, "nothing crossed packed"

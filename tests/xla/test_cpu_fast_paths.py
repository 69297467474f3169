"""The CPU-specific lowerings behind partial_trace's speed on Hugging Face models
(``bench_xla.py --hf``): each against eager torch through ``partial_trace(fullgraph=True)``,
forward and backward, with a check that the fast path is the one that ran."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
    x, w, b = torch.randn(x_shape), torch.randn(w_shape), torch.randn(w_shape[0])
    check_traced(lambda x, w, b: conv(x, w, b, **kwargs), x, w, b, rtol=1e-4, atol=1e-5)
    assert depthwise_calls == {"forward": 1, "input": 1, "weight": 1}, depthwise_calls


def test_depthwise_convolution_float16(depthwise_calls):
    """16-bit inputs are summed in fp32 and rounded once (eager's fp16 CPU convolution too)."""
    x = torch.randn(2, 6, 8, 8, dtype=torch.float16)
    w = torch.randn(6, 1, 3, 3, dtype=torch.float16)
    check_traced(lambda x, w: F.conv2d(x, w, padding=1, groups=6), x, w, rtol=2e-3, atol=2e-3)
    assert depthwise_calls["forward"] == 1 and depthwise_calls["weight"] == 1


def test_grouped_convolution_with_several_channels_per_group_is_not_depthwise(depthwise_calls):
    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 2, 3, 3)
    check_traced(lambda x, w: F.conv2d(x, w, padding=1, groups=2), x, w, rtol=1e-4)
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


@pytest.mark.parametrize(("x_shape", "t_shape", "kwargs"), CROSS_ENTROPY, ids=str)
def test_cross_entropy_backward_matches_eager(x_shape, t_shape, kwargs):
    """nll_loss's backward is a compare against the class index (no scatter): gradients of
    log_softmax + nll_loss with ignored targets, class weights and every reduction."""
    classes = x_shape[1] if len(x_shape) > 1 else x_shape[0]
    target = torch.randint(0, classes, t_shape)
    if "ignore_index" in kwargs and target.dim():
        target.view(-1)[::3] = kwargs["ignore_index"]  # some positions ignored
    if kwargs.get("weight") == "random":
        kwargs = {**kwargs, "weight": torch.rand(classes) + 0.5}
    x = torch.randn(x_shape)
    check_traced(lambda x, t: F.cross_entropy(x, t, **kwargs), x, target, rtol=1e-5, atol=1e-6)


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

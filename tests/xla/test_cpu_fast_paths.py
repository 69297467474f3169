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

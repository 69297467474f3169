"""multi_apply_multi_stream: mmdet's multi_apply results; the CUDA stream ordering (checked on
CPU through a recording stand-in, and on a real device by the gpu tests)."""

from __future__ import annotations

import pytest
import torch

from fusedops.testing import device_under_test, random_tensor
from fusedops.utils import multi_apply, multi_apply_multi_stream
from fusedops.utils.multi_stream import apply_on_streams
from tests.fake_streams import FakeStreams

CPU = torch.device("cpu")


def _head(feature, weight, *, scale):
    """An FPN-style per-level head: class logits and box deltas from one level's features."""
    flat = feature.flatten(2).transpose(1, 2)  # (N, H*W, C)
    logits = flat @ weight * scale
    return logits.sigmoid(), logits.amax(dim=1), feature.shape[-1]


def _levels(device, channels=8):
    return [random_tensor((2, channels, s, s), device=device) for s in (16, 8, 4, 2, 1)]


def test_mmdet_layout_one_list_per_output():
    def f(a, b, *, c):
        return a + b, a * b * c

    assert multi_apply(f, [1, 2, 3], [4, 5, 6], c=2) == ([5, 7, 9], [8, 20, 36])
    assert multi_apply_multi_stream(f, 3, [1, 2, 3], [4, 5, 6], c=2) == ([5, 7, 9], [8, 20, 36])
    assert multi_apply_multi_stream(f, 2, [], [], c=2) == ()


@pytest.mark.parametrize("num_streams", [1, 2, 5, 8])
def test_matches_multi_apply_on_the_device_under_test(num_streams):
    device = device_under_test()
    feats = _levels(device)
    weights = [random_tensor((8, 3), device=device) for _ in feats]
    expected = multi_apply(_head, feats, weights, scale=0.5)
    got = multi_apply_multi_stream(_head, num_streams, feats, weights, scale=0.5)
    assert len(got) == len(expected) == 3
    for got_out, exp_out in zip(got, expected):
        assert len(got_out) == len(exp_out) == 5
        for g, e in zip(got_out, exp_out):
            assert torch.equal(g, e) if isinstance(g, torch.Tensor) else g == e


def test_gradients_flow_through_every_call():
    feats = [f.requires_grad_(True) for f in _levels(device_under_test())]
    weight = random_tensor((8, 3), device=feats[0].device).requires_grad_(True)
    probs, _, _ = multi_apply_multi_stream(_head, 2, feats, [weight] * 5, scale=1.0)
    sum(p.sum() for p in probs).backward()
    got = [f.grad.clone() for f in feats] + [weight.grad.clone()]
    for t in (*feats, weight):
        t.grad = None
    probs, _, _ = multi_apply(_head, feats, [weight] * 5, scale=1.0)
    sum(p.sum() for p in probs).backward()
    for g, t in zip(got, (*feats, weight)):
        assert torch.equal(g, t.grad)


@pytest.mark.parametrize("num_streams", [1, 2, 3])
def test_stream_ordering(num_streams):
    streams = FakeStreams()
    feats = _levels(CPU)
    weights = [random_tensor((8, 3), device=CPU) for _ in feats]
    active = []

    def head(feature, weight, *, scale):
        active.append(streams.active.name)
        return _head(feature, weight, scale=scale)

    groups = list(zip(feats, weights))
    got = apply_on_streams(streams, head, num_streams, groups, {"scale": 0.5})
    expected = multi_apply(_head, feats, weights, scale=0.5)
    assert all(torch.equal(g, e) for g, e in zip(got[0], expected[0]))
    # call i on side stream i % num_streams
    assert active == [f"side{i % num_streams}" for i in range(len(feats))]
    log = streams.log
    first_enter = next(i for i, e in enumerate(log) if e[0] == "enter")
    last_exit = max(i for i, e in enumerate(log) if e[0] == "exit")
    sides = {f"side{k}" for k in range(num_streams)}
    # every side stream waits for the inputs (current stream) before any call is queued
    waits_before = {
        e[1] for e in log[:first_enter] if e[:1] == ("wait_stream",) and e[2] == "current"
    }
    assert waits_before == sides
    # the current stream waits for every side stream after the last call
    joins = {e[2] for e in log[last_exit:] if e[0] == "wait_stream" and e[1] == "current"}
    assert joins == sides
    # every output tensor is marked as used on the current stream, after the join
    recorded = {e[1] for e in log[last_exit:] if e[0] == "record_stream" and e[2] == "current"}
    outputs = {id(t) for out in got[:2] for t in out}
    assert outputs == recorded


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_streams"):
        multi_apply_multi_stream(_head, 0, [], [])
    with pytest.raises(TypeError, match="num_streams"):
        multi_apply_multi_stream(_head, 2.0, [], [])
    with pytest.raises(TypeError, match="func"):
        multi_apply_multi_stream(None, 2, [], [])


@pytest.mark.gpu
def test_cuda_streams_results_survive_freed_inputs():
    """Real streams: results equal the sequential apply and stay intact when the inputs are
    freed and their memory reused right after the call."""
    device = torch.device("cuda")
    for _ in range(3):
        feats = _levels(device, channels=64)
        weights = [random_tensor((64, 16), device=device) for _ in feats]
        expected = [p.clone() for p in multi_apply(_head, feats, weights, scale=0.1)[0]]
        probs, _, _ = multi_apply_multi_stream(_head, 3, feats, weights, scale=0.1)
        del feats, weights
        junk = [torch.full((2, 64, 64, 64), 7.0, device=device) for _ in range(4)]
        for p, e in zip(probs, expected):
            assert torch.equal(p, e)
        del junk
    torch.cuda.synchronize()

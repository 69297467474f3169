"""fusedops.xla.tune: each CPU program keeps the fastest dot library, and every library gives
eager's numbers."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch
from torch import nn

from fusedops.testing import assert_close, random_tensor
from fusedops.xla import partial_trace, tune
from tests.xla import models

jax = pytest.importorskip("jax")


def _sleeper(seconds: float, value: float):
    def run(x):
        time.sleep(seconds)
        return np.full(2, value) + x

    return run


def test_fastest_keeps_the_quickest_candidate_and_its_results():
    functions = {tune.DEFAULT: _sleeper(0.03, 1.0), "other": _sleeper(0.001, 2.0)}
    name, function, results, seconds = tune.fastest(functions, (np.zeros(2),))
    assert name == "other" and function is functions["other"]
    np.testing.assert_array_equal(results, [2.0, 2.0])
    assert seconds[tune.DEFAULT] >= 0.03 > seconds["other"]


def test_fastest_skips_a_candidate_the_compiler_refuses_but_not_the_default():
    good = jax.jit(lambda x: x + 1)
    refused = jax.jit(lambda x: x + 1, compiler_options={"xla_fusedops_no_such_option": "1"})
    x = np.zeros(3, np.float32)
    name, _, results, seconds = tune.fastest({tune.DEFAULT: good, "refused": refused}, (x,))
    assert name == tune.DEFAULT and seconds == {}  # one candidate left: nothing to time
    np.testing.assert_array_equal(results, np.ones(3, np.float32))
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_fusedops_no_such_option"):
        tune.fastest({tune.DEFAULT: refused}, (x,))


def test_fastest_drops_a_candidate_that_fails_while_timed():
    calls = []

    def flaky(x):
        calls.append(x)
        if len(calls) > 1:  # compiles and runs once, then fails (say, out of memory)
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: flaky")
        return np.zeros(2)

    functions = {tune.DEFAULT: _sleeper(0.01, 1.0), "flaky": flaky}
    name, _, results, seconds = tune.fastest(functions, (np.zeros(2),))
    assert name == tune.DEFAULT and set(seconds) == {tune.DEFAULT}
    np.testing.assert_array_equal(results, [1.0, 1.0])


def _attention_block():
    torch.manual_seed(0)
    return nn.Sequential(models.Block(dim=16, heads=2, p=0.0), nn.LayerNorm(16))


def _trace_and_check(model, shape=(3, 7, 16)):
    """One forward+backward of ``model`` on a random x of ``shape`` under partial_trace against
    eager; the programs."""
    ref = copy.deepcopy(model)
    traced = partial_trace(model)
    x = random_tensor(shape)
    traced(x).square().mean().backward()
    ref(x).square().mean().backward()
    assert_close(traced(x), ref(x), dtype=torch.float32, scale=2.0, msg="output")
    got, want = models.grads(model), models.grads(ref)
    for name in want:
        assert_close(got[name], want[name], dtype=torch.float32, scale=4.0, msg=name)
    return traced.stats.compiled


def test_programs_on_cpu_time_every_candidate_and_keep_one(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_CPU_TUNE", "1")
    programs = _trace_and_check(_attention_block())
    assert [p.name for p in programs] == ["forward", "backward"]
    for program in programs:
        (choice,) = program.tuning.values()
        assert choice["library"] in tune.CANDIDATES
        assert set(choice["seconds"]) == set(tune.CANDIDATES)  # this jaxlib knows both
        assert choice["seconds"][choice["library"]] == min(choice["seconds"].values())


@pytest.mark.parametrize("library", sorted(tune.CANDIDATES))
def test_each_dot_library_matches_eager(monkeypatch, library):
    # the candidate alone (as the only one, so it is surely the one that runs)
    monkeypatch.setattr(tune, "CANDIDATES", {tune.DEFAULT: tune.CANDIDATES[library]})
    for program in _trace_and_check(_attention_block()):
        assert program.tuning["cpu:0"] == {"library": tune.DEFAULT, "seconds": {}}


def test_tuning_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_CPU_TUNE", "0")
    assert not tune.enabled()
    for program in _trace_and_check(_attention_block()):
        assert program.tuning == {"cpu:0": {"library": tune.DEFAULT, "seconds": {}}}


def _counting(seconds: float, calls: list):
    def run(x):
        calls.append(x)
        time.sleep(seconds)
        return x

    return run


@pytest.mark.parametrize(
    ("seconds", "long_run_s", "timed_runs"),
    [(0.001, 0.5, tune.MAX_ROUNDS), (0.07, 0.5, 3), (0.02, 0.01, 1)],  # 3: 0.25 s // 0.07 s
    ids=["quick", "medium", "long"],
)
def test_fastest_times_quick_programs_more_often_than_long_ones(
    monkeypatch, seconds, long_run_s, timed_runs
):
    monkeypatch.setattr(tune, "LONG_RUN_S", long_run_s)
    monkeypatch.setattr(tune, "TIMING_BUDGET_S", 0.25)
    calls_a, calls_b = [], []
    functions = {tune.DEFAULT: _counting(seconds, calls_a), "b": _counting(seconds, calls_b)}
    tune.fastest(functions, (np.zeros(1),))
    assert len(calls_a) == len(calls_b) == 1 + timed_runs  # compiling run + timed runs


class _ConvBlock(nn.Module):
    """A dense 3x3 convolution on 3 channels and, with ``depthwise``, a 3x3 depthwise one."""

    def __init__(self, depthwise: bool):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8) if depthwise else nn.Identity()

    def forward(self, x):
        return torch.relu(self.depthwise(self.stem(x))).mean(dim=(2, 3))


def _conv_programs(model):
    return _trace_and_check(model, (2, 3, 9, 9))


def test_programs_with_a_dense_convolution_also_time_the_convolution_candidates(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_CPU_TUNE", "1")
    torch.manual_seed(0)
    programs = _conv_programs(_ConvBlock(depthwise=True))
    assert [p.name for p in programs] == ["forward", "backward"]
    everything = set(tune.CANDIDATES) | set(tune.CONVOLUTION_CANDIDATES)
    for program in programs:
        (choice,) = program.tuning.values()
        assert set(choice["seconds"]) == everything
    # no convolution, or only a depthwise or 1x1 one (unrolled or matrix products on the CPU:
    # no XLA convolution left)
    depthwise_only, pointwise_only = _ConvBlock(depthwise=False), _ConvBlock(depthwise=False)
    depthwise_only.stem = nn.Conv2d(3, 3, 3, padding=1, groups=3)
    pointwise_only.stem = nn.Conv2d(3, 8, 1, stride=2)
    programs = _trace_and_check(_attention_block())
    programs += _conv_programs(depthwise_only) + _conv_programs(pointwise_only)
    for program in programs:
        (choice,) = program.tuning.values()
        assert set(choice["seconds"]) == set(tune.CANDIDATES)
    assert not tune.candidates(convolution=False).keys() & tune.CONVOLUTION_CANDIDATES.keys()


@pytest.mark.parametrize("library", sorted(tune.CONVOLUTION_CANDIDATES))
def test_each_convolution_candidate_matches_eager(monkeypatch, library):
    options = tune.CONVOLUTION_CANDIDATES[library]
    monkeypatch.setattr(tune, "CANDIDATES", {tune.DEFAULT: options})
    monkeypatch.setattr(tune, "CONVOLUTION_CANDIDATES", {})
    torch.manual_seed(0)
    for program in _conv_programs(_ConvBlock(depthwise=True)):
        assert program.tuning["cpu:0"] == {"library": tune.DEFAULT, "seconds": {}}

"""fusedops.optimize: the model it returns, the trials (leaving no trace, dropping a wrong or
failing candidate, the margin), signatures, the cache, logs and the report, and 2 ranks agreeing.

Candidates are stand-ins timed by a stand-in clock (``Clock``): each adds its cost to the
clock when it runs, so the picks are exact and nothing compiles; the real "fused" candidate runs
where its picks are checked against the model's own numbers."""

from __future__ import annotations

import copy
import json
import logging
import time
import warnings

import pytest
import torch
from torch import nn

import fusedops
from fusedops.autotune import cache, candidates, measure, region, trial
from fusedops.testing import assert_close, device_under_test, random_tensor, run_gloo

DEVICE = device_under_test()


class Clock:
    """A stand-in for ``trial.clock``: seconds are what the candidates say they cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Net(nn.Module):
    """LayerNorm (fusedops has a fused class for it), batch norm (buffers a trial writes) and
    dropout (random numbers a trial draws)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.batch = nn.BatchNorm1d(width)
        self.drop = nn.Dropout(0.25)
        self.scale = 2.0

    def forward(self, x):
        return self.drop(self.batch(self.linear(self.norm(x)).relu())) * self.scale


def _stand_in(name: str, cost: float, clock: Clock, *, wrong: bool = False, fail: bool = False,
              compiles: bool = False, calls: list | None = None,
              first_costs: tuple = ()):  # fmt: skip
    """A builder of a candidate running the model's own forward at ``cost`` seconds a run
    (its first runs at ``first_costs``: a compile, a warm-up); ``wrong``: its outputs off by
    1%; ``fail``: it raises."""

    def build(module, forward):
        costs = list(first_costs)

        def run(*args, **kwargs):
            if calls is not None:
                calls.append(name)
            if fail:
                raise RuntimeError(f"{name} cannot run this")
            clock.now += costs.pop(0) if costs else cost
            out = forward(*args, **kwargs)
            return out * 1.01 if wrong else out

        return candidates.Candidate(name, run, compiles=compiles)

    return build


@pytest.fixture
def clock(monkeypatch, tmp_path):
    """The stand-in clock, the eager candidate costing 10 s a run, a fresh cache directory;
    host and device time are the wall time (the CPU's rule; CUDA's is tested on its own)."""
    fake = Clock()
    monkeypatch.setattr(trial, "clock", fake)
    monkeypatch.setattr(measure, "split", lambda run, wall, cuda, clock: (wall, wall))
    monkeypatch.setattr(region, "_compile_measured", {})
    monkeypatch.setattr(region, "_compile_seconds", 0.0)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cache.ENV_SWITCH, raising=False)
    cache.forget_memory()
    monkeypatch.setitem(candidates.BUILDERS, "eager", _stand_in("eager", 10.0, fake))
    yield fake
    cache.forget_memory()


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().to(DEVICE)


def _x(rows: int = 8) -> torch.Tensor:
    return random_tensor((rows, 16), torch.float32, DEVICE)


def _step(model, x):
    """One training step's loss and the parameters' gradients (cleared after)."""
    loss = model(x).square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return loss.detach(), grads


# -- the model optimize returns ----------------------------------------------------------------


def test_the_model_keeps_its_keys_parameters_buffers_hooks_and_attributes(clock):
    model = _net()
    keys = list(model.state_dict())
    parameters = list(model.parameters())
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert fusedops.optimize(model, candidates=[]) is model
    assert type(model) is Net and list(model.state_dict()) == keys
    assert all(a is b for a, b in zip(model.parameters(), parameters))
    assert model.scale == 2.0 and model.norm.normalized_shape == (16,)
    x = _x()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()  # built before optimize: its parameters are the model's
    assert seen == [(8, 16)]
    model.eval()
    assert not model.batch.training
    plain = _net()
    plain.load_state_dict(model.state_dict())  # a checkpoint loads into the plain model
    model.load_state_dict(plain.state_dict())  # and back


def test_calling_it_twice_does_nothing_and_warns(clock):
    model = fusedops.optimize(_net(), candidates=[])
    with pytest.warns(UserWarning, match="optimized already"):
        assert fusedops.optimize(model) is model


def test_bad_arguments_are_named(clock, monkeypatch):
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        fusedops.optimize(lambda x: x)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        fusedops.optimize(_net(), optimizer="adam")
    with pytest.raises(ValueError, match=r"unknown candidates \['tensorrt'\]"):
        fusedops.optimize(_net(), candidates=["tensorrt"])
    with pytest.raises(TypeError, match="candidates must be a list"):
        fusedops.optimize(_net(), candidates="compile")
    for margin in (0, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match="margin must be a number in"):
            fusedops.optimize(_net(), margin=margin)
    with pytest.raises(ValueError, match="max_signatures must be an int >= 1"):
        fusedops.optimize(_net(), max_signatures=0)
    for steps in (0, 2.5, True):
        with pytest.raises(ValueError, match="steps must be None or an int >= 1"):
            fusedops.optimize(_net(), steps=steps)
    from fusedops import autotune

    unsharded = autotune.region_fsdp2
    monkeypatch.setattr(autotune, "region_fsdp2", lambda model: True)
    with pytest.raises(ValueError, match="FSDP2"):
        fusedops.optimize(_net())
    monkeypatch.setattr(autotune, "region_fsdp2", unsharded)
    model = fusedops.optimize(_net(), candidates=[])  # fully_shard after optimize: refused
    monkeypatch.setattr(region, "_fsdp2", lambda module: True)  # at the first call
    with pytest.raises(ValueError, match="whether fully_shard comes before or after"):
        model(_x())
    with pytest.raises(ValueError, match="was not optimized"):
        fusedops.optimize_report(_net())


def test_restore_gives_the_model_back(clock):
    model = fusedops.optimize(_net(), candidates=["fused"])
    model(_x())
    fusedops.autotune.restore(model)
    assert "forward" not in model.__dict__ and type(model.norm) is nn.LayerNorm
    assert fusedops.optimize(model, candidates=[]) is model  # can be optimized again


# -- trials ----------------------------------------------------------------------------------


def test_trials_leave_no_trace(clock, monkeypatch):
    """Batch-norm statistics, the random state (dropout) and .grad after the first call and its
    backward are what the model alone gives."""
    monkeypatch.setitem(candidates.BUILDERS, "other", _stand_in("other", 20.0, clock))
    plain, model = _net(1), _net(1)
    fusedops.optimize(model, candidates=["other"])
    x = _x()
    torch.manual_seed(7)
    expected = _step(plain, x)
    torch.manual_seed(7)
    got = _step(model, x)
    assert torch.equal(got[0], expected[0])
    for a, b in zip(got[1], expected[1]):
        assert torch.equal(a, b)
    for a, b in zip(model.buffers(), plain.buffers()):
        assert torch.equal(a, b)
    assert torch.equal(torch.rand(3), (torch.manual_seed(7), plain(x), torch.rand(3))[2])


def test_the_fastest_matching_candidate_is_picked(clock, monkeypatch, caplog):
    calls = []
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock, calls=calls))
    monkeypatch.setitem(candidates.BUILDERS, "wrong", _stand_in("wrong", 1.0, clock, wrong=True))
    monkeypatch.setitem(candidates.BUILDERS, "broken", _stand_in("broken", 1.0, clock, fail=True))
    monkeypatch.setitem(candidates.BUILDERS, "slow", _stand_in("slow", 30.0, clock))
    model = fusedops.optimize(_net(), candidates=["slow", "wrong", "broken", "fast"])
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "fast"
    assert decided.seconds == {"eager": 10.0, "slow": 30.0, "fast": 5.0}
    assert decided.dropped["wrong"].startswith("differs from the model's own code: output 0")
    assert decided.dropped["broken"] == "failed: RuntimeError: broken cannot run this"
    calls.clear()
    model(_x())
    assert calls == ["fast"]  # later calls of the signature run the pick, untimed
    text = caplog.text
    assert "-> fast" in text and "wrong dropped: differs" in text and "broken dropped" in text
    report = fusedops.optimize_report(model)
    assert "fast" in report.splitlines()[0] and "timed" in report.splitlines()[2]


def test_index_outputs_compare_exactly():
    """Integer outputs (NMS's kept indices) must be equal: two picks swapped is a mismatch."""
    values = random_tensor((5,), torch.float32, DEVICE)
    keep = torch.tensor([3, 0, 2], device=DEVICE)
    reference = trial.Result(1.0, [values, keep], [])
    assert trial.mismatch(reference, trial.Result(1.0, [values.clone(), keep.clone()], [])) is None
    swapped = trial.Result(1.0, [values, keep[[1, 0, 2]]], [])
    assert trial.mismatch(reference, swapped) == (
        "output 1: torch.int64 values differ (compared exactly)"
    )


def test_the_margin_keeps_the_models_own_code(clock, monkeypatch):
    monkeypatch.setitem(candidates.BUILDERS, "close", _stand_in("close", 9.8, clock))
    model = fusedops.optimize(_net(), candidates=["close"])
    model(_x())
    assert next(iter(model._fusedops_region.decisions.values())).pick == "eager"  # 2% < 3%
    model = fusedops.optimize(_net(), candidates=["close"], margin=0.99)
    model(_x())
    assert next(iter(model._fusedops_region.decisions.values())).pick == "close"


def test_the_fused_candidate_gives_the_models_numbers(clock, monkeypatch):
    """The real fused candidate (fusedops' LayerNorm swapped in) picked: the step's loss and
    gradients equal the plain model's within fp32 rounding; the classes are swapped for its
    runs only until it is picked."""
    real_fused = candidates.fused

    def cheap_fused(module, forward):
        made = real_fused(module, forward)
        run = made.run

        def timed(*args, **kwargs):
            clock.now += 1.0
            return run(*args, **kwargs)

        made.run = timed
        return made

    monkeypatch.setitem(candidates.BUILDERS, "fused", cheap_fused)
    plain, model = _net(2), _net(2)
    fusedops.optimize(model, candidates=["fused"])
    x = _x()
    torch.manual_seed(3)
    expected = _step(plain, x)
    torch.manual_seed(3)
    got = _step(model, x)
    assert model._fusedops_region.decisions[next(iter(model._fusedops_region.decisions))].pick == (
        "fused"
    )
    assert type(model.norm) is not nn.LayerNorm and isinstance(model.norm, nn.LayerNorm)
    assert_close(got[0], expected[0], terms=16 * 8, magnitude=float(expected[0]))
    for a, b in zip(got[1], expected[1]):
        assert_close(a, b, terms=16 * 8, magnitude=float(b.abs().max()) + 1e-30)


def test_the_models_own_code_never_runs_with_the_fused_classes(clock, monkeypatch):
    """In the rounds taken in turn the model's own code follows the fused candidate's runs:
    each of its runs has the model's own classes back."""
    seen = []
    eager = _stand_in("eager", 10.0, clock)

    def own_classes(module, forward):
        made = eager(module, forward)
        run = made.run

        def recorded(*args, **kwargs):
            seen.append(type(module.norm))
            return run(*args, **kwargs)

        made.run = recorded
        return made

    monkeypatch.setitem(candidates.BUILDERS, "eager", own_classes)
    model = fusedops.optimize(_net(), candidates=["fused"])
    model(_x())
    assert len(seen) > 3 and set(seen) == {nn.LayerNorm}


def test_new_signatures_are_timed_up_to_the_bound(clock, monkeypatch, caplog):
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    model = fusedops.optimize(_net(), candidates=["fast"], max_signatures=2)
    model(_x(8))
    model(_x(8))
    model(_x(12))  # a new batch size: timed
    with torch.no_grad():
        model.eval()
        with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
            model(_x(8))  # eval + no_grad: a third signature, past the bound
    sources = [d.source for d in model._fusedops_region.decisions.values()]
    assert sources == ["timed", "timed", "signature bound"]
    assert "its bound" in caplog.text
    report = fusedops.optimize_report(model)
    assert "eval, no grad: 8x16 float32" in report


def test_inference_signatures_time_the_forward_only(clock, monkeypatch):
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    model = fusedops.optimize(_net().eval(), candidates=["fast"])
    with torch.no_grad():
        out = model(_x())
    assert not out.requires_grad
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "fast"


def test_a_compiling_candidate_past_the_budget_is_left_out(clock, monkeypatch):
    monkeypatch.setitem(candidates.BUILDERS, "jit", _stand_in("jit", 1.0, clock, compiles=True))
    monkeypatch.setattr(region, "COMPILE_BUDGET_S", 0.0)
    model = fusedops.optimize(_net(), candidates=["jit"])
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "eager" and "compile budget" in decided.dropped["jit"]


def test_no_trial_while_compiling(clock, monkeypatch):
    """torch.compile of an optimized model traces the model's own code (its pick where one was
    made): no trial runs inside the trace."""
    calls = []
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock, calls=calls))
    model = fusedops.optimize(_net(), candidates=["fast"])
    compiled = torch.compile(model, backend="eager")
    compiled(_x())
    assert model._fusedops_region.decisions == {}


# -- the cache -------------------------------------------------------------------------------


def test_a_second_run_reads_the_cache(clock, monkeypatch, caplog):
    calls = []
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock, calls=calls))
    fusedops.optimize(_net(), candidates=["fast"])(_x())
    assert calls.count("fast") > 1
    cache.forget_memory()  # as a new process would
    calls.clear()
    model = fusedops.optimize(_net(), candidates=["fast"])
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        model(_x())
    assert calls == ["fast"]  # the call itself: no trial
    (decided,) = model._fusedops_region.decisions.values()
    assert (decided.pick, decided.source) == ("fast", "cache")
    assert "(cache) -> fast" in caplog.text


def test_a_corrupt_entry_is_timed_again(clock, monkeypatch):
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    fusedops.optimize(_net(), candidates=["fast"])(_x())
    cache.forget_memory()
    (entry,) = cache.directory().glob("*.json")
    entry.write_text("{not json")
    model = fusedops.optimize(_net(), candidates=["fast"])
    with pytest.warns(UserWarning, match="ignoring the cached decision"):
        model(_x())
    assert next(iter(model._fusedops_region.decisions.values())).source == "timed"
    assert json.loads(entry.read_text())["decision"]["pick"] == "fast"  # written again


def test_an_unwritable_cache_keeps_decisions_in_memory(clock, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(blocker))
    monkeypatch.setattr(cache, "_warned_unwritable", False)
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    with pytest.warns(UserWarning, match="kept in memory"):
        fusedops.optimize(_net(), candidates=["fast"])(_x())
    model = fusedops.optimize(_net(), candidates=["fast"])
    model(_x())
    assert next(iter(model._fusedops_region.decisions.values())).source == "cache"


def test_autotune_off_runs_the_models_own_code(clock, monkeypatch):
    calls = []
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock, calls=calls))
    monkeypatch.setenv(cache.ENV_SWITCH, "0")
    model = fusedops.optimize(_net(), candidates=["fast"])
    model(_x())
    assert calls == []
    (decided,) = model._fusedops_region.decisions.values()
    assert (decided.pick, decided.source) == ("eager", "autotune off")


# -- several ranks ---------------------------------------------------------------------------


def _ranks(rank: int, world: int, seed: int) -> None:
    """Each rank: an optimized DDP model (stand-in candidates, rank 1's "fast" one twice as
    slow, "flaky" failing on rank 1 only) against eager DDP, three steps."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    fake = Clock()
    trial.clock = fake
    cost = 5.0 if rank == 0 else 20.0
    candidates.BUILDERS["eager"] = _stand_in("eager", 10.0, fake)
    candidates.BUILDERS["fast"] = _stand_in("fast", cost, fake)
    candidates.BUILDERS["flaky"] = _stand_in("flaky", 1.0, fake, fail=rank == 1)
    torch.manual_seed(seed)
    plain = Net().eval()  # no dropout or batch statistics: the ranks' losses compare exactly
    model = copy.deepcopy(plain)
    plain, model = DDP(plain), DDP(model)
    fusedops.optimize(model, candidates=["fast", "flaky"], cache=False)
    for step in range(3):
        generator = torch.Generator().manual_seed(seed + 10 * rank + step)
        x = torch.randn(4, 16, generator=generator)
        expected, got = _step(plain, x), _step(model, x)
        assert torch.equal(got[0], expected[0])
    (decided,) = model.module._fusedops_region.decisions.values()
    assert decided.pick == "fast", decided  # rank 0's times decided, on every rank
    assert decided.dropped["flaky"] in ("failed: RuntimeError: flaky cannot run this",
                                        "failed or differed on another rank")  # fmt: skip
    picks = [None] * world
    dist.all_gather_object(picks, decided.pick)
    assert picks == ["fast"] * world
    # a step where one rank alone meets a new signature (its batch of another size): decided
    # by that rank, no collective to wait on; its own times decide (its "fast" is slower)
    _step(model, torch.randn(4 if rank == 0 else 6, 16, device="cpu"))
    decisions = list(model.module._fusedops_region.decisions.values())
    assert len(decisions) == 1 + rank
    assert rank == 0 or (decisions[-1].pick, decisions[-1].source) == ("eager", "timed")
    # first calls that differ between the ranks: each rank decides alone
    other = DDP(copy.deepcopy(plain.module))
    fusedops.optimize(other, candidates=["fast"], cache=False)
    other(torch.randn(4 + rank, 16, device="cpu"))
    (first,) = other.module._fusedops_region.decisions.values()
    assert first.pick == ("fast" if rank == 0 else "eager"), first
    dist.barrier()  # every rank got here: nobody waits on a collective another skipped


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="no gloo",
)
def test_ranks_make_the_same_decision(monkeypatch, tmp_path):
    seed = int(torch.randint(0, 2**20, (), device="cpu").item())
    run_gloo(_ranks, 2, seed, timeout=120, env={"FUSEDOPS_CACHE_DIR": str(tmp_path)})


def test_warm_up_runs_until_the_time_settles(clock, monkeypatch):
    """A candidate whose first runs are slow (compile, JIT, allocator) is timed once it
    settles: its first run 100 s, then 40, 5.2, then 5 s a run."""
    calls = []
    slow_start = _stand_in("jit", 5.0, clock, calls=calls, first_costs=(100, 40, 5.2))
    monkeypatch.setitem(candidates.BUILDERS, "jit", slow_start)
    model = fusedops.optimize(_net(), candidates=["jit"])
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.seconds["jit"] == 5.0 and decided.pick == "jit"
    # first run, warm-ups 40, 5.2, 5 (within 10% of 5.2: settled), the timed rounds, the call
    assert calls.count("jit") == 1 + 3 + 2 * trial.MIN_ROUNDS + 1


def test_candidates_take_turns_so_a_burst_of_load_slows_them_all(clock, monkeypatch):
    """The timed rounds take turns: a burst of other load on the machine that begins once
    "fast" has warmed up and lasts four runs (each 3x slower) slows the model's own code too,
    and the clean round shows "fast" faster. Timed one after the other, all four of "fast"'s
    timed runs would fall in the burst (18 s against 10) and the model's code would be kept."""
    burst = {"armed": False, "left": 0}

    def builder(name, cost):
        def build(module, forward):
            runs = 0

            def run(*args, **kwargs):
                nonlocal runs
                runs += 1
                slow = burst["left"] > 0
                burst["left"] -= slow
                clock.now += cost * (3 if slow else 1)
                if name == "fast" and runs == 2 and not burst["armed"]:  # first run, warm-up
                    burst.update(armed=True, left=4)
                return forward(*args, **kwargs)

            return candidates.Candidate(name, run)

        return build

    monkeypatch.setitem(candidates.BUILDERS, "eager", builder("eager", 10.0))
    monkeypatch.setitem(candidates.BUILDERS, "fast", builder("fast", 6.0))
    model = fusedops.optimize(_net(), candidates=["fast"])
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert burst["armed"] and burst["left"] == 0
    assert decided.seconds == {"eager": 10.0, "fast": 6.0} and decided.pick == "fast"


def test_a_candidate_failing_in_the_timed_rounds_is_dropped(clock, monkeypatch):
    """A candidate that passes its first run and warm-up, then raises in the rounds taken in
    turn, is dropped with the error; the model's own code runs the call."""
    runs = 0

    def build(module, forward):
        def run(*args, **kwargs):
            nonlocal runs
            runs += 1
            if runs > 2:
                raise RuntimeError("out of something")
            clock.now += 1.0
            return forward(*args, **kwargs)

        return candidates.Candidate("late", run)

    monkeypatch.setitem(candidates.BUILDERS, "late", build)
    plain, model = _net(), fusedops.optimize(_net(), candidates=["late"])
    x = _x()
    torch.manual_seed(1)  # the same dropout for both: the trials leave the random state
    out = model(x)
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "eager" and set(decided.seconds) == {"eager"}
    assert decided.dropped["late"] == "failed while timed: RuntimeError: out of something"
    torch.manual_seed(1)
    assert torch.equal(out, plain(x))


def test_the_steps_hint_leaves_out_a_compile_that_cannot_repay(clock, monkeypatch, caplog):
    """steps=: with the model's own code at 10 s a call, 1 call left cannot repay a compile
    expected at 15 s (no compile measured yet): left out, with a log line; 10 calls can, and
    the compile measured then (60 s) is what later regions expect."""
    jit = _stand_in("jit", 5.0, clock, compiles=True, first_costs=(65,))
    monkeypatch.setitem(candidates.BUILDERS, "jit", jit)
    assert region.COMPILE_ESTIMATE_S == 15.0
    model = fusedops.optimize(_net(), candidates=["jit"], steps=1)
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "eager" and decided.dropped["jit"].startswith(
        "cannot repay its compile: the 1 calls left (steps=1) take 10 s as written"
    )
    assert "jit left out: cannot repay" in caplog.text
    model = fusedops.optimize(_net(), candidates=["jit"], steps=10, cache=False)
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "jit" and region._compile_measured == {"jit": 60.0}
    model = fusedops.optimize(_net(), candidates=["jit"], steps=5, cache=False)
    model(_x())  # 5 calls of 10 s cannot repay the 60 s measured
    (decided,) = model._fusedops_region.decisions.values()
    assert "its compile about 60 s" in decided.dropped["jit"]


def test_a_long_compile_logs_its_progress(clock, monkeypatch, caplog):

    def build(module, forward):
        def run(*args, **kwargs):
            if not ran:
                ran.append(True)
                time.sleep(0.3)  # the compile, in real seconds
            return forward(*args, **kwargs)

        return candidates.Candidate("jit", run, compiles=True)

    ran = []
    monkeypatch.setitem(candidates.BUILDERS, "jit", build)
    monkeypatch.setattr(measure, "PROGRESS_S", 0.05)
    model = fusedops.optimize(_net(), candidates=["jit"])
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        model(_x())
    assert "region Net: compiling jit" in caplog.text
    assert "still compiling jit (0 s so far)" in caplog.text
    assert not [t for t in __import__("threading").enumerate() if t.name.endswith("progress")]


class _Memory:
    """A stand-in for ``measure.Memory``: the peak is what the candidates say they used."""

    used = 0

    def __init__(self, device):
        pass

    def begin(self):
        _Memory.used = 0

    def peak(self):
        return _Memory.used


def test_a_candidate_over_the_memory_limit_is_dropped(clock, monkeypatch):
    """With 1000 MiB the process could use, a candidate peaking at 950 MiB (over 0.9 of it)
    is dropped, one at 100 MiB kept; the report shows each one's peak."""
    monkeypatch.setattr(measure, "Memory", _Memory)
    monkeypatch.setattr(measure, "available", lambda device: 1000 * 2**20)

    def using(name, mib, cost):
        made = _stand_in(name, cost, clock)

        def build(module, forward):
            candidate = made(module, forward)
            run = candidate.run

            def counted(*args, **kwargs):
                _Memory.used = max(_Memory.used, mib * 2**20)
                return run(*args, **kwargs)

            candidate.run = counted
            return candidate

        return build

    monkeypatch.setitem(candidates.BUILDERS, "big", using("big", 950, 1.0))
    monkeypatch.setitem(candidates.BUILDERS, "small", using("small", 100, 5.0))
    model = fusedops.optimize(_net(), candidates=["big", "small"])
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.pick == "small" and decided.peak_mib == {"big": 950.0, "small": 100.0}
    assert decided.dropped["big"] == (
        "peak memory 950 MiB, over 0.9 of the 1000 MiB this process could use"
    )
    assert "5e+03 ms (peak 100 MiB)" in fusedops.optimize_report(model)


def test_host_and_device_time_apart(clock, monkeypatch):
    """Where the model's own code takes longer on the host than on the device (host 10 s,
    device 4 s: a host-bound region), the fused modules' backends are weighed by their host
    time; where the device takes longer, by their device time. The report shows both."""
    from fusedops.autotune import backends as module_picks

    times = {  # (host, device) seconds of a run
        "eager": (10.0, 4.0),
        "native": (1.0, 9.0),
        "fastln": (3.0, 2.0),
    }

    running = {"name": "eager"}  # what the last run ran: the region's code, or a backend
    real_forward = module_picks.BackendPick._forward

    def recorded(self, *args, **kwargs):
        running["name"] = fusedops.dispatch.requested() or "native"
        return real_forward(self, *args, **kwargs)

    def split(run, wall, cuda, clock):
        run()
        return times.get(running["name"], (50.0, 50.0))  # other backends: slow

    monkeypatch.setattr(module_picks.BackendPick, "_forward", recorded)
    monkeypatch.setattr(measure, "split", split)
    model = fusedops.optimize(_net(), candidates=[])
    model(_x())
    (decided,) = model._fusedops_region.decisions.values()
    assert decided.bound == "host" and module_picks.BOUND == "host"
    assert (decided.host, decided.device) == ({"eager": 10.0}, {"eager": 4.0})
    assert "1e+04 ms (host 1e+04 ms, device 4e+03 ms)" in fusedops.optimize_report(model)

    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    norm = fusedops.nn.LayerNorm(16).to(DEVICE)
    for bound, expected in (("host", "native"), ("device", "fastln")):
        module_picks.forget()
        monkeypatch.setattr(module_picks, "BOUND", bound)
        norm.forward = module_picks.BackendPick(norm)
        with fusedops.dispatch.register_backend(_LayerNormBackend("fastln")):
            norm(_x().requires_grad_())
        ((key, measured),) = module_picks.TRIALS.items()
        assert module_picks.PICKS[key] == expected, (bound, measured)
        assert measured["native"] == times["native"][bound == "device"]
        assert measured["fastln"] == times["fastln"][bound == "device"]
    module_picks.forget()


requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA's events, streams and allocator counters"
)


@requires_cuda
def test_on_cuda_device_time_covers_every_stream():
    """Work launched on a side stream the current stream never waits for is in the device
    time (a device-wide synchronisation ends it), and the host time is the launches'."""
    cuda = torch.device("cuda")
    big = torch.randn(4096, 4096, device=cuda)
    side = torch.cuda.Stream(cuda)

    def side_work():
        side.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(side):
            for _ in range(20):
                big @ big

    side_work()  # cuBLAS's first call out of the measurement
    torch.cuda.synchronize()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    with torch.cuda.stream(side):
        start.record()
        for _ in range(20):
            big @ big
        end.record()
    torch.cuda.synchronize()
    alone = start.elapsed_time(end) / 1e3
    host, device = measure.split(side_work, alone, True, time.perf_counter)
    assert device >= 0.8 * alone, (host, device, alone)
    assert host < device and measure.bound(host, device) == "device"


@requires_cuda
def test_on_cuda_peak_memory_is_counted():
    cuda = torch.device("cuda")
    memory = measure.Memory(cuda)
    memory.begin()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=cuda)
    del block
    assert memory.peak() >= 256 * 2**20
    assert 0 < measure.available(cuda) <= torch.cuda.get_device_properties(cuda).total_memory


@requires_cuda
def test_on_cuda_a_decision_holds_host_device_time_and_peak(monkeypatch, tmp_path):
    """The real clock and measurements: each candidate's host and device time, the
    candidate's peak memory, and what the model's own code is bound by."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(
        candidates.BUILDERS, "same", lambda module, forward: candidates.Candidate("same", forward)
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024)).cuda()
    fusedops.optimize(model, candidates=["same"], cache=False)
    model(torch.randn(4096, 1024, device="cuda")).sum().backward()
    (decided,) = model._fusedops_region.decisions.values()
    assert set(decided.seconds) == set(decided.host) == set(decided.device) == {"eager", "same"}
    assert all(value > 0 for value in [*decided.host.values(), *decided.device.values()])
    assert decided.peak_mib["same"] >= 16  # its activations: 4096 x 1024 fp32 each
    assert decided.bound in ("host", "device")


def test_a_call_never_prints_its_tensors(clock, monkeypatch):
    """A call's signature reads shapes and dtypes, never a tensor's values: printing one is
    milliseconds a call (a batch given as a dict of tensors, as Hugging Face models take)."""
    model = fusedops.optimize(_DictNet(), candidates=[])
    batch = {"b": _x(), "a": _x()}

    def printed(self, *args, **kwargs):
        raise AssertionError("a tensor was printed")

    monkeypatch.setattr(torch.Tensor, "__repr__", printed)
    monkeypatch.setattr(torch.Tensor, "__str__", printed)
    model(batch)
    model(batch)
    (key,) = model._fusedops_region.decisions
    assert '"a": ["tensor", [8, 16]' in key


class _DictNet(nn.Module):
    """A model called on a dict of tensors."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16).to(DEVICE)

    def forward(self, batch):
        return self.linear(batch["a"]) + batch["b"]


def test_warnings_module_is_quiet_on_plain_calls(clock):
    model = fusedops.optimize(_net(), candidates=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(_x())
        model(_x())


def test_autocast_and_gradient_accumulation(clock, monkeypatch):
    """A call under autocast is its own signature (timed apart); gradients accumulated over two
    calls and backwards equal the plain model's (trials put nothing into .grad)."""
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    plain, model = _net(4).eval(), _net(4).eval()  # no dropout or batch statistics
    fusedops.optimize(model, candidates=["fast"])
    x = _x()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        got = model(x)
        expected = plain(x)
    assert got.dtype == expected.dtype == torch.bfloat16 and torch.equal(got, expected)
    batches = [_x(), _x()]
    for net in (plain, model):
        for batch in batches:
            net(batch).square().mean().backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad)
    signatures = [d.signature for d in model._fusedops_region.decisions.values()]
    assert len(signatures) == 2 and '"autocast": [["' in signatures[0]
    assert '"autocast": []' in signatures[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cache_enabled", [True, False])
def test_amp_with_grad_scaler(clock, monkeypatch, dtype, cache_enabled):
    """Training steps under autocast (either dtype, autocast's weight cache on or off) with a
    GradScaler give the plain model's losses and parameters exactly."""
    monkeypatch.setitem(candidates.BUILDERS, "fast", _stand_in("fast", 5.0, clock))
    plain, model = _net(5).eval(), _net(5).eval()
    fusedops.optimize(model, candidates=["fast"])
    batches = [_x(), _x(), _x(12)]  # the third a new signature: timed in the loop too
    losses = {}
    for name, net in (("plain", plain), ("optimized", model)):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**8)
        losses[name] = []
        for batch in batches:
            with torch.autocast(DEVICE.type, dtype=dtype, cache_enabled=cache_enabled):
                loss = net(batch).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            losses[name].append(loss.detach())
    assert [float(v) for v in losses["optimized"]] == [float(v) for v in losses["plain"]]
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert [d.pick for d in model._fusedops_region.decisions.values()] == ["fast", "fast"]


# -- per-module backend picks inside the fused candidate --------------------------------------


class _LayerNormBackend(fusedops.dispatch.Backend):
    """A test kernel family for layer_norm on CPU tensors: the reference's math, off by 1%
    where ``wrong``."""

    devices = ("cpu",)
    pick = fusedops.dispatch.Pick.VERIFIED
    priority = 5

    def __init__(self, name: str, wrong: bool = False):
        self.name, self.wrong = name, wrong

    def unavailable(self, op):
        return [] if op.name == "layer_norm" else [f"{self.name}: layer_norm only"]

    def implementation(self, op):
        from types import SimpleNamespace

        forward, backward = op.reference.layer_norm_forward, op.reference.layer_norm_backward

        def wrong_forward(*args):
            y, mean, rstd = forward(*args)
            return y * 1.01, mean, rstd

        return SimpleNamespace(
            layer_norm_forward=wrong_forward if self.wrong else forward,
            layer_norm_backward=backward,
        )


def test_each_fused_module_runs_on_the_backend_its_trial_picks(clock, monkeypatch):
    """With kernels the rule may run (here test kernels on CPU under FUSEDOPS_UNVERIFIED=1), a
    fused module's first call times each against native, drops the one whose outputs differ
    (one warning naming it) and runs the fastest; without them, nothing is timed."""
    from fusedops.autotune import backends

    backends.forget()
    costs = {"native": 10.0, "fastln": 2.0, "wrongln": 1.0}
    real_forward = backends.BackendPick._forward

    ran = []

    def costed(self, *args, **kwargs):
        ran.append(fusedops.dispatch.requested() or "native")
        clock.now += costs[ran[-1]]
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(backends.BackendPick, "_forward", costed)
    norm = fusedops.nn.LayerNorm(16).to(DEVICE)
    norm.forward = backends.BackendPick(norm)
    x = _x().requires_grad_()
    norm(x)  # only native may run: nothing timed
    ((_, signature),) = backends.PICKS
    assert backends.PICKS[(fusedops.nn.LayerNorm, signature)] == backends.AUTOMATIC
    backends.forget()
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    with (
        fusedops.dispatch.register_backend(_LayerNormBackend("fastln")),
        fusedops.dispatch.register_backend(_LayerNormBackend("wrongln", wrong=True)),
    ):
        with pytest.warns(RuntimeWarning, match="LayerNorm on wrongln .* differs from PyTorch"):
            y = norm(x)
        ((key, measured),) = backends.TRIALS.items()
        assert backends.PICKS[key] == "fastln"
        assert measured["native"] == 10.0 and measured["fastln"] == 2.0
        assert measured["wrongln"].startswith("differs from native: output 0")
        # the timed rounds take turns (two runs each, the second timed), then the call itself
        a, b = ran[-9], ran[-7]
        assert {a, b} == {"native", "fastln"}
        assert ran[-9:] == [a, a, b, b, b, b, a, a, "fastln"], ran
        expected = fusedops.layer_norm(x, (16,), norm.weight, norm.bias, backend="reference")
        assert_close(y, expected, terms=16, magnitude=float(expected.detach().abs().max()))
        norm(x)
        assert fusedops.dispatch.last_used["layer_norm"] == "fastln"
    backends.forget()


def test_the_optimizer_is_swapped_in_place(clock, caplog):
    """optimizer=: torch's SGD becomes FusedSGD, the same object with its groups and state (an
    LR scheduler built before keeps working); an optimizer without a fused class is left as it
    is, with a log line."""
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    groups = optimizer.param_groups
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        fusedops.optimize(model, optimizer=optimizer, candidates=[])
    assert type(optimizer) is fusedops.optim.FusedSGD and optimizer.param_groups is groups
    assert "optimizer SGD -> FusedSGD" in caplog.text
    _step(model, _x())  # the step's gradients are cleared: take them again
    model(_x()).square().mean().backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.05
    other = torch.optim.RMSprop(_net().parameters())
    with caplog.at_level(logging.INFO, logger="fusedops.autotune"):
        fusedops.optimize(_net(), optimizer=other, candidates=[])
    assert type(other) is torch.optim.RMSprop and "RMSprop left as it is" in caplog.text

"""fusedops.xla.pick: on the CPU each partial_trace region runs as its XLA programs or as eager
torch, whichever its first call measured faster; the trials leave no trace (buffers, random
state, gradients) and later calls take the pick."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fusedops.testing import assert_close, random_tensor
from fusedops.xla import partial_trace, pick, program
from tests.xla import models

pytest.importorskip("jax")


@pytest.fixture(autouse=True)
def picking(monkeypatch):
    """The choice on (the suite turns it off elsewhere), one XLA compile per program."""
    monkeypatch.setenv(pick.PICK_ENV, "1")
    monkeypatch.setenv("FUSEDOPS_XLA_CPU_TUNE", "0")


@pytest.fixture
def program_calls(monkeypatch) -> list:
    """The names of the XLA programs called, in order."""
    calls = []
    original = program.JaxProgram.__call__

    def call(self, args):
        calls.append(self.name)
        return original(self, args)

    monkeypatch.setattr(program.JaxProgram, "__call__", call)
    return calls


def _favouring(monkeypatch, winner: str) -> None:
    """Trials run as usual (so that undoing them is tested) but report ``winner`` faster."""
    original = pick._Trial.run

    def run(self, function):
        original(self, function)
        return 1.0 if function.__name__ == f"_{winner}" else 2.0

    monkeypatch.setattr(pick._Trial, "run", run)


def _net() -> nn.Module:
    """Batch norm (statistics written in place) and dropout (random state)."""
    return nn.Sequential(
        nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4)
    )


def _step(model, x, seed: int):
    """One forward+backward from torch seed ``seed``: (output, torch's random state after)."""
    torch.manual_seed(seed)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), torch.get_rng_state()


def _assert_equal_state(a: nn.Module, b: nn.Module) -> None:
    """Same parameters' gradients and buffers, bit for bit."""
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p.grad, q.grad), f"{name}.grad"
    for (name, s), (_, t) in zip(a.named_buffers(), b.named_buffers()):
        assert torch.equal(s, t), name


def _traced_net():
    """(``_net()``, an untouched copy of it, the net under partial_trace, an input)."""
    model = _net()
    return model, copy.deepcopy(model), partial_trace(model), random_tensor((6, 8))


def test_eager_pick_gives_eager_bit_for_bit(monkeypatch, program_calls):
    _favouring(monkeypatch, pick.EAGER)
    model, reference, traced, x = _traced_net()
    for step in range(2):
        seed = int(torch.randint(0, 2**31, (), device="cpu"))
        out, rng = _step(traced, x, seed)
        want, want_rng = _step(reference, x, seed)
        # the trials drew dropout masks and updated the statistics, all undone: the call
        # itself drew the masks eager draws and updated the statistics once
        assert torch.equal(out, want), f"step {step}"
        assert torch.equal(rng, want_rng), f"step {step}"
        _assert_equal_state(model, reference)
        assert int(model[1].num_batches_tracked) == step + 1
        if step == 0:
            # the XLA trials: the compiling run, then one round (times of 1 s and 2 s use up
            # the budget): an untimed run and a timed one
            assert program_calls == ["forward", "backward"] * 3
        program_calls.clear()
    assert program_calls == []  # the second step ran eagerly
    assert [p["pick"] for p in traced.stats.picks] == [pick.EAGER]


def test_xla_pick_runs_the_programs_as_without_trials(monkeypatch, program_calls):
    _favouring(monkeypatch, pick.XLA)
    model, untimed_model, traced, x = _traced_net()
    seeds = [int(torch.randint(0, 2**31, (), device="cpu")) for _ in range(2)]
    outs = [_step(traced, x, seed) for seed in seeds]
    assert program_calls.count("forward") == 3 + 1 + 1  # 3 trials, then 2 steps
    assert [p["pick"] for p in traced.stats.picks] == [pick.XLA]
    monkeypatch.setenv(pick.PICK_ENV, "0")
    torch._dynamo.reset()
    untimed = partial_trace(untimed_model)
    for (out, rng), seed in zip(outs, seeds):
        want, want_rng = _step(untimed, x, seed)
        # the same program, seed (drawn from the restored random state) and statistics
        assert torch.equal(out, want)
        assert torch.equal(rng, want_rng)
    assert untimed.stats.picks == []
    _assert_equal_state(model, untimed_model)
    assert int(model[1].num_batches_tracked) == 2


def test_pick_is_timed_and_trains_like_eager():
    torch.manual_seed(int(torch.randint(0, 2**31, (), device="cpu")))
    model = models.mlp(width=16)
    reference = copy.deepcopy(model)
    traced = partial_trace(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for step in range(3):
        x = random_tensor((5, 8))
        for m, optimizer in zip((traced, reference), optimizers):
            optimizer.zero_grad()
            m(x).square().mean().backward()
            optimizer.step()
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            # Linear layers of width 16: sums of up to 16 products per element
            assert_close(
                p, q, terms=16, magnitude=float(q.detach().abs().max()), msg=f"{step} {name}"
            )
    (chosen,) = traced.stats.picks
    assert set(chosen["seconds"]) == {pick.XLA, pick.EAGER}
    assert all(0 < s < math.inf for s in chosen["seconds"].values())
    assert chosen["pick"] == min(chosen["seconds"], key=chosen["seconds"].get)


def test_no_grad_region_is_timed_by_its_forward(monkeypatch):
    _favouring(monkeypatch, pick.EAGER)
    model = _net().eval()
    traced = partial_trace(model)
    x = random_tensor((6, 8))
    with torch.no_grad():
        out = traced(x)
        assert torch.equal(out, model(x))
    assert [p["pick"] for p in traced.stats.picks] == [pick.EAGER]


def test_each_region_between_graph_breaks_picks_its_own(monkeypatch):
    _favouring(monkeypatch, pick.EAGER)
    layer = nn.Linear(8, 8)

    def fn(x):
        y = layer(x).tanh()
        scale = float(y.abs().max().item())  # a graph break
        return (layer(y) / (1.0 + scale)).sum()

    traced = partial_trace(fn)
    x = random_tensor((4, 8))
    assert torch.equal(traced(x), fn(x))
    assert traced.stats.regions >= 2
    assert len(traced.stats.picks) == traced.stats.regions


def _dynamo_graph(fn, *args) -> torch.fx.GraphModule:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs[0]


def _scaled_in_place(x):
    x.mul_(2)
    return x.sin()


def _row_set(x):
    x[0] = 1.0
    return x.sin()


def _view_written(x):
    x[:, 0].add_(1.0)
    return x.sin()


def _buffer_written(x, buffer):
    buffer.add_(1.0)
    return x.sin() * buffer


@pytest.mark.parametrize(
    ("fn", "writes"),
    [(_scaled_in_place, True), (_row_set, True), (_view_written, True), (_buffer_written, False)],
)
def test_writes_into_an_input_needing_gradients_are_found(fn, writes):
    x = random_tensor((3, 4)).requires_grad_(True) * 1.0  # needs gradients, not a leaf
    args = (x, random_tensor((4,))) if fn is _buffer_written else (x,)
    assert pick.writes_grad_input(_dynamo_graph(fn, *args)) is writes
    assert pick.writes_grad_input(_dynamo_graph(fn, *[a.detach() for a in args])) is False


def test_region_writing_into_an_input_needing_gradients_is_not_timed(program_calls):
    leaf = random_tensor((3, 4)).requires_grad_(True)
    x = leaf * 1.0
    traced = partial_trace(_scaled_in_place)
    out = traced(x)
    assert traced.stats.picks == []  # XLA, untimed: a trial would have doubled x again
    assert program_calls == ["forward"]
    assert_close(x, leaf.detach() * 2, terms=1, msg="x written once")
    assert_close(out, (leaf.detach() * 2).sin(), terms=1, msg="out")
    out.sum().backward()
    assert_close(leaf.grad, 2 * (leaf.detach() * 2).cos(), terms=1, msg="grad")


def test_buffers_written_in_trials_get_their_values_back(monkeypatch):
    _favouring(monkeypatch, pick.XLA)
    buffer = random_tensor((4,))
    start = buffer.clone()
    traced = partial_trace(_buffer_written)
    x = random_tensor((3, 4))
    out = traced(x, buffer)
    assert_close(buffer, start + 1, terms=1, msg="buffer written once")
    assert_close(out, x.sin() * (start + 1), terms=2, msg="out")
    assert [p["pick"] for p in traced.stats.picks] == [pick.XLA]


def test_several_ranks_or_the_switch_off_keep_xla_untimed(monkeypatch, program_calls):
    assert not pick._several_ranks()  # no process group here
    monkeypatch.setattr(pick, "_several_ranks", lambda: True)
    traced = partial_trace(models.mlp())
    traced(random_tensor((2, 8))).sum().backward()
    assert traced.stats.picks == [] and program_calls == ["forward", "backward"]
    monkeypatch.setenv(pick.PICK_ENV, "0")
    assert not pick.enabled()
    torch._dynamo.reset()
    program_calls.clear()
    traced = partial_trace(models.mlp())
    traced(random_tensor((2, 8))).sum().backward()
    assert traced.stats.picks == [] and program_calls == ["forward", "backward"]


def test_eager_runs_take_the_constants_xla_baked_in(monkeypatch):
    _favouring(monkeypatch, pick.EAGER)
    table = random_tensor((5,))

    def fn(x):
        return x * table

    as_const = partial_trace(fn, capture_as_const=True)
    x = random_tensor((5,))
    before = x * table
    assert torch.equal(as_const(x), before)
    table.add_(1.0)
    assert torch.equal(as_const(x), before)  # the value traced, as the XLA program has it
    assert [p["pick"] for p in as_const.stats.picks] == [pick.EAGER]


def test_inference_mode_trials_put_buffers_back(monkeypatch):
    _favouring(monkeypatch, pick.EAGER)
    traced = partial_trace(_buffer_written)
    with torch.inference_mode():
        buffer = random_tensor((4,))  # an inference tensor: no version counter
        start = buffer.clone()
        x = random_tensor((3, 4))
        out = traced(x, buffer)
        assert torch.equal(buffer, start + 1)
        assert torch.equal(out, x.sin() * (start + 1))
    assert [p["pick"] for p in traced.stats.picks] == [pick.EAGER]


def test_a_failing_trial_leaves_the_error_where_it_would_be():
    from fusedops.xla import XLATraceError

    def fn(y, mask, row):
        y = y * 1.0
        y[mask] = row  # its backward has a data-dependent shape: no XLA program
        return y

    row = random_tensor((3,)).requires_grad_(True)
    mask = torch.arange(5, device="cpu") % 2 == 0
    traced = partial_trace(fn, fullgraph=True)
    out = traced(random_tensor((5, 3)), mask, row)  # the forward runs, as without trials
    (record,) = traced.stats.picks
    assert record["pick"] == pick.XLA and "data-dependent" in record["failed"]
    with pytest.raises(XLATraceError, match="data-dependent"):
        out.sum().backward()

"""xla_trace: whole training steps as one XLA program match eager torch.optim training."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusedops.testing import assert_close, random_tensor
from fusedops.xla import XLATraceError, xla_trace
from tests.xla import models

pytest.importorskip("jax")


def _eager_step(data, label, *, net, opt):
    loss = F.cross_entropy(net(data), label)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@xla_trace
def train_step(data, label, *, net, opt):
    """``_eager_step`` traced through the decorator form."""
    return _eager_step(data, label, net=net, opt=opt)


def _net():
    # no bias before BatchNorm: its gradient is pure rounding noise, which Adam would amplify
    return nn.Sequential(
        nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 4)
    )


OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2),
    "sgd-nesterov-dampening": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.8, dampening=0.1, maximize=False
    ),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-2),
    "adam-amsgrad-maximize": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, maximize=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05),
}


def _compare(net, ref, opt, ref_opt):
    for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        if a.dtype == torch.int64:
            assert torch.equal(a, b), name
        else:
            assert_close(a, b, dtype=torch.float32, scale=10.0, msg=name)
    got, want = opt.state_dict(), ref_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for index, state in want["state"].items():
        assert got["state"][index].keys() == state.keys()
        for key, value in state.items():
            mine = got["state"][index][key]
            assert mine.dtype == value.dtype and mine.shape == value.shape, key
            assert_close(mine, value, dtype=value.dtype, scale=10.0, msg=f"{index}/{key}")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_five_steps_match_torch_optim(name):
    torch.manual_seed(0)
    net = _net()
    ref = copy.deepcopy(net)
    opt, ref_opt = OPTIMIZERS[name](net.parameters()), OPTIMIZERS[name](ref.parameters())
    step = xla_trace(_eager_step)
    for _ in range(5):
        data, label = random_tensor((6, 8)), torch.randint(0, 4, (6,))
        loss = step(data, label, net=net, opt=opt)
        expected = _eager_step(data, label, net=ref, opt=ref_opt)
        assert_close(loss, expected, dtype=torch.float32, scale=10.0)
    _compare(net, ref, opt, ref_opt)
    assert all(p.grad is None for p in net.parameters())
    assert step.programs == (2 if name == "sgd-nesterov-dampening" else 1)


def test_lr_scheduler_changes_lr_without_recompiling():
    net = models.mlp()
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    step = xla_trace(_eager_step)
    for _ in range(4):
        data, label = random_tensor((6, 8)), torch.randint(0, 4, (6,))
        step(data, label, net=net, opt=opt)
        _eager_step(data, label, net=ref, opt=ref_opt)
        sched.step()
        ref_sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5**4)
    _compare(net, ref, opt, ref_opt)
    assert step.programs == 1


def test_decorator_form_and_new_batch_size_recompiles():
    net = models.mlp()
    ref = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    before = train_step.programs
    for batch in (6, 6, 3):
        data, label = random_tensor((batch, 8)), torch.randint(0, 4, (batch,))
        loss = train_step(data, label, net=net, opt=opt)
        assert_close(
            loss, _eager_step(data, label, net=ref, opt=ref_opt), dtype=torch.float32, scale=10.0
        )
    assert train_step.programs - before == 2
    _compare(net, ref, opt, ref_opt)


def test_dropout_in_a_step_follows_the_torch_seed():
    net = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Linear(32, 4)).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    initial = copy.deepcopy(net.state_dict())
    x, y = random_tensor((6, 8)), torch.randint(0, 4, (6,))
    losses = []
    for _ in range(2):
        net.load_state_dict(initial)
        torch.manual_seed(5)
        losses.append([train_step(x, y, net=net, opt=opt).item() for _ in range(2)])
    assert losses[0] == losses[1]
    assert losses[0][0] != losses[0][1]


def test_gradient_clipping_inside_the_step_matches_eager():
    net = models.mlp()
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)

    def step(x, y, *, net, opt):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
        return loss, norm

    traced = xla_trace(step)
    for _ in range(3):
        x, y = random_tensor((6, 8)), torch.randint(0, 4, (6,))
        loss, norm = traced(x, y, net=net, opt=opt)
        ref_loss, ref_norm = step(x, y, net=ref, opt=ref_opt)
        assert ref_norm > 0.05  # clipping is active
        assert_close(norm, ref_norm, dtype=torch.float32, scale=10.0)
        assert_close(loss, ref_loss, dtype=torch.float32, scale=10.0)
    _compare(net, ref, opt, ref_opt)


def test_gradients_left_in_grad_when_the_step_does_not_zero_them():
    net = models.mlp()
    ref = copy.deepcopy(net)

    @xla_trace
    def accumulate(x, *, net):
        loss = net(x).square().mean()
        loss.backward()
        return loss

    x = random_tensor((5, 8))
    accumulate(x, net=net)
    accumulate(x, net=net)  # second call accumulates into .grad, as eager does
    for _ in range(2):
        ref(x).square().mean().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, dtype=torch.float32, scale=4.0, msg=name)


def test_capture_as_const_bakes_closed_over_tensors():
    offset = random_tensor((4,))
    net = models.mlp()

    def step(x, *, net):
        return (net(x) + offset).sum()

    as_input, as_const = xla_trace(step), xla_trace(step, capture_as_const=True)
    x = random_tensor((3, 8))
    with torch.no_grad():
        before = (net(x) + offset).sum()
        offset.add_(1.0)
        after = (net(x) + offset).sum()
        offset.sub_(1.0)
    assert_close(as_const(x, net=net), before, dtype=torch.float32, scale=4.0)
    assert_close(as_input(x, net=net), before, dtype=torch.float32, scale=4.0)
    offset.add_(1.0)
    assert_close(as_const(x, net=net), before, dtype=torch.float32, scale=4.0)
    assert_close(as_input(x, net=net), after, dtype=torch.float32, scale=4.0)


def test_python_side_effect_on_a_tensor_is_a_clear_error():
    history = []

    @xla_trace
    def step(x, *, net, opt):
        loss = net(x).sum()
        history.append(loss.item())  # needs the value during tracing
        loss.backward()
        opt.step()
        return loss

    net = models.mlp()
    with pytest.raises(XLATraceError, match="side effect"):
        step(random_tensor((2, 8)), net=net, opt=torch.optim.SGD(net.parameters(), lr=0.1))


def test_unsupported_optimizer_is_named():
    net = models.mlp()
    opt = torch.optim.RMSprop(net.parameters(), lr=0.1)
    with pytest.raises(XLATraceError, match="RMSprop"):
        train_step(random_tensor((2, 8)), torch.randint(0, 4, (2,)), net=net, opt=opt)


def test_step_with_closure_is_a_clear_error():
    @xla_trace
    def step(x, *, net, opt):
        def closure():
            loss = net(x).sum()
            loss.backward()
            return loss

        return opt.step(closure)

    net = models.mlp()
    with pytest.raises(XLATraceError, match="closure"):
        step(random_tensor((2, 8)), net=net, opt=torch.optim.SGD(net.parameters(), lr=0.1))


def _scaled_step(x, y, *, net, opt, scaler):
    loss = F.cross_entropy(net(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("name", ["sgd-momentum", "adam"])
def test_grad_scaler_growth_and_skipped_steps_match_eager(name):
    net = models.mlp()
    ref = copy.deepcopy(net)
    opt, ref_opt = OPTIMIZERS[name](net.parameters()), OPTIMIZERS[name](ref.parameters())
    # 2**126: the scale doubles to 2**127, where 2**128 is no longer finite and so not taken
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=2) for _ in "ab"]
    step = xla_trace(_scaled_step)
    for i in range(6):
        x, y = random_tensor((6, 8)), torch.randint(0, 4, (6,), device="cpu")
        if i in (3, 4):  # an inf input: inf/NaN gradients, a skipped step, the scale backs off
            x[i, 0] = float("inf")
        loss = step(x, y, net=net, opt=opt, scaler=scalers[0])
        expected = _scaled_step(x, y, net=ref, opt=ref_opt, scaler=scalers[1])
        assert_close(loss, expected, dtype=torch.float32, scale=10.0, msg=f"step {i}")
        assert torch.equal(scalers[0]._scale, scalers[1]._scale), i
        assert torch.equal(scalers[0]._growth_tracker, scalers[1]._growth_tracker), i
    assert scalers[1].get_scale() == 2.0**125  # grew to 2**127, backed off twice
    _compare(net, ref, opt, ref_opt)
    assert step.programs == 1


def test_step_sees_and_changes_p_grad():
    net = models.mlp()
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)

    def step(x, *, net, opt):
        net(x).square().mean().backward()
        for i, p in enumerate(net.parameters()):
            if i % 2:
                p.grad.mul_(0.5)  # in place
            else:
                p.grad = p.grad + 1.0  # replaced
        opt.step()
        opt.zero_grad()

    traced = xla_trace(step)
    for _ in range(2):
        x = random_tensor((5, 8))
        traced(x, net=net, opt=opt)
        step(x, net=ref, opt=ref_opt)
    _compare(net, ref, opt, ref_opt)

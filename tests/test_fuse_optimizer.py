"""fusedops.optim.fuse_optimizer: torch.optim.Adam / AdamW / SGD instances turned into the fused
classes in place (same object, param_groups and state), LR schedulers and GradScaler working
on, results equal torch's; everything else left as it is, with the reason."""

import copy
import importlib
import warnings

import pytest
import torch

from fusedops.optim import FusedAdam, FusedAdamW, FusedSGD, fuse_optimizer, unfusable_reason
from fusedops.testing import assert_close, random_tensor
from tests.op_testing import DEVICE
from tests.test_sgd import _term_sums

#: torch class, its options, the fused class
KINDS = {
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1), FusedSGD),
    "adam": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.01), FusedAdam),
    "adamw": (torch.optim.AdamW, dict(lr=0.01), FusedAdamW),
}
#: steps before and after the swap
STEPS = 3


def _params():
    return [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(4, 5), (9,)]]


def _grads(params):
    return [random_tensor(p.shape, torch.float32, DEVICE) for p in params]


def _step(pairs):
    """One step of each (optimizer, params) pair on the same random gradients."""
    grads = _grads(pairs[0][1])
    for opt, params in pairs:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()


def _magnitude(kind, steps):
    """The sum of |terms| accumulated into a param (start and gradients in [-3, 3]): SGD's
    from the update rule; an Adam step moves a param by at most 3 lr in its first steps (the
    bias-corrected ratio m / sqrt(v) is below 3 there)."""
    _, options, _ = KINDS[kind]
    if kind == "sgd":
        return _term_sums(steps, options["lr"], options["momentum"])[0]
    return 3 + steps * 3 * options["lr"] * (1 + options.get("weight_decay", 0))


@pytest.mark.parametrize("kind", list(KINDS))
def test_swap_keeps_the_object_and_its_state_and_matches_torch(kind):
    torch_cls, options, fused_cls = KINDS[kind]
    params = _params()
    copies = [p.detach().clone().requires_grad_() for p in params]
    opt, ref_opt = torch_cls(params, **options), torch_cls(copies, **options)
    for _ in range(STEPS):
        _step([(opt, params), (ref_opt, copies)])
    groups, state = opt.param_groups, opt.state
    saved = copy.deepcopy(opt.state_dict())
    assert unfusable_reason(opt) is None
    assert fuse_optimizer(opt) is opt
    assert type(opt) is fused_cls and isinstance(opt, torch_cls)
    assert opt.param_groups is groups and opt.state is state
    assert opt.param_groups[0]["master_weights"] is False and opt.backend is None
    for key, value in saved["state"][0].items():  # the state carried over unchanged
        assert torch.equal(opt.state[params[0]][key].cpu().float(), value.cpu().float()), key
    for _ in range(STEPS):
        _step([(opt, params), (ref_opt, copies)])
    for p, q in zip(params, copies):  # a start and 4 terms a step
        assert_close(p, q, terms=1 + 4 * 2 * STEPS, magnitude=_magnitude(kind, 2 * STEPS))
    assert fuse_optimizer(opt) is opt and type(opt) is fused_cls  # already fused: unchanged


@pytest.mark.parametrize("kind", list(KINDS))
def test_lr_scheduler_made_before_the_swap_keeps_working(kind, monkeypatch):
    """The scheduler's wrapper of ``step`` (its order check) now wraps the fused step: the
    fused step runs, the lr follows the schedule, and no 'lr_scheduler.step() before
    optimizer.step()' warning is given. Step hooks registered before the swap still run."""
    torch_cls, options, fused_cls = KINDS[kind]
    params = _params()
    opt = torch_cls(params, **options)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = []
    opt.register_step_post_hook(lambda optimizer, args, kwargs: seen.append(type(optimizer)))
    fuse_optimizer(opt)
    module = importlib.import_module("fusedops.optim." + ("sgd" if kind == "sgd" else "adam"))
    function = "sgd_step" if kind == "sgd" else "adam_step"
    calls, original = [], getattr(module, function)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, function, counting)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scheduler's order warning would raise
        for _ in range(2):
            _step([(opt, params)])
            scheduler.step()
    assert calls and seen == [fused_cls, fused_cls]
    assert opt.param_groups[0]["lr"] == pytest.approx(options["lr"] * 0.25)


@pytest.mark.parametrize("kind", list(KINDS))
def test_grad_scaler_keeps_working_after_the_swap(kind):
    """A GradScaler used with the torch optimizer before the swap drives the fused one after
    it: the kernel unscales (grad_scale, found_inf handed over), an inf step is skipped, the
    scale follows torch's."""
    torch_cls, options, _ = KINDS[kind]
    params = _params()
    copies = [p.detach().clone().requires_grad_() for p in params]
    opt, ref_opt = torch_cls(params, **options), torch_cls(copies, **options)
    scalers = [torch.amp.GradScaler(DEVICE.type, init_scale=2.0**8) for _ in range(2)]
    for step, poison in enumerate([False, False, True, False]):
        if step == 2:
            fuse_optimizer(opt)
        before = [p.detach().clone() for p in params]
        grads = _grads(params)
        for values, optimizer, scaler in ((params, opt, scalers[0]), (copies, ref_opt, scalers[1])):
            for p, g in zip(values, grads):
                p.grad = scaler.scale(g).clone()
            if poison:
                values[0].grad[1, 1] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        if poison:
            assert all(torch.equal(p, b) for p, b in zip(params, before))
    for p, q in zip(params, copies):
        assert_close(p, q, terms=1 + 4 * 4, magnitude=_magnitude(kind, 4))
    assert scalers[0].get_scale() == scalers[1].get_scale()


class _MySGD(torch.optim.SGD):
    pass


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda ps: _MySGD(ps, lr=0.1), "subclasses torch.optim.SGD"),
        (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "no fused version of RMSprop"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, differentiable=True), "differentiable=True"),
    ],
    ids=["subclass", "other-optimizer", "differentiable"],
)
def test_others_are_left_as_they_are_with_the_reason(make, reason):
    opt = make(_params())
    cls = type(opt)
    assert reason in unfusable_reason(opt)
    assert fuse_optimizer(opt) is opt and type(opt) is cls


def test_a_step_replaced_on_the_instance_is_left_alone():
    opt = torch.optim.Adam(_params(), lr=0.1)
    opt.step = lambda closure=None: None
    assert "replaced on the instance" in unfusable_reason(opt)
    assert type(fuse_optimizer(opt)) is torch.optim.Adam


def test_fused_optimizers_have_no_reason():
    assert unfusable_reason(FusedSGD(_params(), lr=0.1)) is None


@pytest.mark.parametrize("thing", [None, object(), torch.nn.Linear(2, 2)], ids=repr)
def test_non_optimizers_raise_type_error(thing):
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        fuse_optimizer(thing)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        unfusable_reason(thing)

"""FusedSGD in XLA: the lowering of ``fusedops::sgd_step`` (``fusedops/xla/fused/sgd.py``)
against the op, and ``xla_trace`` of training steps with FusedSGD against eager FusedSGD."""

from __future__ import annotations

import copy

import pytest
import torch

from fusedops.kernels.shared.sgd import LISTS
from fusedops.testing import assert_close, device_under_test, random_tensor
from tests.test_sgd import _term_sums

pytest.importorskip("jax")

from fusedops.ops import sgd as sgd_op  # noqa: E402
from fusedops.xla import XLATraceError, lower, partial_trace, xla_trace  # noqa: E402
from fusedops.xla.fused import sgd as sgd_lowering  # noqa: E402

DEVICE = device_under_test()
F32, BF16 = torch.float32, torch.bfloat16


def test_sgd_step_lowering_is_registered_as_mutating():
    op = torch.ops.fusedops.sgd_step.default
    assert lower.LOWERINGS[op].__module__ == "fusedops.xla.fused.sgd"
    assert op in lower.MUTATES


@pytest.mark.parametrize("case", range(len(sgd_lowering.samples("sgd_step"))))
def test_sgd_step_lowering_matches_the_op(case):
    """Each sample of ``samples("sgd_step")`` (momentum off and on, weight decay, maximize,
    Nesterov, dampening with first-step flags, bf16 master weights with a tensor lr,
    grad_scale with and without found_inf) under ``partial_trace(fullgraph=True)``: one XLA
    program, the eager op's values (one step from values in [-3, 3]: each result sums at most 5
    terms, the momentum buffer's up to 0.9 * 3 + 3 + 0.1 * 3)."""
    args = list(sgd_lowering.samples("sgd_step")[case])
    lists, options = args[:5], args[5:]
    expected = copy.deepcopy(lists)
    sgd_op.sgd_step_body(*expected, *options)

    @partial_trace(fullgraph=True)
    def step(*flat):
        sgd_op.SGD_STEP(*flat, *options, None)

    step(*lists)
    assert step.stats.programs == 1 and not step.stats.eager_ops
    magnitude = max(_term_sums(1, 0.02, 0.9, 0.1, nesterov=True))
    for name, got_list, want_list in zip(LISTS, lists, expected):
        for got, want in zip(got_list, want_list):
            assert got.dtype == want.dtype
            assert_close(got, want, terms=5, magnitude=magnitude, msg=f"sample {case} {name}")


def _sum_step(x, *, net, opt):
    """A training step on the sum of the model's output (fp32); returns the loss."""
    loss = net(x).float().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize(
    ("dtype", "options", "programs"),
    [
        (F32, {}, 1),
        (F32, {"momentum": 0.9, "weight_decay": 0.1}, 1),
        (F32, {"momentum": 0.9, "nesterov": True, "maximize": True}, 1),
        (F32, {"momentum": 0.8, "dampening": 0.3}, 2),  # the first step, then the others
        (BF16, {"momentum": 0.9, "master_weights": True, "weight_decay": 0.05}, 1),
    ],
)
@pytest.mark.usefixtures("no_tf32")
def test_xla_trace_with_fused_sgd_matches_eager(dtype, options, programs):
    """Parameters and FusedSGD's state (its layout, master copies included) after three steps
    on DEVICE, traced against eager. The loss is linear in the parameters and the batch one
    row, so bf16 gradients are exact and the two updates differ by fp32 rounding only."""
    from fusedops.optim import FusedSGD

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4).to(DEVICE, dtype)
    ref = copy.deepcopy(model)
    opt = FusedSGD(model.parameters(), lr=0.05, **options)
    ref_opt = FusedSGD(ref.parameters(), lr=0.05, **options)
    train_step = xla_trace(_sum_step)
    for _ in range(3):
        x = random_tensor((1, 6), dtype, DEVICE)
        train_step(x, net=model, opt=opt)
        ref(x).float().sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert train_step.programs == programs
    # gradients in [-3, 3] (x, and 1 for the bias), params below 3: the sums of the terms
    magnitude = max(
        _term_sums(3, 0.05, options.get("momentum", 0.0), options.get("weight_decay", 0.0),
                   options.get("nesterov", False))
    )  # fmt: skip
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device.type == DEVICE.type
        # three steps: a param sums itself and 4 terms a step, a buffer 3 a step
        assert_close(p.detach(), q.detach(), terms=13, magnitude=magnitude, msg=name)
        state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert state.keys() == ref_state.keys(), name
        for key in ref_state:
            assert state[key].dtype == ref_state[key].dtype
            assert_close(state[key], ref_state[key], terms=9, magnitude=magnitude, msg=key)


def test_xla_trace_refuses_a_grad_scaler_driven_fused_sgd():
    from fusedops.optim import FusedSGD

    model = torch.nn.Linear(3, 2)
    opt = FusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.grad_scale, opt.found_inf = torch.tensor(2.0), torch.tensor(0.0)

    @xla_trace
    def train_step(x, *, net, opt):
        net(x).sum().backward()
        opt.step()

    with pytest.raises(XLATraceError, match="GradScaler"):
        train_step(random_tensor((2, 3)), net=model, opt=opt)

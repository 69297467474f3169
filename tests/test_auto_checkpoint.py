"""auto_checkpoint: the model returned, checkpointed in place (TorchAcc's ``model =
torchacc.auto_checkpoint(model)``), the fewest blocks for the budget, bit-for-bit losses and
gradients (dropout included), state_dict unchanged, the plan read back, undo, fusedops hooks and
torch.compile."""

from __future__ import annotations

import copy

import pytest
import torch

import fusedops
from fusedops.testing import assert_close, random_tensor
from fusedops.utils.checkpoint import checkpoint_plan, find_blocks, undo_checkpoint
from tests.checkpoint_models import Stack, saved_bytes

CPU = torch.device("cpu")


def _steps(model, ref, x, steps: int = 2) -> None:
    """Train steps of ``model`` and ``ref`` from the same RNG state; everything bit for bit."""
    for step in range(steps):
        seed = int(torch.randint(0, 2**31, (1,)))
        torch.manual_seed(seed)
        loss = model(x).square().mean()
        loss.backward()
        torch.manual_seed(seed)
        ref_loss = ref(x).square().mean()
        ref_loss.backward()
        assert torch.equal(loss, ref_loss), f"step {step}"
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {step}: {name}"
        model.zero_grad()
        ref.zero_grad()


def _wrapped(model) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


def test_losses_and_gradients_bit_for_bit_with_dropout():
    model = Stack(p=0.3)
    ref = copy.deepcopy(model)
    assert fusedops.auto_checkpoint(model, 0.5) is model
    plan = checkpoint_plan(model)
    assert plan.blocks == [f"blocks.{i}" for i in range(4)] and not plan.measured
    _steps(model, ref, random_tensor((3, 10, 8), device=CPU), steps=3)
    assert plan.measured and plan.wrapped and _wrapped(model) == plan.wrapped
    assert model.state_dict().keys() == ref.state_dict().keys()
    for key, value in ref.state_dict().items():
        assert torch.equal(model.state_dict()[key], value)


@pytest.mark.parametrize("budget", [1.0, 0.75, 0.5, 0.2, 1e-6, 0, 10**12])
def test_fewest_blocks_that_fit_the_budget(budget):
    model = Stack(n=5, uneven=True)
    x = random_tensor((2, 12, 8), device=CPU)
    unchecked = saved_bytes(model, x)
    plan = checkpoint_plan(fusedops.auto_checkpoint(model, budget)).measure(x)
    assert plan.total == unchecked
    expected_budget = int(budget * unchecked) if isinstance(budget, float) else budget
    assert plan.budget == expected_budget
    remaining = plan.total - plan.expected_saving
    assert plan.expected_saving == sum(plan.savings[n] for n in plan.wrapped)
    if remaining > plan.budget:  # only when even every block cannot reach it
        assert plan.wrapped == plan.blocks and "not reached" in plan.report()
    else:  # the fewest: the k blocks freeing most, and k - 1 of them would not fit
        k = len(plan.wrapped)
        ranked = sorted(plan.savings.values(), reverse=True)
        assert sorted((plan.savings[n] for n in plan.wrapped), reverse=True) == ranked[:k]
        assert k == 0 or plan.total - sum(ranked[: k - 1]) > plan.budget
    assert set(plan.wrapped) == set(_wrapped(model))
    # the forward now saves (through autograd's hooks) at most what the plan expects
    assert saved_bytes(model, x) <= remaining
    assert f"wrapped {len(plan.wrapped)}" in plan.report()


def test_default_budget_on_cpu_is_half():
    model = Stack()
    model = fusedops.auto_checkpoint(model)
    plan = checkpoint_plan(model).measure(random_tensor((2, 12, 8), device=CPU))
    assert plan.budget == plan.total // 2 and plan.wrapped


def test_undo_restores_the_model():
    model = Stack()
    x = random_tensor((2, 12, 8), device=CPU)
    unchecked = saved_bytes(model, x)
    checkpoint_plan(fusedops.auto_checkpoint(model, 0.3)).measure(x)
    assert saved_bytes(model, x) < unchecked
    assert undo_checkpoint(model) is model
    assert _wrapped(model) == [] and saved_bytes(model, x) == unchecked
    assert not model._forward_hooks and not model._forward_pre_hooks
    with pytest.raises(ValueError, match="not checkpointed"):
        checkpoint_plan(model)
    # unmeasured: the measuring hooks go
    fusedops.auto_checkpoint(model, 0.3)
    assert model._forward_pre_hooks
    undo_checkpoint(model)
    assert not model._forward_hooks and not model._forward_pre_hooks
    # CheckpointPlan.undo() restores the forwards too (the plan stays readable)
    checkpoint_plan(fusedops.auto_checkpoint(model, 0.3)).measure(x)
    checkpoint_plan(model).undo()
    assert _wrapped(model) == [] and checkpoint_plan(model).wrapped == []


def test_no_grad_forward_does_not_measure():
    model = fusedops.auto_checkpoint(Stack(), 0.5)
    with torch.no_grad():
        model(random_tensor((2, 4, 8), device=CPU))
    plan = checkpoint_plan(model)
    assert not plan.measured and "not measured" in plan.report()


def test_find_blocks_outermost_repeated_children():
    model = torch.nn.Sequential(Stack(n=2), Stack(n=2), torch.nn.Linear(1, 8))
    assert [name for name, _ in find_blocks(model)] == ["0", "1"]
    plan = checkpoint_plan(fusedops.auto_checkpoint(torch.nn.Linear(3, 3)))
    assert plan.blocks == [] and "no repeated blocks" in plan.report()


def test_with_fusedops_hooks():
    """Blocks whose LayerNorms are swapped for the fused class (before or after wrapping)."""
    from fusedops import hooks

    model = Stack(n=3, p=0.2)
    ref = copy.deepcopy(model)
    counts: dict = {}
    hooks.replace_modules(model, ["layer_norm"], counts=counts)
    hooks.replace_modules(ref, ["layer_norm"])
    assert sum(counts.values()) == 3
    fusedops.auto_checkpoint(model, 0.5)
    _steps(model, ref, random_tensor((2, 6, 8), device=CPU))
    assert _wrapped(model)
    late = copy.deepcopy(ref)
    checkpoint_plan(fusedops.auto_checkpoint(late, 0.5)).measure(
        random_tensor((2, 6, 8), device=CPU)
    )
    late_counts: dict = {}
    hooks.replace_modules(late, ["layer_norm"], counts=late_counts)
    assert _wrapped(late) and sum(late_counts.values()) == 0  # already fused: nothing to swap


def test_under_torch_compile():
    torch._dynamo.reset()
    model = Stack(n=3, p=0.0)
    ref = copy.deepcopy(model)
    x = random_tensor((2, 6, 8), device=CPU)
    plan = checkpoint_plan(fusedops.auto_checkpoint(model, 0.5)).measure(x)
    assert plan.wrapped
    compiled = torch.compile(model, backend="aot_eager")
    _steps(compiled, ref, x)
    torch._dynamo.reset()


def test_bad_arguments():
    model = Stack(n=2)
    for bad in (0.0, 1.5, -0.5, -1):
        with pytest.raises(ValueError, match="memory_budget"):
            fusedops.auto_checkpoint(model, bad)
    for bad in (True, "half", [0.5]):
        with pytest.raises(TypeError, match="memory_budget"):
            fusedops.auto_checkpoint(model, bad)
    with pytest.raises(TypeError, match="model"):
        fusedops.auto_checkpoint(lambda x: x)


def test_returns_the_model_checkpointed_in_place():
    """TorchAcc's ``model = torchacc.auto_checkpoint(model)``: the same module back, its
    parameters the same objects; losses and gradients of the unchecked model (tolerance
    table); the plan read back; a second call re-plans; copies carry the plan."""
    model = Stack(n=4, p=0.0)
    ref = copy.deepcopy(model)
    params = list(model.parameters())
    model = fusedops.auto_checkpoint(model, 0.5)
    assert isinstance(model, Stack) and all(p is q for p, q in zip(model.parameters(), params))
    x = random_tensor((2, 6, 8), device=CPU)
    for _ in range(2):
        loss, ref_loss = model(x).square().mean(), ref(x).square().mean()
        loss.backward()
        ref_loss.backward()
        assert_close(loss, ref_loss, msg="loss")
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert_close(p.grad, q.grad, msg=name)
    plan = checkpoint_plan(model)
    assert plan.measured and plan.wrapped and _wrapped(model) == plan.wrapped
    copied = copy.deepcopy(model)
    assert checkpoint_plan(copied).model is copied and _wrapped(copied) == plan.wrapped
    assert fusedops.auto_checkpoint(model, 1.0) is model  # a new budget: a new plan
    assert checkpoint_plan(model) is not plan and _wrapped(model) == []
    assert not checkpoint_plan(model).measured
    with pytest.raises(ValueError, match="not checkpointed"):
        checkpoint_plan(ref)
    with pytest.raises(ValueError, match="not checkpointed"):
        undo_checkpoint(ref)

"""auto_checkpoint under partial_trace(backend="xla"): the checkpointed blocks compile and
train like the unchecked model in eager (within float32 tolerance: the XLA programs of a
checkpointed region are not the eager kernels, so bitwise equality is not expected here)."""

from __future__ import annotations

import copy

import pytest
import torch

import fusedops
from fusedops.testing import assert_close, random_tensor
from fusedops.utils.checkpoint import checkpoint_plan
from tests.checkpoint_models import Stack

pytest.importorskip("jax")


def test_checkpointed_model_under_partial_trace_matches_eager():
    from fusedops.xla import partial_trace

    cpu = torch.device("cpu")
    model = Stack(n=3, p=0.0)
    ref = copy.deepcopy(model)
    x = random_tensor((2, 6, 8), device=cpu)
    plan = checkpoint_plan(fusedops.auto_checkpoint(model, 0.5)).measure(x)
    assert plan.wrapped
    traced = partial_trace(model)
    for _ in range(2):
        out = traced(x)
        out.square().mean().backward()
        expected = ref(x)
        expected.square().mean().backward()
        assert_close(out, expected, dtype=torch.float32, scale=2.0, msg="output")
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert_close(p.grad, q.grad, dtype=torch.float32, scale=4.0, msg=name)
        model.zero_grad()
        ref.zero_grad()
    assert traced.stats.programs >= 2
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == plan.wrapped

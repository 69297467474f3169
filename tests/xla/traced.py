"""``check_traced``: a function through ``partial_trace(fullgraph=True)`` against eager.

``no_cpu_tune`` (autouse where a test module imports it): programs compile once, with XLA's
default dot library (correctness tests need not time the two candidates).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from fusedops.testing import DEFAULT_TERMS, tolerance
from fusedops.xla import partial_trace


@pytest.fixture(autouse=True)
def no_cpu_tune(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_CPU_TUNE", "0")


def _grads(outputs, inputs, seed: int):
    outs = [
        o
        for o in pytree.tree_leaves(outputs)
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not wrt:
        return []
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in outs]
    return list(torch.autograd.grad(outs, wrt, cotangents, allow_unused=True))


def _fresh(args, grad: bool):
    return [
        a.detach().clone().requires_grad_(grad and (a.is_floating_point() or a.is_complex()))
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]


def _assert_same(actual, expected, what: str, rtol, atol, bound: dict):
    a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(a_leaves) == len(e_leaves), what
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if not isinstance(e, torch.Tensor):
            assert a == e, f"{what}[{i}]"
            continue
        assert a is not None, f"{what}[{i}] is None, eager has a tensor"
        assert a.shape == e.shape and a.dtype == e.dtype, (
            f"{what}[{i}]: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        )
        if e.is_floating_point() or e.is_complex():
            real = e.real.dtype if e.is_complex() else e.dtype
            derived = tolerance(real, **bound)
            rtol, atol = (
                (derived[0] if rtol is None else rtol),
                (derived[1] if atol is None else atol),
            )
            torch.testing.assert_close(
                a.detach(),
                e.detach(),
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                msg=lambda m, i=i: f"{what}[{i}]: {m}",
            )
        else:
            assert torch.equal(a, e), f"{what}[{i}]: {a} != {e}"


def check_traced(
    fn,
    *args,
    grad: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    terms: int = DEFAULT_TERMS,
    magnitude: float = 1.0,
    compute: torch.dtype | None = None,
):
    """Run ``fn(*args)`` eagerly and as ``partial_trace(fn, fullgraph=True)``: same outputs
    and (``grad``) the same gradients of every float tensor argument under a random cotangent.
    Tolerances: ``rtol`` / ``atol`` where given, else ``fusedops.testing.tolerance`` of each
    result's dtype with ``terms`` (the longest sum behind one element, gradients included),
    ``magnitude`` and ``compute``. Returns the traced function (its ``stats``)."""
    bound = {"terms": terms, "magnitude": magnitude, "compute": compute}
    torch._dynamo.reset()
    traced = partial_trace(fn, fullgraph=True)
    eager_args, traced_args = _fresh(args, grad), _fresh(args, grad)
    expected = fn(*eager_args)
    actual = traced(*traced_args)
    _assert_same(actual, expected, "output", rtol, atol, bound)
    if grad:
        want = _grads(expected, eager_args, 0)
        got = _grads(actual, traced_args, 0)
        _assert_same(got, want, "grad", rtol, atol, bound)
    assert traced.stats.programs >= 1 and not traced.stats.eager_ops
    return traced

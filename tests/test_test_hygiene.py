"""Hygiene of the test suite itself, read from the source (AST only, nothing imported or run).

A test that is parametrized over where it runs must build every tensor where it runs: a test
function taking one of ``PLACEMENT_ARGS`` (``device``, ``device_type``, ``backend``,
``backends``) as an argument is checked, and in its body (nested functions and lambdas included)
every tensor factory call in ``FACTORIES`` must say ``device=``. ``random_tensor``'s third
positional argument is its device and counts as saying it. A factory call whose result is moved
at once with ``.to(...)``/``.cuda()`` is still an error: build it on the device instead (pass
``device="cpu"`` explicitly where a CPU generator must draw it, then move it).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PLACEMENT_ARGS = frozenset({"device", "device_type", "backend", "backends"})
FACTORIES = frozenset(
    {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange",
     "linspace", "eye", "tensor", "as_tensor"}
)  # fmt: skip


def _factory_name(call: ast.Call) -> str | None:
    """``torch.zeros`` -> 'torch.zeros', ``random_tensor``/``testing.random_tensor`` ->
    'random_tensor'; None for any other call."""
    func = call.func
    if isinstance(func, ast.Attribute):
        if func.attr in FACTORIES and isinstance(func.value, ast.Name) and func.value.id == "torch":
            return f"torch.{func.attr}"
        if func.attr == "random_tensor":
            return "random_tensor"
    if isinstance(func, ast.Name) and func.id == "random_tensor":
        return "random_tensor"
    return None


def _says_device(call: ast.Call, name: str) -> bool:
    if any(k.arg == "device" or k.arg is None for k in call.keywords):  # None: **kwargs
        return True
    return name == "random_tensor" and len(call.args) >= 3


def _is_placed_test(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    args = node.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    return node.name.startswith("test") and bool(names & PLACEMENT_ARGS)


def undeviced_factory_calls(source: str, filename: str) -> list[str]:
    """'file:line: call' for every factory call without a device in a placed test function."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if not _is_placed_test(node):
            continue
        for inner in ast.walk(node):
            name = _factory_name(inner) if isinstance(inner, ast.Call) else None
            if name and not _says_device(inner, name):
                hits.append(f"{filename}:{inner.lineno}: {name}(...) in {node.name}")
    return hits


def test_placed_tests_build_every_tensor_on_an_explicit_device():
    hits = []
    for path in sorted(TESTS.rglob("*.py")):
        hits += undeviced_factory_calls(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not hits, "tensor factories without device= in device/backend tests:\n" + "\n".join(hits)


def test_the_check_finds_a_planted_call():
    planted = """
import torch
from fusedops.testing import random_tensor

def test_planted(backend, n):
    ok = torch.zeros(3, device="cpu"), random_tensor((2,), torch.float32, "cpu")
    bad = [torch.ones(n), random_tensor((2,), torch.float32)]
    nested = lambda: torch.arange(4).to("cpu")
    return ok, bad, nested

def test_not_placed(n):
    return torch.ones(n)
"""
    assert undeviced_factory_calls(planted, "planted.py") == [
        "planted.py:7: torch.ones(...) in test_planted",
        "planted.py:7: random_tensor(...) in test_planted",
        "planted.py:8: torch.arange(...) in test_planted",
    ]

"""The package's layers go one way (integrations/hooks -> nn/optim -> ops -> dispatch ->
kernels): kernels never import ``fusedops.ops``, nothing below integrations/ and hooks/
imports them, and no fusedops module imports itself back through others. Read from the
sources (every import statement, function-level ones included)."""

from __future__ import annotations

from pathlib import Path

from fusedops.kernels.verified import fusedops_imports

PACKAGE = Path(__file__).resolve().parents[1] / "fusedops"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The fusedops modules ``path`` imports anywhere in it (the verified-dispatch table's
    reader of kernel sources, host plumbing included)."""
    return fusedops_imports(path) & MODULES.keys()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_kernels_import_nothing_from_ops():
    offenders = {
        name: sorted(imported for imported in _imports(path) if imported.startswith("fusedops.ops"))
        for name, path in MODULES.items()
        if name.startswith("fusedops.kernels")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_no_import_cycles():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_checks_see_a_cycle_and_a_layer_breach():
    """The two checks above on made-up graphs: they are not vacuous."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    breach = _imports(MODULES["fusedops.ops.quick_gelu"])
    assert "fusedops.dispatch" in breach and "fusedops.kernels.shared.constants" in breach


#: The layers below ``integrations/`` and ``hooks/`` (docs/contract.md, "Layers"), and those two.
LOWER_LAYERS = (
    "fusedops.nn",
    "fusedops.optim",
    "fusedops.ops",
    "fusedops.dispatch",
    "fusedops.kernels",
)
UPPER_LAYERS = ("fusedops.integrations", "fusedops.hooks")


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def _upward(path: Path) -> list[str]:
    """The modules of ``integrations/`` and ``hooks/`` that ``path`` imports."""
    return sorted(name for name in _imports(path) if _within(name, UPPER_LAYERS))


def test_nn_optim_ops_and_kernels_import_no_integration_or_hook():
    """Code for other libraries lives in fusedops/integrations/<library>/ and the hooks above
    fusedops' own modules: nothing below them imports them."""
    offenders = {
        name: _upward(path) for name, path in MODULES.items() if _within(name, LOWER_LAYERS)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_upward_check_sees_a_planted_breach(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import fusedops.hooks.registry\n"
        "def late():\n"
        "    from fusedops.integrations.transformers.attention import NAME\n"
    )
    assert _upward(planted) == [
        "fusedops.hooks.registry",
        "fusedops.integrations.transformers.attention",
    ]
    assert not _within("fusedops.nnx", LOWER_LAYERS) and _within("fusedops.nn.swin", LOWER_LAYERS)

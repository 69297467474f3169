"""The package's layers go one way (integrations/hooks -> nn/optim -> ops -> dispatch ->
kernels): kernels never import ``fusedops.ops``, and no fusedops module imports itself back
through others. Read from the sources (every import statement, function-level ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fusedops"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The fusedops modules ``path`` imports anywhere in it (``from a.b import c`` is ``a.b.c``
    where that is a module, else ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
    return {name for name in found if name in MODULES}


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

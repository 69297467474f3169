"""The package's layers go one way (integrations/hooks -> nn/optim -> ops -> dispatch ->
kernels): kernels never import ``fusedops.ops``, nothing below integrations/ and hooks/
imports them, and no fusedops module imports itself back through others. Read from the
sources (every import statement, function-level ones included)."""

from __future__ import annotations

import ast
import re
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


# ------------------------------------------------------------------------------------------
# The floor table of docs/contract.md ("Layers"): every module on one floor, every import
# (statements, function-level ones included, and import targets written as strings) from its
# own floor or below.

CONTRACT = PACKAGE.parent / "docs" / "contract.md"


def floor_table(text: str) -> dict[str, int]:
    """pattern -> floor, from the table under "## Layers" (``name.*``: the package and what is
    in it; a plain name: that module)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for pattern in re.findall(r"`([\w.*]+)`", cells[1]):
            assert pattern not in table, f"{pattern} is on two floors"
            table[pattern] = int(cells[0])
    return table


def floor_of(module: str, table: dict[str, int]) -> int | None:
    """The floor of ``module``: the row of its longest matching pattern (None: unplaced)."""
    best, floor = -1, None
    for pattern, level in table.items():
        package = pattern.removesuffix(".*")
        matches = module == package or (pattern.endswith(".*") and module.startswith(f"{package}."))
        if matches and len(package) > best:
            best, floor = len(package), level
    return floor


def import_targets(path: Path, modules) -> set[str]:
    """The fusedops modules ``path`` imports: statements anywhere in it, and strings naming a
    module (``"fusedops.x.y"``, ``"fusedops.x.y:attr"``) or an f-string starting with
    ``"fusedops.x."`` (package ``fusedops.x``), as importlib, ``resolve`` and lazy attribute
    tables load them. The bare string "fusedops" (a logger, the torch.library namespace) is
    no import."""
    found = fusedops_imports(path) & set(modules)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":", 1)[0]
            if "." in name and name in modules:
                found.add(name)
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                package = head.value.rpartition(".")[0]
                if "." in package and package in modules:
                    found.add(package)
    return found


def against_the_floors(modules: dict[str, Path], table: dict[str, int]) -> list[str]:
    """Each import that runs up the floors, and each module on no floor."""
    found = []
    for name, path in sorted(modules.items()):
        floor = floor_of(name, table)
        if floor is None:
            found.append(f"{name}: on no floor of docs/contract.md")
            continue
        for imported in sorted(import_targets(path, modules) - {name}):
            if (floor_of(imported, table) or 0) > floor:
                found.append(
                    f"{name} (floor {floor}) imports {imported} (floor {floor_of(imported, table)})"
                )
    return found


def test_every_import_keeps_to_the_floors_of_the_contract():
    table = floor_table(CONTRACT.read_text())
    assert against_the_floors(MODULES, table) == []


def test_the_floor_check_sees_an_upward_import_and_an_unplaced_module(tmp_path):
    table = floor_table(CONTRACT.read_text())
    assert floor_of("fusedops.kernels.triton.adam", table) < floor_of("fusedops.dispatch", table)
    assert floor_of("fusedops.dispatch.registry", table) < floor_of("fusedops.dispatch", table)
    assert floor_of("fusedops.hooks.registry", table) < floor_of(
        "fusedops.integrations.timm.hooks", table
    )
    assert floor_of("fusedops.integrations.timm.hooks", table) < floor_of("fusedops.hooks", table)
    kernel = tmp_path / "kernel.py"
    kernel.write_text(
        "def launch():\n"
        "    from fusedops import dispatch\n"
        "    importlib.import_module(f'fusedops.xla.fused.{name}')\n"
        "    resolve('fusedops.nn.quick_gelu:fused_subclass')\n"
        "    log = 'fusedops'\n"
    )
    planted = {**MODULES, "fusedops.kernels.triton.planted": kernel, "fusedops.elsewhere": kernel}
    found = [
        line
        for line in against_the_floors(planted, table)
        if "planted" in line or "elsewhere" in line
    ]
    assert found == [
        "fusedops.elsewhere: on no floor of docs/contract.md",
        "fusedops.kernels.triton.planted (floor 1) imports fusedops.dispatch (floor 4)",
        "fusedops.kernels.triton.planted (floor 1) imports fusedops.nn.quick_gelu (floor 6)",
        "fusedops.kernels.triton.planted (floor 1) imports fusedops.xla.fused (floor 7)",
    ]

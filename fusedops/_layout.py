"""The op wiring, read from the package's files: which modules of ``fusedops/ops/`` define ops,
the ops each registers (with its kernel module stem) and each op module's public names.

Read from the sources (file names and ``ast``), never by importing them: the lazy public
``fusedops.<name>`` attributes and ``fusedops.ops.OP_MODULES`` come from here without
importing torch. The rules (docs/adding-an-op.md):

- an op module is a module of ``fusedops/ops/`` whose name has no leading underscore and whose
  source calls ``register_op(`` (``dispatch.register_op``); the others are helpers;
- its public names are its ``__all__``, a list or tuple of string literals (every op module
  has one; the op modules' names are ``fusedops.<name>``);
- a ``register_op`` call names its op by a string literal, a module-level string constant
  (``NAME = "..."``) or the variable of an enclosing ``for`` loop over a tuple or list of string
  literals, and its kernel modules by ``kernels="<stem>"`` (a literal or such a constant).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: The folder of the op modules.
OPS_DIR = Path(__file__).resolve().parent / "ops"


class LayoutError(ValueError):
    """A source the wiring cannot read: an op module without a literal ``__all__``, a
    ``register_op`` call whose op name is not written in one of the readable forms."""


@dataclass(frozen=True)
class Registration:
    """One op as its module registers it: ``register_op(op, ..., kernels=kernels)`` in
    ``fusedops/ops/<module>.py``."""

    op: str
    module: str
    kernels: str | None


def _is_register_op(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "register_op") or (
        isinstance(func, ast.Name) and func.id == "register_op"
    )


def _op_trees(folder: Path) -> dict[str, ast.Module]:
    """Op module name -> its parsed source, sorted by name: the public modules of ``folder``
    (no leading underscore) whose source calls ``register_op(``."""
    trees = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        source = path.read_text(encoding="utf-8")
        if "register_op(" not in source:  # a helper: not parsed
            continue
        tree = ast.parse(source, str(path))
        if any(isinstance(node, ast.Call) and _is_register_op(node) for node in ast.walk(tree)):
            trees[path.stem] = tree
    return trees


def op_modules(folder: Path = OPS_DIR) -> tuple[str, ...]:
    """The op modules of ``folder`` (``fusedops/ops/``), sorted: the public modules (no leading
    underscore) whose source calls ``register_op(``."""
    return tuple(_op_trees(folder))


def _strings(node: ast.expr) -> list[str] | None:
    """The values of a string literal or a tuple/list of string literals, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_strings(element) for element in node.elts]
        if all(value is not None and len(value) == 1 for value in values):
            return [value[0] for value in values]
    return None


def _module_constants(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``NAME = "literal"`` (or a tuple/list of literals) assignments."""
    found: dict[str, list[str]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        values = _strings(value)
        for target in targets:
            if isinstance(target, ast.Name):
                if values is None:
                    found.pop(target.id, None)
                else:
                    found[target.id] = values
    return found


class _RegisterCalls(ast.NodeVisitor):
    """Each ``register_op(...)`` call with the string loop variables bound around it."""

    def __init__(self) -> None:
        self.loops: list[tuple[str, list[str]]] = []
        self.calls: list[tuple[ast.Call, dict[str, list[str]]]] = []

    def visit_For(self, node: ast.For) -> None:
        values = _strings(node.iter) if isinstance(node.target, ast.Name) else None
        if values is not None:
            self.loops.append((node.target.id, values))
        self.generic_visit(node)
        if values is not None:
            self.loops.pop()

    def visit_Call(self, node: ast.Call) -> None:
        if _is_register_op(node):
            self.calls.append((node, dict(self.loops)))
        self.generic_visit(node)


def _resolve(node: ast.expr, loops: dict[str, list[str]], constants: dict[str, list[str]]):
    """The string values ``node`` takes: a literal, a loop variable or a module constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        if node.id in loops:
            return loops[node.id]
        if node.id in constants and len(constants[node.id]) == 1:
            return constants[node.id]
    return None


def registrations(folder: Path = OPS_DIR) -> list[Registration]:
    """Every op the op modules of ``folder`` register, in ``op_modules`` order and, within a
    module, in source order."""
    found = []
    for module, tree in _op_trees(folder).items():
        path = folder / f"{module}.py"
        constants = _module_constants(tree)
        visitor = _RegisterCalls()
        visitor.visit(tree)
        for call, loops in visitor.calls:
            where = f"{path.name}:{call.lineno}"
            if not call.args:
                raise LayoutError(f"{where}: register_op without its op name")
            names = _resolve(call.args[0], loops, constants)
            if names is None:
                raise LayoutError(
                    f"{where}: register_op's op name is not a string literal, a module-level "
                    "string constant or the variable of a for loop over string literals"
                )
            kernels = None
            for keyword in call.keywords:
                if keyword.arg == "kernels":
                    values = _resolve(keyword.value, loops, constants)
                    if values is None or len(values) != 1:
                        raise LayoutError(f"{where}: kernels= is not a string literal")
                    kernels = values[0]
            found.extend(Registration(name, module, kernels) for name in names)
    ops = [r.op for r in found]
    duplicated = sorted({op for op in ops if ops.count(op) > 1})
    if duplicated:
        raise LayoutError(f"ops registered more than once: {duplicated}")
    return found


def public_names(path: Path, tree: ast.Module | None = None) -> tuple[str, ...]:
    """The ``__all__`` of module ``path`` (a list or tuple of string literals at module level;
    ``tree``: its source already parsed)."""
    if tree is None:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            values = _strings(value) if isinstance(value, (ast.Tuple, ast.List)) else None
            if values is None:
                raise LayoutError(f"{path.name}: __all__ is not a list of string literals")
            return tuple(values)
    raise LayoutError(f"{path.name} has no __all__ (its public names: [] for none)")


def op_attributes(folder: Path = OPS_DIR, package: str = "fusedops.ops") -> dict[str, str]:
    """Public name -> the dotted op module defining it, from every op module's ``__all__``
    (the op part of ``fusedops``' lazy attributes)."""
    table: dict[str, str] = {}
    for module, tree in _op_trees(folder).items():
        for name in public_names(folder / f"{module}.py", tree):
            if name in table:
                raise LayoutError(f"{name!r} is in the __all__ of {table[name]} and of {module}")
            table[name] = f"{package}.{module}"
    return table


def module_attributes(folder: Path, package: str) -> dict[str, str]:
    """Public name -> the dotted module defining it, from the ``__all__`` of every public
    module (no leading underscore) of ``folder``, the package ``package`` (``fusedops.nn``'s
    lazy exports)."""
    table: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        for name in public_names(path):
            if name in table:
                raise LayoutError(f"{name!r} is in the __all__ of {table[name]} and of {path.stem}")
            table[name] = f"{package}.{path.stem}"
    return table

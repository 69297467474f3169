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

The same reader gives a package's names from its modules (``fusedops.nn``): each public
module's ``__all__``, less the names it declares in ``__reexports__`` (a re-export module
gives names whose home is another module: an older import path, or the path another library
uses for them, docs/migrating.md; the name is exported from its home only).
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


def _module_assignment(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of the module-level assignment to ``name`` (the last one), or None."""
    found = None
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found = value
    return found


def _parsed(path: Path, tree: ast.Module | None) -> ast.Module:
    return tree if tree is not None else ast.parse(path.read_text(encoding="utf-8"), str(path))


def public_names(path: Path, tree: ast.Module | None = None) -> tuple[str, ...]:
    """The ``__all__`` of module ``path`` (a list or tuple of string literals at module level;
    ``tree``: its source already parsed)."""
    value = _module_assignment(_parsed(path, tree), "__all__")
    if value is None:
        raise LayoutError(f"{path.name} has no __all__ (its public names: [] for none)")
    values = _strings(value) if isinstance(value, (ast.Tuple, ast.List)) else None
    if values is None:
        raise LayoutError(f"{path.name}: __all__ is not a list of string literals")
    return tuple(values)


def reexported_names(path: Path, tree: ast.Module | None = None) -> tuple[str, ...]:
    """The ``__reexports__`` of module ``path``: the names of its ``__all__`` whose home is
    another module (a list or tuple of string literals, or ``__all__`` itself for a module
    that only re-exports; none declared: ``()``)."""
    tree = _parsed(path, tree)
    value = _module_assignment(tree, "__reexports__")
    if value is None:
        return ()
    names = public_names(path, tree)
    if isinstance(value, ast.Name) and value.id == "__all__":
        return names
    values = _strings(value) if isinstance(value, (ast.Tuple, ast.List)) else None
    if values is None:
        raise LayoutError(f"{path.name}: __reexports__ is not a list of string literals or __all__")
    outside = sorted(set(values) - set(names))
    if outside:
        raise LayoutError(f"{path.name}: __reexports__ names {outside}, which are not in __all__")
    return tuple(values)


def own_names(path: Path, tree: ast.Module | None = None) -> tuple[str, ...]:
    """The names module ``path`` is the home of: its ``__all__`` less its ``__reexports__``."""
    tree = _parsed(path, tree)
    reexported = set(reexported_names(path, tree))
    return tuple(name for name in public_names(path, tree) if name not in reexported)


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
    """Public name -> the dotted module defining it, from every public module (no leading
    underscore) of ``folder``, the package ``package`` (``fusedops.nn``'s lazy exports): each
    module's ``__all__`` less its ``__reexports__`` (``own_names``), so a name re-exported
    under another path is exported from its home alone. A name two modules claim as their
    own is a ``LayoutError``."""
    table: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        for name in own_names(path):
            if name in table:
                raise LayoutError(f"{name!r} is in the __all__ of {table[name]} and of {path.stem}")
            table[name] = f"{package}.{path.stem}"
    return table

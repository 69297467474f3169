"""Lazy module attributes: a package names what it exports, and each is imported on first
access, so importing the package stays free of torch/triton/JAX until something is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_module(
    namespace: dict,
    attributes: dict[str, str],
    submodules: tuple[str, ...] = (),
    derived: Callable[[], dict[str, str]] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the module whose globals are ``namespace``.

    attributes: exported name -> dotted module defining it; submodules: names of subpackages
    imported on access. A loaded attribute is cached in ``namespace``. derived: a function
    giving more exported names (name -> module), called once, on the first look-up of a public
    name that ``attributes`` and ``submodules`` do not hold (or of ``__all__``, or ``dir()``;
    names starting with "_" never call it); its names must not repeat theirs. Where
    ``namespace`` sets no ``__all__``, ``__getattr__`` gives it, cached: every exported name,
    sorted, then the submodules.
    """
    package = namespace["__name__"]
    table: dict[str, str] | None = None if derived is not None else attributes

    def _table() -> dict[str, str]:
        nonlocal table
        if table is None:
            more = derived()
            clashes = sorted(set(more) & (set(attributes) | set(submodules)))
            if clashes:
                raise ValueError(f"{package}: {clashes} exported twice")
            table = {**attributes, **more}
        return table

    def __getattr__(name: str):
        if name in attributes:
            module = attributes[name]
        elif name in submodules:
            return importlib.import_module(f"{package}.{name}")
        elif name == "__all__":
            value = namespace["__all__"] = sorted(_table()) + list(submodules)
            return value
        elif name.startswith("_") or name not in _table():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        else:
            module = table[name]
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(_table()) | set(submodules))

    return __getattr__, __dir__

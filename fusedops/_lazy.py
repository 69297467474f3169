"""Lazy module attributes: a package names what it exports, and each is imported on first
access, so importing the package stays free of torch/triton/JAX until something is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_module(
    namespace: dict, attributes: dict[str, str], submodules: tuple[str, ...] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the module whose globals are ``namespace``.

    attributes: exported name -> dotted module defining it; submodules: names of subpackages
    imported on access. A loaded attribute is cached in ``namespace``.
    """
    package = namespace["__name__"]

    def __getattr__(name: str):
        if name in attributes:
            value = getattr(importlib.import_module(attributes[name]), name)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(attributes) | set(submodules))

    return __getattr__, __dir__

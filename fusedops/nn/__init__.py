"""Drop-in modules: subclasses of the torch modules they replace, running fused ops.

Each module of this package lists its public names in ``__all__``; ``fusedops.nn.<name>``
loads the module defining it on first access (``fusedops._layout.module_attributes``), so a
new module needs no line here.
"""

from __future__ import annotations

from pathlib import Path

from fusedops._lazy import lazy_module


def _exports() -> dict[str, str]:
    from fusedops import _layout

    return _layout.module_attributes(Path(__file__).resolve().parent, __name__)


__getattr__, __dir__ = lazy_module(globals(), {}, (), _exports)

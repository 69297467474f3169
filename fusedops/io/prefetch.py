"""``Prefetcher`` under its earlier import path: a re-export (``__reexports__``) of
``fusedops.io.prefetcher``, its home (the seed runtime's module name)."""

from __future__ import annotations

from fusedops.io.prefetcher import Prefetcher

__all__ = ["Prefetcher"]
__reexports__ = __all__

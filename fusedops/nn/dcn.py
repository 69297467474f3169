"""``DCN`` and ``DCNv2`` under their earlier import path: re-exports (``__reexports__``) of
``fusedops.nn.dcn_v2``, their home (the DCNv2 package's and the seed runtime's module name)."""

from __future__ import annotations

from fusedops.nn.dcn_v2 import DCN, DCNv2

__all__ = ["DCN", "DCNv2"]
__reexports__ = __all__

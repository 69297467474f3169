"""``multi_apply`` and ``multi_apply_multi_stream`` under the seed runtime's module path (``from
torchacc.runtime.utils.misc import multi_apply_multi_stream`` ports as ``from
fusedops.utils.misc import multi_apply_multi_stream``; mmdet keeps ``multi_apply`` in a
``misc`` module too): re-exports (``__reexports__``) of ``fusedops.utils.multi_stream``, their
home."""

from __future__ import annotations

from fusedops.utils.multi_stream import multi_apply, multi_apply_multi_stream

__all__ = ["multi_apply", "multi_apply_multi_stream"]
__reexports__ = __all__

"""Fused subclasses of other libraries' module classes (what hooks and replace_modules swap in).

A fused subclass keeps the original's name, module, constructor, parameters, buffers and
state_dict; only the attributes it is given (``forward``, a helper method, a constant) are
replaced, ``isinstance(m, original)`` still holds and ``_fusedops_original`` is the original.
"""

from __future__ import annotations

import threading
from typing import Any

_cache: dict[tuple, type] = {}
_lock = threading.Lock()


def fused_subclass(original: type, attributes: dict[str, Any], computed_by: str) -> type:
    """The subclass of ``original`` with ``attributes`` (e.g. ``{"forward": fused_forward}``;
    one class per original and attributes, so every patched location shows the same class);
    ``original`` itself when it is already fused. computed_by: what computes it, for the
    docstring (e.g. ``"fusedops.quick_gelu"``)."""
    if original.__dict__.get("_fusedops_fused", False):
        return original
    key = (original, *sorted(attributes.items()))
    with _lock:
        fused = _cache.get(key)
        if fused is None:
            fused = type(
                original.__name__,
                (original,),
                {
                    **attributes,
                    "_fusedops_fused": True,
                    "_fusedops_original": original,
                    "__module__": original.__module__,
                    "__qualname__": original.__qualname__,
                    "__doc__": f"{original.__qualname__} computed by {computed_by}.",
                },
            )
            _cache[key] = fused
    return fused

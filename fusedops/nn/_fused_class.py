"""Fused subclasses of other libraries' module classes (what hooks and replace_modules swap in).

A fused subclass keeps the original's name, module, constructor, parameters, buffers and
state_dict; only ``forward`` is replaced, and ``isinstance(m, original)`` still holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_cache: dict[tuple[type, Callable], type] = {}
_lock = threading.Lock()


def fused_subclass(original: type, forward: Callable, computed_by: str) -> type:
    """The subclass of ``original`` whose forward is ``forward`` (one class per pair, so every
    patched location shows the same class); ``original`` itself when it is already fused.
    computed_by: what computes it, for the docstring (e.g. ``"fusedops.quick_gelu"``)."""
    if original.__dict__.get("_fusedops_fused", False):
        return original
    with _lock:
        fused = _cache.get((original, forward))
        if fused is None:
            fused = type(
                original.__name__,
                (original,),
                {
                    "forward": forward,
                    "_fusedops_fused": True,
                    "__module__": original.__module__,
                    "__qualname__": original.__qualname__,
                    "__doc__": f"{original.__qualname__} computed by {computed_by}.",
                },
            )
            _cache[(original, forward)] = fused
    return fused

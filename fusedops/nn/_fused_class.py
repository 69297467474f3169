"""Fused subclasses of other libraries' module classes (what hooks and replace_modules swap in).

A fused subclass keeps the original's name, module, constructor, parameters, buffers and
state_dict; only the attributes it is given (``forward``, a helper method, a constant) are
replaced, ``isinstance(m, original)`` still holds and ``_fusedops_original`` is the original.

Pickling (``torch.save(model)``) and ``copy.deepcopy``: a fused subclass shares its original's
module and name, so pickle cannot find it by name where that name holds the original (after
``replace_modules``, or once the hook is disabled). Its instances are pickled as "the fused
subclass of <original> with these attributes" (``_rebuild``; the original by name, the
attributes are module-level functions), so they load back fused, with or without the hook,
wherever fusedops is importable.
"""

from __future__ import annotations

import sys
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
                    "_fusedops_made_with": (dict(attributes), computed_by),
                    "__reduce_ex__": _reduce_ex,
                    "__module__": original.__module__,
                    "__qualname__": original.__qualname__,
                    "__doc__": f"{original.__qualname__} computed by {computed_by}.",
                },
            )
            _cache[key] = fused
    return fused


def _by_name(cls: type) -> Any:
    """What ``cls``'s module and qualified name hold now (None where nothing), as pickle
    would look it up, without importing anything."""
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found


def _reduce_ex(self, protocol: int):
    fused = next(c for c in type(self).__mro__ if "_fusedops_made_with" in c.__dict__)
    reduced = super(fused, self).__reduce_ex__(protocol)
    if type(self) is not fused:  # a user's subclass of a fused class: pickled by its own name
        return reduced
    # The original by name where pickle finds it; where the name shows this fused class (the
    # hook is on), the name itself, resolved when loading.
    original = fused._fusedops_original
    where = (fused.__module__, fused.__qualname__) if _by_name(fused) is fused else original
    return (_rebuild, (where, *fused._fusedops_made_with), *reduced[2:])


def _rebuild(original: type | tuple[str, str], attributes: dict[str, Any], computed_by: str):
    """Unpickling: a new instance (its state set next) of the fused subclass of ``original``
    (a class, or the (module, qualified name) of one, which may show its fused subclass)."""
    if isinstance(original, tuple):
        module, qualname = original
        __import__(module)
        found: Any = sys.modules[module]
        for part in qualname.split("."):
            found = getattr(found, part)
        original = found.__dict__.get("_fusedops_original", found)
    fused = fused_subclass(original, attributes, computed_by)
    return fused.__new__(fused)

"""Hooks on open_clip: its ``QuickGELU`` (the activation of the OpenAI-pretrained CLIP models,
``quick_gelu=True`` / ``*-quickgelu`` configs).

``open_clip.transformer.QuickGELU`` is the class; ``open_clip.model`` and
``open_clip.coca_model`` import it by name and read it when they build a model
(``act_layer = QuickGELU if quick_gelu else nn.GELU``), so all three are patched: a module
imported before the hook was enabled keeps its own reference. Nothing here imports open_clip.
"""

from __future__ import annotations

from typing import Any

from fusedops.hooks import lib_torch  # noqa: F401  (defines the hooks contributed to)
from fusedops.hooks.machinery import Target, contribute, installed, resolve

_DEFINED_IN = "open_clip.transformer"
#: Where open_clip holds the class: its module first, then the modules importing it by name.
_LOCATIONS = (_DEFINED_IN, "open_clip.model", "open_clip.coca_model")


def _installed() -> bool:
    return installed("open_clip")


def _fused(original: type) -> type:
    return resolve("fusedops.nn.quick_gelu:fused_subclass")(original)


def _targets(**_: Any) -> list[Target]:
    if not _installed():
        return []
    return [
        Target(module, "QuickGELU", _fused, optional=module != _DEFINED_IN) for module in _LOCATIONS
    ]


def _swap(cls: type, **_: Any):
    return _fused(cls) if (cls.__module__, cls.__qualname__) == (_DEFINED_IN, "QuickGELU") else None


contribute("quick_gelu", _targets, _swap)

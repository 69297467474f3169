"""open_clip's contribution to the hooks: its ``QuickGELU`` (the activation of the
OpenAI-pretrained CLIP models, ``quick_gelu=True`` / ``*-quickgelu`` configs).

``open_clip.transformer.QuickGELU`` is the class; ``open_clip.model`` and
``open_clip.coca_model`` import it by name and read it when they build a model
(``act_layer = QuickGELU if quick_gelu else nn.GELU``), so all three are patched: a module
imported before the hook was enabled keeps its own reference. Nothing here imports open_clip.
"""

from __future__ import annotations

from fusedops.hooks import registry  # noqa: F401  (defines the hooks contributed to)
from fusedops.hooks.machinery import ClassPatches, contribute, resolve

_QUICK_GELU = ("open_clip.transformer", "QuickGELU")


def _fused(original: type) -> type:
    return resolve("fusedops.nn.quick_gelu:fused_subclass")(original)


#: The class where open_clip defines it, then the modules importing it by name.
_PATCHES = ClassPatches(
    {_QUICK_GELU: _fused}, importers={_QUICK_GELU: ("open_clip.model", "open_clip.coca_model")}
)
contribute("quick_gelu", _PATCHES.targets, _PATCHES.swap, package="open_clip")

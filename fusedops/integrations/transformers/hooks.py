"""transformers' contributions to the hooks: QuickGELU (class and activation tables), the
RMSNorm family, Swin / Swinv2.

- quick_gelu: ``transformers.activations.QuickGELUActivation`` is replaced in the module, in the
  activation tables ``ACT2CLS`` and ``ACT2FN`` (entries ``"quick_gelu"``; model files read
  ``ACT2FN[config.hidden_act]``, and ``ACT2FN`` is a copy of ``ACT2CLS`` made at import, so
  both dicts are patched in place; ``get_activation`` reads ``ACT2FN``) and in the model files
  that import the class by name (BridgeTower).
- rms_norm: the RMSNorm-family classes of ``rms_norm_classes.json`` (``LlamaRMSNorm``,
  ``T5LayerNorm``, ...), each replaced in its modeling module by a fused subclass of the
  variant of its math (``rms_norm_variants.py``).
- swin: Swin / Swinv2 layers and attentions (``swin.py``; timm's classes are added by
  ``fusedops.integrations.timm.hooks``).

Nothing here imports transformers: targets are (module, class) names, patched when the module
is imported (or now, if it is). The lists are static because hooks are enabled before
transformers is imported (``rms_norm_classes``). Classes of other transformers versions that
are missing are skipped silently (the targets are optional); a listed name that holds another
class (a model file's ``T5LayerNorm = FusedRMSNorm``) or whose forward is not its variant's
code (another transformers version) is left unpatched with a warning.
"""

from __future__ import annotations

from typing import Any

from fusedops.hooks.machinery import ClassPatches, Target, Unpatched, contribute, resolve
from fusedops.hooks.registry import swin_patches
from fusedops.integrations.transformers.rms_norm_classes import (
    RMS_NORM_CLASSES,
    rms_norm_code_mismatch,
)

_ACTIVATIONS = "transformers.activations"
_QUICK_GELU = "QuickGELUActivation"
#: Model files that import QuickGELUActivation by name (patched there too: a file imported
#: before the hook was enabled keeps its own reference).
_QUICK_GELU_IMPORTERS = ("transformers.models.bridgetower.modeling_bridgetower",)


def _fused_quick_gelu(original: Any) -> Any:
    """The fused class for a class, or for a ``(class, kwargs)`` activation-table entry."""
    fused_subclass = resolve("fusedops.nn.quick_gelu:fused_subclass")
    if isinstance(original, tuple):
        cls, kwargs = original
        return fused_subclass(cls), kwargs
    return fused_subclass(original)


_QUICK_GELU_CLASS = ClassPatches(
    {(_ACTIVATIONS, _QUICK_GELU): _fused_quick_gelu},
    importers={(_ACTIVATIONS, _QUICK_GELU): _QUICK_GELU_IMPORTERS},
)


def _quick_gelu_targets(**_: Any) -> list[Target]:
    return [
        *_QUICK_GELU_CLASS.targets(),
        Target(_ACTIVATIONS, "ACT2CLS", _fused_quick_gelu, key="quick_gelu"),
        Target(_ACTIVATIONS, "ACT2FN", _fused_quick_gelu, key="quick_gelu"),
    ]


contribute("quick_gelu", _quick_gelu_targets, _QUICK_GELU_CLASS.swap, package="transformers")


def _fused_rms_norm(variant: str):
    def make(original: type) -> type:
        mismatch = rms_norm_code_mismatch(original, variant)
        if mismatch is not None:
            raise Unpatched(mismatch)
        fused_subclass = resolve(
            "fusedops.integrations.transformers.rms_norm_variants:fused_subclass"
        )
        return fused_subclass(original, variant)

    return make


def _rms_norm_classes() -> dict[tuple[str, str], Any]:
    """(module, class) -> its make, for every listed class."""
    found = {}
    for variant, names in RMS_NORM_CLASSES.items():
        for name in names.split():
            module, _, cls = name.rpartition(".")
            found[(f"transformers.models.{module}", cls)] = _fused_rms_norm(variant)
    return found


_RMS_NORM = ClassPatches(_rms_norm_classes(), optional=True)
contribute("rms_norm", _RMS_NORM.targets, _RMS_NORM.swap, package="transformers")


# Swin / Swinv2 (the "swin" hook): the layers' shift + partition / reverse + unshift become the
# fused window gathers, the attention's bias + mask + softmax the fused Swin softmax (swin.py).

SWIN_TRANSFORMERS_CLASSES = (
    ("transformers.models.swin.modeling_swin", "SwinLayer"),
    ("transformers.models.swin.modeling_swin", "SwinAttention"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2Layer"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2SelfAttention"),
)
# Swinv2 (or a layout) may be missing from some transformers versions: optional targets.
_SWIN = swin_patches(
    SWIN_TRANSFORMERS_CLASSES, "fusedops.integrations.transformers.swin:recognise", optional=True
)
contribute("swin", _SWIN.targets, _SWIN.swap, package="transformers")

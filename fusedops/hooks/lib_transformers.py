"""Hooks on Hugging Face ``transformers`` classes. Never imports torch or transformers: the
replacements are resolved when a patch is applied.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import Any

from fusedops.hooks.machinery import Hook, Target, disable, enable, register_hook, resolve

# ------------------------------------------------------------------------------------------
# Swin / Swinv2 (the "swin" hook; timm's classes are added by lib_timm): the layers' shift +
# partition / reverse + unshift become the fused window gathers, the attention's bias + mask +
# softmax the fused Swin softmax (fusedops/nn/swin_transformers.py).

SWIN_TRANSFORMERS_CLASSES = (
    ("transformers.models.swin.modeling_swin", "SwinLayer"),
    ("transformers.models.swin.modeling_swin", "SwinAttention"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2Layer"),
    ("transformers.models.swinv2.modeling_swinv2", "Swinv2SelfAttention"),
)


def swin_fused_class(recognise: str):
    """A ``Target.make`` / swap helper: the fused subclass of a class, recognised by the
    ``"module:function"`` named (the original, with a warning, when its shape is unknown)."""

    def make(original):
        swin = importlib.import_module("fusedops.nn.swin")
        return swin.fused_or_original(original, resolve(recognise))

    return make


def swin_swap(classes, recognise: str):
    """A ``module_swap`` for ``replace_modules``: exactly the listed classes (by module and
    name; already fused ones are left alone) get their fused subclass."""
    names = set(classes)
    make = swin_fused_class(recognise)

    def swap(cls, **_: Any):
        if (cls.__module__, cls.__name__) not in names or cls.__dict__.get("_fusedops_fused"):
            return None
        fused = make(cls)
        return None if fused is cls else fused

    return swap


_RECOGNISE_TRANSFORMERS = "fusedops.nn.swin_transformers:recognise"


def _swin_targets(**_: Any) -> list[Target]:
    if not any(importlib.util.find_spec(name) for name in ("transformers", "timm")):
        warnings.warn(
            "enable_fused_swin(): neither transformers nor timm is installed, nothing to patch",
            stacklevel=4,
        )
    make = swin_fused_class(_RECOGNISE_TRANSFORMERS)
    return [Target(module, attr, make) for module, attr in SWIN_TRANSFORMERS_CLASSES]


register_hook(
    Hook(
        "swin",
        targets=_swin_targets,
        module_swap=swin_swap(SWIN_TRANSFORMERS_CLASSES, _RECOGNISE_TRANSFORMERS),
    )
)


def enable_fused_swin() -> None:
    """Make Swin models use fusedops' window gathers and Swin softmax: transformers'
    ``SwinLayer``, ``SwinAttention``, ``Swinv2Layer``, ``Swinv2SelfAttention`` and timm's
    ``SwinTransformerBlock``, ``WindowAttention`` are replaced by fused subclasses (now, or when
    their module is imported). Models built before: ``fusedops.replace_modules(model)``."""
    enable("swin")


def disable_fused_swin() -> None:
    """Restore the Swin classes ``enable_fused_swin`` replaced."""
    disable("swin")

"""Hugging Face transformers: everything fusedops does for it, in one place.

- ``attention``: fusedops' window attention as the attention implementation ``"fusedops"``::

      from fusedops.integrations.transformers import register_attention
      register_attention()          # then attn_implementation="fusedops"

  Its names (``register_attention``, ``attention_forward``, ``NAME``, ...) are read here too.
- ``hooks``: the targets of the quick_gelu, rms_norm and swin hooks (``fusedops.hooks``).
- ``rms_norm_classes`` (and ``rms_norm_classes.json``): which RMSNorm class has which variant
  of the math, the classes left out and why, each variant's forward as transformers writes it.
- ``rms_norm_variants``: the fused forward of each variant.
- ``swin``: the fused Swin / Swinv2 layers and attentions.

Importing this package imports neither torch nor transformers (the hooks import ``hooks``
before ``import torch``); the attention module's names are loaded on first access.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("attention", "hooks", "rms_norm_classes", "rms_norm_variants", "swin")


def __getattr__(name: str):
    """A submodule, or a name of ``attention`` (where this package's module used to be)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.attention"), name)


def __dir__() -> list[str]:
    """This package's names, its submodules and the attention module's public names."""
    attention = importlib.import_module(f"{__name__}.attention")
    public = [name for name in vars(attention) if not name.startswith("_")]
    return sorted(set(globals()) | set(_SUBMODULES) | set(public))

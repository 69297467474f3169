"""Hooks: patch torch and model libraries so unchanged training scripts run fused ops.

Each hook replaces named classes (``torch.nn.LayerNorm``, ``torch.optim.Adam``, a CLIP
``QuickGELU`` class...) by a fused subclass with the same constructor and state_dict, everywhere
they are exposed, and can restore the originals::

    from fusedops import hooks
    hooks.enable_fused_layer_norm()
    hooks.enabled()                          # ['layer_norm']
    with hooks.patched("quick_gelu", classes=[MyQuickGELU]): ...
    hooks.disable_fused_layer_norm()

Enabled before the target module is imported (even before ``import torch``), a hook patches at
import time. ``FUSEDOPS_HOOKS=a,b`` (or ``all``) enables hooks at interpreter start through the
``fusedops_hooks.pth`` file the package installs. ``replace_modules(model)`` converts a model
that is already built (``verbose=True`` prints how many modules of each class it swapped).
``report()`` (or ``state()``) says what each hook patched and what waits for an import;
``unfused(model)`` lists the modules of a model that a hook covers but that are not fused.

Layout: ``machinery`` (patching, the import finder), ``registry`` (every hook by name, its
``enable_*`` / ``disable_*``, the targets in torch and in user classes); each model library's
targets are in ``fusedops/integrations/<library>/hooks.py`` (transformers, timm, torchvision,
mmcv, open_clip), imported here. Importing this package never imports torch or those
libraries.
"""

from __future__ import annotations

import importlib

from fusedops.hooks import registry
from fusedops.hooks.machinery import (
    ClassPatches,
    Hook,
    Target,
    Unpatched,
    available,
    contribute,
    disable,
    enable,
    enable_from_spec,
    enabled,
    module_swaps,
    patched,
    register_hook,
    replace_modules,
    report,
    state,
    unfused,
)
from fusedops.hooks.registry import *  # noqa: F403  (every enable_* / disable_*: registry.__all__)

#: The modules that add each model library's targets to the hooks
#: (``fusedops/integrations/<library>/hooks.py``), imported here in this order, the order their
#: targets are patched. Full names, so that a reader of the sources sees them as imports.
INTEGRATION_HOOKS = (
    "fusedops.integrations.torchvision.hooks",
    "fusedops.integrations.mmcv.hooks",
    "fusedops.integrations.open_clip.hooks",
    "fusedops.integrations.transformers.hooks",
    "fusedops.integrations.timm.hooks",
)
#: The libraries of ``INTEGRATION_HOOKS``, in its order.
LIBRARIES = tuple(name.split(".")[2] for name in INTEGRATION_HOOKS)
for _module in INTEGRATION_HOOKS:
    importlib.import_module(_module)

__all__ = [
    "ClassPatches",
    "Hook",
    "Target",
    "Unpatched",
    "available",
    "contribute",
    "disable",
    "enable",
    "enable_from_spec",
    "enabled",
    "module_swaps",
    "patched",
    "register_hook",
    "replace_modules",
    "report",
    "state",
    "unfused",
    *registry.__all__,
]

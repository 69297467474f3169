"""The hooks registry: every hook by name (``FUSEDOPS_HOOKS`` names), its ``enable_*`` /
``disable_*`` functions, and the targets in torch itself and in user classes: LayerNorm,
RMSNorm, Adam and AdamW (adam), AdamW (adamw), SGD (sgd), QuickGELU (user classes,
``nn.GELU``); swin, nms and dcn patch model libraries only.

The libraries' own targets (transformers, timm, torchvision, mmcv, open_clip) live with the
rest of fusedops' code for that library, in ``fusedops/integrations/<library>/hooks.py``, which
adds them to these hooks with ``contribute``. Never imports torch: replacements are resolved
when a patch is applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from fusedops.hooks.machinery import (
    ClassPatches,
    Hook,
    Target,
    Unpatched,
    disable,
    enable,
    register_hook,
    resolve,
)

#: Each hook's switches, ``enable_*`` / ``disable_*`` (``fusedops.hooks`` exports them).
__all__ = [
    "disable_fused_adam",
    "disable_fused_adamw",
    "disable_fused_dcn",
    "disable_fused_layer_norm",
    "disable_fused_nms",
    "disable_fused_rms_norm",
    "disable_fused_sgd",
    "disable_fused_swin",
    "disable_quick_gelu",
    "enable_fused_adam",
    "enable_fused_adamw",
    "enable_fused_dcn",
    "enable_fused_layer_norm",
    "enable_fused_nms",
    "enable_fused_rms_norm",
    "enable_fused_sgd",
    "enable_fused_swin",
    "enable_quick_gelu",
]


def _quick_gelu_class_locations(classes: Iterable[Any]) -> list[tuple[str, str]]:
    locations = []
    for cls in classes:
        if isinstance(cls, str):
            module, _, attr = cls.rpartition(".")
            if not module:
                raise ValueError(f"classes: {cls!r} is not a dotted 'module.Class' path")
            locations.append((module, attr))
        elif isinstance(cls, type):
            locations.append((cls.__module__, cls.__qualname__))
        else:
            raise TypeError(f"classes: expected a class or 'module.Class', got {cls!r}")
    return locations


def _fused_quick_gelu(original: type) -> type:
    return resolve("fusedops.nn.quick_gelu:fused_subclass")(original)


def _replaced_by(fused: str) -> Callable[[Any], Any]:
    """A ``make`` that replaces whatever it is given by the object at ``fused``."""
    return lambda original: resolve(fused)


#: torch.nn.GELU, where torch defines it and where it exposes it (gelu=True only).
_GELU = ("torch.nn.modules.activation", "GELU")
_TORCH_GELU = ClassPatches(
    {_GELU: _replaced_by("fusedops.nn.quick_gelu:GELUAsQuickGELU")},
    importers={_GELU: ("torch.nn", "torch.nn.modules")},
)


def _quick_gelu_patches(classes: Iterable[Any] = (), gelu: bool = False, **_: Any):
    """The user's classes (as named: no origin check), then torch's GELU if asked for."""
    named = dict.fromkeys(_quick_gelu_class_locations(classes), _fused_quick_gelu)
    return [ClassPatches(named, check_origin=False), *([_TORCH_GELU] if gelu else [])]


def _quick_gelu_targets(**options: Any) -> list[Target]:
    found = [target for patches in _quick_gelu_patches(**options) for target in patches.targets()]
    if options.get("gelu"):
        warnings.warn(
            "enable_quick_gelu(gelu=True) replaces nn.GELU by QuickGELU, x*sigmoid(1.702x): "
            "this is a different function and changes the model's outputs",
            stacklevel=4,
        )
    return found


def _quick_gelu_swap(cls: type, **options: Any):
    for patches in _quick_gelu_patches(**options):
        fused = patches.swap(cls)
        if fused is not None:
            return fused
    return None


register_hook(
    Hook(
        "quick_gelu",
        targets=_quick_gelu_targets,
        module_swap=_quick_gelu_swap,
        parse_env=lambda text: {"classes": [c for c in text.split("+") if c]},
        nothing_hint="no QuickGELU class of an installed library (transformers, open_clip), "
        "no classes named and gelu=False",
    )
)


def enable_quick_gelu(classes: Iterable[Any] = (), *, gelu: bool = False) -> None:
    """Replace CLIP-style QuickGELU classes by fusedops' fused QuickGELU.

    Always covered where the library is installed: transformers' ``QuickGELUActivation`` (the
    class and its ``ACT2CLS`` / ``ACT2FN`` entries) and open_clip's ``QuickGELU``
    (``fusedops.integrations.transformers``, ``fusedops.integrations.open_clip``). classes:
    more classes to replace, as class objects or ``"module.Class"`` paths; each is swapped for
    a fused subclass of itself.
    gelu: also replace ``torch.nn.GELU`` (a different function: warns).
    """
    enable("quick_gelu", classes=tuple(classes), gelu=gelu)


def disable_quick_gelu() -> None:
    """Restore the classes ``enable_quick_gelu`` replaced."""
    disable("quick_gelu")


# LayerNorm / RMSNorm: torch.nn.LayerNorm and torch.nn.RMSNorm everywhere torch holds them by
# name (torch.nn.modules.transformer imports LayerNorm: its encoder/decoder layers build it).

_NORMALIZATION = "torch.nn.modules.normalization"

for _name, _attr, _importers in (
    ("layer_norm", "LayerNorm", ("torch.nn", "torch.nn.modules", "torch.nn.modules.transformer")),
    ("rms_norm", "RMSNorm", ("torch.nn", "torch.nn.modules")),
):
    _patches = ClassPatches(
        {(_NORMALIZATION, _attr): _replaced_by(f"fusedops.nn.layer_norm:{_attr}")},
        importers={(_NORMALIZATION, _attr): _importers},
    )
    register_hook(Hook(_name, targets=_patches.targets, module_swap=_patches.swap))


def enable_fused_layer_norm() -> None:
    """Replace ``torch.nn.LayerNorm`` (in torch.nn, torch.nn.modules,
    torch.nn.modules.normalization and torch.nn.modules.transformer) by
    ``fusedops.nn.LayerNorm``; before ``import torch``, on import."""
    enable("layer_norm")


def disable_fused_layer_norm() -> None:
    """Restore ``torch.nn.LayerNorm``."""
    disable("layer_norm")


def enable_fused_rms_norm() -> None:
    """Replace ``torch.nn.RMSNorm`` everywhere torch exposes it by ``fusedops.nn.RMSNorm``, and
    transformers' RMSNorm-family classes (``LlamaRMSNorm``, ``T5LayerNorm``, ...; the list is
    in ``fusedops/integrations/transformers/rms_norm_classes.json``) by fused subclasses;
    before their import, on import."""
    enable("rms_norm")


def disable_fused_rms_norm() -> None:
    """Restore ``torch.nn.RMSNorm``."""
    disable("rms_norm")


# Adam / AdamW / SGD: torch.optim.Adam, AdamW and SGD in both places torch exposes them. The
# fused classes subclass the originals, so isinstance checks and LR schedulers keep working.
# The adam hook replaces both classes (TorchAcc's enable_fused_adam: "Adam/AdamW"); adamw
# replaces AdamW alone. Both may be on: torch.optim.AdamW is then held by both and restored
# when the last of them is disabled (fusedops.hooks.machinery).

_ADAM = ("torch.optim.adam", "Adam", "fusedops.optim.adam:FusedAdam")
_ADAMW = ("torch.optim.adamw", "AdamW", "fusedops.optim.adam:FusedAdamW")
_SGD = ("torch.optim.sgd", "SGD", "fusedops.optim.sgd:FusedSGD")


def _optimizer_targets(*classes: tuple[str, str, str]) -> Callable[..., list[Target]]:
    """Targets replacing each (module, class, fused class) in torch.optim and its module."""
    return lambda **_: [
        Target(where, attr, _replaced_by(fused))
        for module, attr, fused in classes
        for where in ("torch.optim", module)
    ]


register_hook(Hook("adam", targets=_optimizer_targets(_ADAM, _ADAMW)))
register_hook(Hook("adamw", targets=_optimizer_targets(_ADAMW)))
register_hook(Hook("sgd", targets=_optimizer_targets(_SGD)))


def enable_fused_adam() -> None:
    """Replace ``torch.optim.Adam`` and ``torch.optim.AdamW`` (and ``torch.optim.adam.Adam``,
    ``torch.optim.adamw.AdamW``) by ``fusedops.optim.FusedAdam`` / ``FusedAdamW``; before
    ``import torch``, on import. The ``adam`` hook (``FUSEDOPS_HOOKS=adam``)."""
    enable("adam")


def disable_fused_adam() -> None:
    """Restore ``torch.optim.Adam`` and ``torch.optim.AdamW`` (AdamW stays fused while
    ``enable_fused_adamw`` holds it)."""
    disable("adam")


def enable_fused_adamw() -> None:
    """Replace ``torch.optim.AdamW`` (and ``torch.optim.adamw.AdamW``) alone by
    ``fusedops.optim.FusedAdamW``; before ``import torch``, on import. The ``adamw`` hook."""
    enable("adamw")


def disable_fused_adamw() -> None:
    """Restore ``torch.optim.AdamW`` (it stays fused while ``enable_fused_adam`` holds it)."""
    disable("adamw")


def enable_fused_sgd() -> None:
    """Replace ``torch.optim.SGD`` (and ``torch.optim.sgd.SGD``) by
    ``fusedops.optim.FusedSGD``; before ``import torch``, on import."""
    enable("sgd")


def disable_fused_sgd() -> None:
    """Restore ``torch.optim.SGD``."""
    disable("sgd")


# Swin: the model libraries' Swin layers and attentions (transformers, timm: contributed by
# their integrations) by fused subclasses built with fusedops.nn.swin.fused_subclass.


def swin_patches(classes, recognise: str, *, optional: bool = False) -> ClassPatches:
    """The Swin classes ``classes`` ((module, class) pairs), each replaced by its fused
    subclass, recognised by the ``"module:function"`` named (a class of a code shape it does not
    know is left unpatched, with the reason)."""

    def make(original):
        fused = resolve("fusedops.nn.swin:fused_subclass")(original, resolve(recognise))
        if isinstance(fused, str):
            raise Unpatched(fused)
        return fused

    return ClassPatches(dict.fromkeys(classes, make), optional=optional)


register_hook(
    Hook("swin", targets=lambda **_: [], nothing_hint="neither transformers nor timm is installed")
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


# NMS and deformable convolution: functions of torchvision and mmcv (contributed by their
# integrations).

for _name in ("nms", "dcn"):
    register_hook(
        Hook(
            _name, targets=lambda **_: [], nothing_hint="neither torchvision nor mmcv is installed"
        )
    )


def enable_fused_dcn() -> None:
    """Replace torchvision's ``deform_conv2d`` (so ``DeformConv2d`` too) and mmcv's
    ``modulated_deform_conv2d`` (so ``ModulatedDeformConv2d`` and ``ModulatedDeformConv2dPack``)
    by fusedops' deformable convolution, now or when they are imported."""
    enable("dcn")


def disable_fused_dcn() -> None:
    """Restore the deformable convolutions ``enable_fused_dcn`` replaced."""
    disable("dcn")


def enable_fused_nms() -> None:
    """Replace torchvision's ``nms`` / ``batched_nms`` (``torchvision.ops`` and
    ``torchvision.ops.boxes``) and mmcv's ``nms`` / ``soft_nms`` / ``batched_nms``
    (``mmcv.ops`` and ``mmcv.ops.nms``) by fusedops' versions, now or when they are imported
    (only the installed libraries; with neither, the hook warns that it has nothing to patch)."""
    enable("nms")


def disable_fused_nms() -> None:
    """Restore the NMS functions ``enable_fused_nms`` replaced."""
    disable("nms")

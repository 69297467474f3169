"""Hooks on torch itself and on user classes: LayerNorm, RMSNorm, Adam, AdamW, QuickGELU.

Defines the hooks (``register_hook``); the modules of other libraries (``lib_<library>.py``)
add their own classes to them with ``contribute``. Never imports torch: replacements are
resolved when a patch is applied.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from fusedops.hooks.machinery import Hook, Target, disable, enable, register_hook, resolve


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


def _quick_gelu_targets(classes: Iterable[Any] = (), gelu: bool = False, **_: Any) -> list[Target]:
    fused_subclass = lambda original: resolve("fusedops.nn.quick_gelu:fused_subclass")(original)
    targets = [Target(m, a, fused_subclass) for m, a in _quick_gelu_class_locations(classes)]
    if gelu:
        warnings.warn(
            "enable_quick_gelu(gelu=True) replaces nn.GELU by QuickGELU, x*sigmoid(1.702x): "
            "this is a different function and changes the model's outputs",
            stacklevel=4,
        )
        gelu_cls = lambda original: resolve("fusedops.nn.quick_gelu:GELUAsQuickGELU")
        targets += [Target(m, "GELU", gelu_cls) for m in _TORCH_NN_ACTIVATION_MODULES]
    return targets


def _quick_gelu_swap(cls, classes: Iterable[Any] = (), gelu: bool = False, **_: Any):
    quick_gelu_nn = importlib.import_module("fusedops.nn.quick_gelu")
    if gelu and cls is importlib.import_module("torch.nn").GELU:
        return quick_gelu_nn.GELUAsQuickGELU
    names = set(_quick_gelu_class_locations(classes))
    if (cls.__module__, cls.__qualname__) in names:
        return quick_gelu_nn.fused_subclass(cls)
    return None


_TORCH_NN_ACTIVATION_MODULES = ("torch.nn", "torch.nn.modules", "torch.nn.modules.activation")

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
    (``lib_transformers``, ``lib_open_clip``). classes: more classes to replace, as class
    objects or ``"module.Class"`` paths; each is swapped for a fused subclass of itself.
    gelu: also replace ``torch.nn.GELU`` (a different function: warns).
    """
    enable("quick_gelu", classes=tuple(classes), gelu=gelu)


def disable_quick_gelu() -> None:
    """Restore the classes ``enable_quick_gelu`` replaced."""
    disable("quick_gelu")


# LayerNorm / RMSNorm: torch.nn.LayerNorm and torch.nn.RMSNorm everywhere torch exposes them.

_TORCH_NN_NORMALIZATION_MODULES = ("torch.nn", "torch.nn.modules", "torch.nn.modules.normalization")


def _norm_targets(fused: str) -> Callable[..., list[Target]]:
    attr = fused.rpartition(":")[2]
    make = lambda original: resolve(fused)
    return lambda **_: [Target(module, attr, make) for module in _TORCH_NN_NORMALIZATION_MODULES]


def _norm_swap(fused: str) -> Callable[..., Any]:
    def swap(cls, **_: Any):
        fused_cls = resolve(fused)
        # Exactly the torch class (the fused class's base), not user subclasses of it.
        return fused_cls if cls is fused_cls.__bases__[0] else None

    return swap


for _name, _fused in (
    ("layer_norm", "fusedops.nn.layer_norm:LayerNorm"),
    ("rms_norm", "fusedops.nn.layer_norm:RMSNorm"),
):
    register_hook(Hook(_name, targets=_norm_targets(_fused), module_swap=_norm_swap(_fused)))


def enable_fused_layer_norm() -> None:
    """Replace ``torch.nn.LayerNorm`` (in torch.nn, torch.nn.modules and
    torch.nn.modules.normalization) by ``fusedops.nn.LayerNorm``; before ``import torch``, on
    import."""
    enable("layer_norm")


def disable_fused_layer_norm() -> None:
    """Restore ``torch.nn.LayerNorm``."""
    disable("layer_norm")


def enable_fused_rms_norm() -> None:
    """Replace ``torch.nn.RMSNorm`` everywhere torch exposes it by ``fusedops.nn.RMSNorm``, and
    transformers' RMSNorm-family classes (``LlamaRMSNorm``, ``T5LayerNorm``, ...; the list is
    in ``lib_transformers``) by fused subclasses; before their import, on import."""
    enable("rms_norm")


def disable_fused_rms_norm() -> None:
    """Restore ``torch.nn.RMSNorm``."""
    disable("rms_norm")


# Adam / AdamW: torch.optim.Adam and torch.optim.AdamW in both places torch exposes them. The
# fused classes subclass the originals, so isinstance checks and LR schedulers keep working.

for _name, _module, _attr, _fused in (
    ("adam", "torch.optim.adam", "Adam", "fusedops.optim.adam:FusedAdam"),
    ("adamw", "torch.optim.adamw", "AdamW", "fusedops.optim.adam:FusedAdamW"),
):
    register_hook(
        Hook(
            _name,
            targets=lambda _module=_module, _attr=_attr, _fused=_fused, **_: [
                Target(module, _attr, lambda original, _fused=_fused: resolve(_fused))
                for module in ("torch.optim", _module)
            ],
        )
    )


def enable_fused_adam() -> None:
    """Replace ``torch.optim.Adam`` (and ``torch.optim.adam.Adam``) by
    ``fusedops.optim.FusedAdam``; before ``import torch``, on import."""
    enable("adam")


def disable_fused_adam() -> None:
    """Restore ``torch.optim.Adam``."""
    disable("adam")


def enable_fused_adamw() -> None:
    """Replace ``torch.optim.AdamW`` (and ``torch.optim.adamw.AdamW``) by
    ``fusedops.optim.FusedAdamW``; before ``import torch``, on import."""
    enable("adamw")


def disable_fused_adamw() -> None:
    """Restore ``torch.optim.AdamW``."""
    disable("adamw")

"""Hooks: patch torch (or user model code) so unchanged training scripts run fused ops.

Each hook replaces named attributes (``torch.nn.LayerNorm``, ``torch.optim.Adam``, a CLIP
``QuickGELU`` class...) by a fused subclass with the same constructor and state_dict, everywhere
they are exposed, and can restore the originals::

    from fusedops import hooks
    hooks.enable_quick_gelu(classes=["open_clip.transformer.QuickGELU"])
    hooks.enabled()                          # ['quick_gelu']
    with hooks.patched("quick_gelu", classes=[MyQuickGELU]): ...
    hooks.disable_quick_gelu()

A hook enabled before its target module is imported (e.g. before ``import torch``) installs a
``sys.meta_path`` finder that applies the patch the moment that module finishes importing, so
``from torch.nn import LayerNorm`` in model code sees the fused class. Targets inside torch are
patched once the whole ``torch`` package has imported. ``FUSEDOPS_HOOKS=a,b`` (or ``all``)
enables hooks at interpreter start through the ``fusedops_hooks.pth`` file the package installs.

This module never imports torch itself; replacements are imported when a patch is applied.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

_lock = threading.RLock()


@dataclass(frozen=True)
class Target:
    """Attribute ``attr`` of module ``module`` is replaced by ``make(original)``."""

    module: str
    attr: str
    make: Callable[[Any], Any]


@dataclass
class Hook:
    """A named, reversible set of patches.

    targets(**options) -> the Targets to patch.
    module_swap(cls, **options) -> the fused class for a module instance of ``cls``, or None
    (used by ``replace_modules`` on models that are already built).
    parse_env(text) -> options, for ``FUSEDOPS_HOOKS=name:text``.
    needs_options: the hook patches nothing without options (skipped by ``all``).
    """

    name: str
    targets: Callable[..., list[Target]]
    module_swap: Callable[..., Any] | None = None
    parse_env: Callable[[str], dict] | None = None
    needs_options: bool = False
    options: dict = field(default_factory=dict)
    enabled: bool = False
    applied: list[tuple[Any, str, Any, Any]] = field(default_factory=list)


_HOOKS: dict[str, Hook] = {}
_pending: dict[str, list[tuple[Hook, Target]]] = {}  # trigger module -> patches waiting for it


def register_hook(hook: Hook) -> Hook:
    """Add ``hook`` to the registry (later issues register theirs here)."""
    _HOOKS[hook.name] = hook
    return hook


def available() -> list[str]:
    """Names of every registered hook."""
    return sorted(_HOOKS)


def enabled() -> list[str]:
    """Names of the hooks enabled now."""
    with _lock:
        return sorted(name for name, hook in _HOOKS.items() if hook.enabled)


def _get(name: str) -> Hook:
    try:
        return _HOOKS[name]
    except KeyError:
        raise ValueError(f"unknown hook {name!r}; available: {', '.join(available())}") from None


def _trigger(module: str) -> str:
    """The module whose import completes a target: all of torch for torch's own attributes."""
    return "torch" if module == "torch" or module.startswith("torch.") else module


def _imported(module: str) -> bool:
    loaded = sys.modules.get(module)
    spec = getattr(loaded, "__spec__", None)
    return loaded is not None and not getattr(spec, "_initializing", False)


def _apply(hook: Hook, target: Target) -> None:
    try:
        module = importlib.import_module(target.module)
        original = getattr(module, target.attr)
    except (ImportError, AttributeError) as exc:
        warnings.warn(
            f"fusedops hook {hook.name!r}: cannot patch {target.module}.{target.attr}: {exc}",
            stacklevel=3,
        )
        return
    if any(patched is original for _, _, _, patched in hook.applied):
        return  # this location already shows our replacement
    replacement = target.make(original)
    setattr(module, target.attr, replacement)
    hook.applied.append((module, target.attr, original, replacement))


def _apply_pending(trigger: str) -> None:
    with _lock:
        for hook, target in _pending.pop(trigger, []):
            if hook.enabled:
                _apply(hook, target)


class _LoaderWithPatches(importlib.abc.Loader):
    """Runs the real loader, then applies the patches waiting for this module."""

    def __init__(self, loader: importlib.abc.Loader, fullname: str):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _apply_pending(self._fullname)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """sys.meta_path finder that wraps the loader of modules that have patches waiting."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderWithPatches(spec.loader, fullname)
                return spec
        return None


_finder = _PatchOnImport()


def _schedule(hook: Hook, target: Target) -> None:
    trigger = _trigger(target.module)
    if _imported(trigger):
        _apply(hook, target)
        return
    _pending.setdefault(trigger, []).append((hook, target))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def enable(name: str, **options: Any) -> None:
    """Enable hook ``name`` with its options (idempotent; new options re-apply the hook)."""
    with _lock:
        hook = _get(name)
        if hook.enabled:
            if options == hook.options:
                return
            disable(name)
        targets = hook.targets(**options)  # validates options before anything changes
        hook.options, hook.enabled = dict(options), True
        for target in targets:
            _schedule(hook, target)


def disable(name: str) -> None:
    """Restore every attribute hook ``name`` patched (idempotent)."""
    with _lock:
        hook = _get(name)
        for module, attr, original, replacement in reversed(hook.applied):
            if getattr(module, attr, None) is replacement:
                setattr(module, attr, original)
        hook.applied.clear()
        for trigger in list(_pending):
            _pending[trigger] = [(h, t) for h, t in _pending[trigger] if h is not hook]
            if not _pending[trigger]:
                del _pending[trigger]
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        hook.enabled, hook.options = False, {}


@contextlib.contextmanager
def patched(*names: str, **options: Any) -> Iterator[None]:
    """Enable hooks ``names`` inside the block (with ``options``), restoring them after."""
    with _lock:
        newly = [name for name in names if not _get(name).enabled]
        for name in newly:
            enable(name, **options)
    try:
        yield
    finally:
        with _lock:
            for name in newly:
                disable(name)


def enable_from_spec(spec: str) -> list[str]:
    """Enable hooks from ``FUSEDOPS_HOOKS`` syntax: ``all`` or ``name[:value],...``."""
    names = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition(":")
        chosen = available() if name == "all" else [name]
        for each in chosen:
            hook = _get(each)
            if name == "all" and hook.needs_options:
                continue
            options = hook.parse_env(value) if (value and hook.parse_env) else {}
            enable(each, **options)
            names.append(each)
    return names


def replace_modules(model, hooks: Iterable[str] | None = None, **options: Any):
    """Swap the modules of a built ``model`` for fused subclasses, in place, keeping weights.

    Each matching submodule's class is changed to the fused subclass (parameters, buffers,
    registered hooks and the optimizer's references stay as they are). ``hooks`` names the
    hooks whose swaps apply (default: all); ``options`` go to each hook (e.g. ``classes=`` and
    ``gelu=True`` for quick_gelu). Returns ``model``.
    """
    chosen = [_get(name) for name in (available() if hooks is None else hooks)]
    for module in model.modules():
        for hook in chosen:
            if hook.module_swap is None:
                continue
            fused = hook.module_swap(type(module), **options)
            if fused is not None:
                module.__class__ = fused
                break
    return model


# --------------------------------------------------------------------------------------------
# The hooks. Each op adds its entry below; replacements are imported only when applied.


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


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


def _quick_gelu_targets(classes: Iterable[Any] = (), gelu: bool = False) -> list[Target]:
    fused_subclass = lambda original: _resolve("fusedops.nn.quick_gelu:fused_subclass")(original)
    targets = [Target(m, a, fused_subclass) for m, a in _quick_gelu_class_locations(classes)]
    if gelu:
        warnings.warn(
            "enable_quick_gelu(gelu=True) replaces nn.GELU by QuickGELU, x*sigmoid(1.702x): "
            "this is a different function and changes the model's outputs",
            stacklevel=4,
        )
        gelu_cls = lambda original: _resolve("fusedops.nn.quick_gelu:GELUAsQuickGELU")
        targets += [Target(m, "GELU", gelu_cls) for m in _TORCH_NN_ACTIVATION_MODULES]
    if not targets:
        warnings.warn(
            "enable_quick_gelu(): no classes named and gelu=False, so nothing is patched",
            stacklevel=4,
        )
    return targets


def _quick_gelu_swap(cls, classes: Iterable[Any] = (), gelu: bool = False, **_: Any):
    quick_gelu_nn = importlib.import_module("fusedops.nn.quick_gelu")
    if cls.__dict__.get("_fusedops_fused", False):
        return None
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
        needs_options=True,
    )
)


def enable_quick_gelu(classes: Iterable[Any] = (), *, gelu: bool = False) -> None:
    """Replace CLIP-style QuickGELU classes by fusedops' fused QuickGELU.

    classes: the classes to replace, as class objects or ``"module.Class"`` paths (e.g.
    ``"open_clip.transformer.QuickGELU"``); each is swapped for a fused subclass of itself.
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
    make = lambda original: _resolve(fused)
    return lambda: [Target(module, attr, make) for module in _TORCH_NN_NORMALIZATION_MODULES]


def _norm_swap(fused: str) -> Callable[..., Any]:
    def swap(cls, **_: Any):
        fused_cls = _resolve(fused)
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
    """Replace ``torch.nn.RMSNorm`` everywhere torch exposes it by ``fusedops.nn.RMSNorm``."""
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
            targets=lambda _module=_module, _attr=_attr, _fused=_fused: [
                Target(module, _attr, lambda original, _fused=_fused: _resolve(_fused))
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

"""The hooks machinery: named, reversible sets of patches, applied now or at import.

A ``Hook`` replaces attributes (``Target``: module, attribute, how to make the replacement) and
restores them on ``disable``. A hook enabled before its target module is imported (e.g. before
``import torch``) installs a ``sys.meta_path`` finder that applies the patch the moment that
module finishes importing, so ``from torch.nn import LayerNorm`` in model code sees the fused
class. Targets inside torch are patched once the whole ``torch`` package has imported.

One hook may patch several libraries: the module of each library (``lib_<library>.py``) adds
its targets and module swaps to the hook with ``contribute``. This module never imports torch;
replacements are imported when a patch is applied.
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
    contributions: (targets, module_swap) pairs other libraries' modules added (``contribute``);
    their targets are patched with the hook's own, their swaps tried after its own.
    """

    name: str
    targets: Callable[..., list[Target]]
    module_swap: Callable[..., Any] | None = None
    parse_env: Callable[[str], dict] | None = None
    needs_options: bool = False
    options: dict = field(default_factory=dict)
    enabled: bool = False
    applied: list[tuple[Any, str, Any, Any]] = field(default_factory=list)
    contributions: list[tuple[Callable | None, Callable | None]] = field(default_factory=list)

    def all_targets(self, **options: Any) -> list[Target]:
        """The hook's targets for ``options``, then every contribution's."""
        found = list(self.targets(**options))
        for targets, _ in self.contributions:
            if targets is not None:
                found += targets(**options)
        return found

    def swap_for(self, cls: type, **options: Any) -> Any:
        """The fused class for a module of class ``cls`` (own swap first), or None."""
        for swap in (self.module_swap, *(s for _, s in self.contributions)):
            fused = swap(cls, **options) if swap is not None else None
            if fused is not None:
                return fused
        return None


_HOOKS: dict[str, Hook] = {}
_pending: dict[str, list[tuple[Hook, Target]]] = {}  # trigger module -> patches waiting for it


def register_hook(hook: Hook) -> Hook:
    """Add ``hook`` to the registry (later issues register theirs here)."""
    _HOOKS[hook.name] = hook
    return hook


def contribute(
    name: str,
    targets: Callable[..., list[Target]] | None = None,
    module_swap: Callable[..., Any] | None = None,
) -> None:
    """Add a library's ``targets(**options)`` and ``module_swap(cls, **options)`` to hook
    ``name`` (both take the hook's options and ignore the ones they do not use)."""
    _get(name).contributions.append((targets, module_swap))


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
    for _, _, first_original, patched in hook.applied:
        if patched is original:  # already our replacement, bound here from a patched location
            hook.applied.append((module, target.attr, first_original, patched))  # restore it too
            return
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
        targets = hook.all_targets(**options)  # validates options before anything changes
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
            fused = hook.swap_for(type(module), **options)
            if fused is not None:
                module.__class__ = fused
                break
    return model


def resolve(dotted: str) -> Any:
    """The object at ``"module:attr"`` (imports the module)."""
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)

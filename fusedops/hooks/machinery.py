"""The hooks machinery: named, reversible sets of patches, applied now or at import.

A ``Hook`` replaces module attributes, or entries of a mapping held by a module (``Target``:
module, attribute, optional key, how to make the replacement; e.g. transformers'
``ACT2CLS["quick_gelu"]``), and restores them on ``disable``. A hook enabled before its target
module is imported (e.g. before ``import torch``) installs a ``sys.meta_path`` finder that
applies the patch the moment that module finishes importing, so ``from torch.nn import
LayerNorm`` in model code sees the fused class. Targets inside torch are patched once the
whole ``torch`` package has imported.

One hook may patch several libraries: the hooks module of each library
(``fusedops/integrations/<library>/hooks.py``) adds its targets and module swaps to the hook
with ``contribute`` (for an installed library only). A list of classes is written once, as a
``ClassPatches``: the hook's targets and the module swap ``replace_modules`` uses on built
models. This module never imports torch; replacements are imported when a patch is applied.

Never a silent no-op: ``report()`` / ``state()`` say what each hook patched, what waits for an
import and what it left unpatched (a ``make`` that raises ``Unpatched``: a class of a code shape
fusedops does not know, a listed name bound to another class), with a warning; a named target
that does not exist warns; a hook with nothing to patch warns; ``replace_modules`` counts (and,
verbose, prints) what it swapped and ``unfused(model)`` lists the modules a hook knows that are
not fused. A hook never fails the import it patches: a replacement that cannot be made is a
warning naming the hook and the location.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

_lock = threading.RLock()
_log = logging.getLogger(__package__)  # "fusedops.hooks"


@dataclass(frozen=True)
class Target:
    """Attribute ``attr`` of module ``module`` is replaced by ``make(original)``; with ``key``,
    the entry ``key`` of the mapping at ``module.attr`` is (read without the mapping's own
    ``__getitem__``, which e.g. transformers' ``ACT2FN`` overrides to instantiate).
    optional: a missing attribute or key is skipped without a warning (a class some versions
    of a library do not have)."""

    module: str
    attr: str
    make: Callable[[Any], Any]
    key: Any = None
    optional: bool = False

    @property
    def location(self) -> str:
        """``module.attr`` or ``module.attr[key]``."""
        where = f"{self.module}.{self.attr}"
        return where if self.key is None else f"{where}[{self.key!r}]"


class Unpatched(Exception):  # noqa: N818 - an outcome, not an error
    """Raised by a ``Target.make`` to leave its location as it is; the message says why (e.g.
    a class of a code shape fusedops does not know). The hook warns and lists the location as
    left unpatched (``state()`` / ``report()``)."""


def _read_entry(mapping: Any, key: Any) -> Any:
    return dict.__getitem__(mapping, key) if isinstance(mapping, dict) else mapping[key]


@dataclass
class _Patch:
    """One applied patch: ``holder.slot`` (``holder[slot]`` for an entry) now holds
    ``replacement`` instead of ``original``."""

    location: str
    holder: Any
    slot: Any
    entry: bool
    original: Any
    replacement: Any

    def current(self) -> Any:
        if self.entry:
            return _read_entry(self.holder, self.slot) if self.slot in self.holder else None
        return getattr(self.holder, self.slot, None)

    def write(self, value: Any) -> None:
        if self.entry:
            self.holder[self.slot] = value
        else:
            setattr(self.holder, self.slot, value)


@dataclass
class Hook:
    """A named, reversible set of patches.

    targets(**options) -> the Targets to patch.
    module_swap(cls, **options) -> the fused class for a module instance of ``cls``, or None
    (used by ``replace_modules`` on models that are already built).
    parse_env(text) -> options, for ``FUSEDOPS_HOOKS=name:text``.
    needs_options: the hook patches nothing without options (skipped by ``all``).
    nothing_hint: why the hook may find nothing to patch (in the warning it gives then).
    contributions: (targets, module_swap, package) triples other libraries' modules added
    (``contribute``); their targets are patched with the hook's own (only while ``package`` is
    installed), their swaps tried after its own.
    Every ``targets`` and ``module_swap`` takes the hook's options as keywords and ignores the
    ones it does not use (``patched(*names, **options)`` passes the same options to each hook).
    """

    name: str
    targets: Callable[..., list[Target]]
    module_swap: Callable[..., Any] | None = None
    parse_env: Callable[[str], dict] | None = None
    needs_options: bool = False
    nothing_hint: str = ""
    options: dict = field(default_factory=dict)
    enabled: bool = False
    applied: list[_Patch] = field(default_factory=list)
    unpatched: list[str] = field(default_factory=list)  # "location: reason"
    contributions: list[tuple[Callable | None, Callable | None, str | None]] = field(
        default_factory=list
    )

    def all_targets(self, **options: Any) -> list[Target]:
        """The hook's targets for ``options``, then every contribution's whose library is
        installed."""
        found = list(self.targets(**options))
        for targets, _, package in self.contributions:
            if targets is not None and (package is None or installed(package)):
                found += targets(**options)
        return found

    def swap_for(self, cls: type, **options: Any) -> Any:
        """The fused class for a module of class ``cls`` (own swap first), or None (also for
        a class that is fused already)."""
        if cls.__dict__.get("_fusedops_fused", False):
            return None
        for swap in (self.module_swap, *(s for _, s, _ in self.contributions)):
            fused = swap(cls, **options) if swap is not None else None
            if fused is not None:
                return fused
        return None


@dataclass(frozen=True)
class ClassPatches:
    """One list of classes as a hook's targets and its module swap (``targets`` / ``swap``).

    classes: ``{(module, qualname): make}``, each class named by the module that defines it;
    ``make(original)`` returns the fused class or raises ``Unpatched``.
    importers: ``{(module, qualname): (modules...)}``: modules that import the class by name,
    patched too (a module imported before the hook was enabled keeps its own reference).
    optional: a missing class is skipped without a warning (one some versions lack).
    check_origin: a location must hold the class defined there (its ``__module__`` and
    ``__qualname__``); a name bound to another class (transformers 4.x's ``T5LayerNorm =
    FusedRMSNorm`` where apex is installed) is left unpatched with a warning. Off for classes
    a user names, which may be re-exported.

    ``swap(cls)`` is the fused class for a module of exactly a listed class (not a subclass;
    None for one already fused, or one ``make`` refuses, with a warning).
    """

    classes: dict[tuple[str, str], Callable[[type], type]]
    importers: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    optional: bool = False
    check_origin: bool = True

    def targets(self, **_: Any) -> list[Target]:
        """One target per listed class, then one per module importing it."""
        found = []
        for (module, qualname), make in self.classes.items():
            checked = self._checked(module, qualname, make)
            found.append(Target(module, qualname, checked, optional=self.optional))
            for importer in self.importers.get((module, qualname), ()):
                found.append(Target(importer, qualname, checked, optional=True))
        return found

    def swap(self, cls: type, **_: Any) -> Any:
        """The fused class for a module of class ``cls``, or None."""
        make = self.classes.get((cls.__module__, cls.__qualname__))
        if make is None or cls.__dict__.get("_fusedops_fused", False):
            return None
        try:
            fused = make(cls)
        except Unpatched as reason:
            warnings.warn(f"fusedops: {_qualified(cls)} left unfused: {reason}", stacklevel=4)
            return None
        return None if fused is cls else fused

    def _checked(self, module: str, qualname: str, make: Callable) -> Callable:
        if not self.check_origin:
            return make

        def checked(original):
            found = (getattr(original, "__module__", None), getattr(original, "__qualname__", None))
            if found != (module, qualname):
                raise Unpatched(f"it holds {found[0]}.{found[1]}, not the class {module} defines")
            return make(original)

        return checked


_HOOKS: dict[str, Hook] = {}
_pending: dict[str, list[tuple[Hook, Target]]] = {}  # trigger module -> patches waiting for it
_holders: dict[str, int] = {}  # hook name -> patched() blocks inside which it is enabled
_enabled_by_patched: set[str] = set()  # hooks a patched() block enabled (it disables them)


def register_hook(hook: Hook) -> Hook:
    """Add ``hook`` to the registry (later issues register theirs here)."""
    _HOOKS[hook.name] = hook
    return hook


def contribute(
    name: str,
    targets: Callable[..., list[Target]] | None = None,
    module_swap: Callable[..., Any] | None = None,
    *,
    package: str | None = None,
) -> None:
    """Add a library's ``targets(**options)`` and ``module_swap(cls, **options)`` to hook
    ``name`` (both take the hook's options and ignore the ones they do not use). package: the
    targets count only while this top-level package is installed (``installed``)."""
    _get(name).contributions.append((targets, module_swap, package))


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


def _cannot_patch(hook: Hook, target: Target, exc: BaseException) -> None:
    warnings.warn(
        f"fusedops hook {hook.name!r}: cannot patch {target.location}: {type(exc).__name__}: {exc}",
        stacklevel=4,
    )


def _apply(hook: Hook, target: Target) -> None:
    """Patch one target now. Never raises for the target's sake (a hook must not fail the
    import it runs in): what goes wrong is a warning naming the hook and the location."""
    try:
        module = importlib.import_module(target.module)
        holder, slot = module, target.attr
        if target.key is not None:
            holder, slot = getattr(module, target.attr), target.key
            original = _read_entry(holder, slot)
        else:
            original = getattr(module, target.attr)
    except (ImportError, AttributeError, KeyError) as exc:
        if not target.optional:
            _cannot_patch(hook, target, exc)
        return
    except Exception as exc:  # a module that fails to import for reasons of its own
        _cannot_patch(hook, target, exc)
        return
    entry = target.key is not None
    earlier = next((p for p in hook.applied if p.replacement is original), None)
    if earlier is not None:
        # This location already shows our replacement (a module that imported a patched name):
        # recorded with the true original, so that disable restores it here too.
        hook.applied.append(
            _Patch(target.location, holder, slot, entry, earlier.original, original)
        )
        return
    shared = _shared_with(hook, target, holder, slot, original)
    if shared is not None:
        # Another enabled hook put here the replacement this hook makes (adam and adamw both
        # patch torch.optim.AdamW): the location is held by both, recorded with the true
        # original; disable restores it when the last hook holding it lets go.
        hook.applied.append(_Patch(target.location, holder, slot, entry, shared, original))
        return
    try:
        patch = _Patch(target.location, holder, slot, entry, original, target.make(original))
        if patch.replacement is original:
            raise Unpatched("no replacement for it")
        patch.write(patch.replacement)
    except Unpatched as reason:
        hook.unpatched.append(f"{target.location}: {reason}")
        warnings.warn(
            f"fusedops hook {hook.name!r}: {target.location} left unpatched: {reason}",
            stacklevel=3,
        )
        return
    except Exception as exc:
        _cannot_patch(hook, target, exc)
        return
    hook.applied.append(patch)


def _holders_of(holder: Any, slot: Any, entry: bool, replacement: Any, but: Hook) -> list:
    """The patches of enabled hooks other than ``but`` that put ``replacement`` at this
    location."""
    return [
        patch
        for other in _HOOKS.values()
        if other is not but and other.enabled
        for patch in other.applied
        if patch.holder is holder
        and patch.slot == slot
        and patch.entry == entry
        and patch.replacement is replacement
    ]


def _shared_with(hook: Hook, target: Target, holder: Any, slot: Any, current: Any) -> Any:
    """The true original of ``target``'s location where it shows ``current``, a replacement
    another enabled hook made there that ``target`` would make too; else None."""
    entry = target.key is not None
    for patch in _holders_of(holder, slot, entry, current, but=hook):
        try:
            same = target.make(patch.original) is current
        except Exception:  # a make that refuses: not shared, the target is patched as usual
            same = False
        if same:
            return patch.original
    return None


def _apply_pending(trigger: str) -> None:
    """Apply every patch waiting for ``trigger``, each on its own: one that raises (a warning
    turned into an error) does not keep the others from being applied; the first such error
    is raised after all of them."""
    failures = []
    with _lock:
        for hook, target in _pending.pop(trigger, []):
            if hook.enabled:
                try:
                    _apply(hook, target)
                except Exception as exc:
                    failures.append(exc)
    if failures:
        raise failures[0]


def _sweep() -> None:
    """Apply the patches whose trigger module has finished importing without its loader
    applying them (the module was importing in another thread when the hook was enabled)."""
    with _lock:
        for trigger in [t for t in _pending if _imported(t)]:
            _apply_pending(trigger)


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
        if _lock.acquire(blocking=False):  # never wait here: another thread may hold it
            try:
                _sweep()
            finally:
                _lock.release()
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


def installed(package: str) -> bool:
    """Whether the top-level package ``package`` is imported or can be found now (without
    importing it): the library modules contribute targets only for installed libraries."""
    try:
        return package in sys.modules or importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _schedule(hook: Hook, target: Target, check_importable: bool) -> None:
    trigger = _trigger(target.module)
    if _imported(trigger):
        _apply(hook, target)
        return
    top = target.module.partition(".")[0]
    if check_importable and not target.optional and not installed(top):
        warnings.warn(
            f"fusedops hook {hook.name!r}: cannot patch {target.location}: no module named "
            f"{top!r} can be imported now (the patch waits for an import of it)",
            stacklevel=4,
        )
    _pending.setdefault(trigger, []).append((hook, target))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def enable(name: str, **options: Any) -> None:
    """Enable hook ``name`` with its options (idempotent; new options re-apply the hook).

    Warns when the hook has nothing to patch, and when a target's package cannot be found."""
    _enable(name, options, check_importable=True)


def _enable(name: str, options: dict, check_importable: bool) -> None:
    with _lock:
        hook = _get(name)
        if hook.enabled and options == hook.options:
            return
        targets = hook.all_targets(**options)  # validates options before anything changes
        if hook.enabled:
            disable(name)
        if not targets:
            hint = f": {hook.nothing_hint}" if hook.nothing_hint else ""
            warnings.warn(f"fusedops hook {name!r} has nothing to patch{hint}", stacklevel=4)
        hook.options, hook.enabled = dict(options), True
        for target in targets:
            _schedule(hook, target, check_importable)


def disable(name: str) -> None:
    """Restore every attribute hook ``name`` patched (idempotent).

    Only the patched locations are restored: what captured a replacement while the hook was
    on keeps it (modules already built, a class used as a default argument, a subclass defined
    then, a ``functools.partial``, ``from torch.nn import LayerNorm`` in a module imported
    then). A location another enabled hook also holds (the same replacement, e.g.
    ``torch.optim.AdamW`` under both adam and adamw) keeps it until that hook is disabled."""
    with _lock:
        hook = _get(name)
        for patch in reversed(hook.applied):
            held = _holders_of(patch.holder, patch.slot, patch.entry, patch.replacement, hook)
            if patch.current() is patch.replacement and not held:
                patch.write(patch.original)
        hook.applied.clear()
        hook.unpatched.clear()
        for trigger in list(_pending):
            _pending[trigger] = [(h, t) for h, t in _pending[trigger] if h is not hook]
            if not _pending[trigger]:
                del _pending[trigger]
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        hook.enabled, hook.options = False, {}


@contextlib.contextmanager
def patched(*names: str, **options: Any) -> Iterator[None]:
    """Enable hooks ``names`` inside the block, restoring them after.

    ``options`` go to every hook named (each ignores the ones it does not use). A hook that is
    enabled already when the block starts keeps its options. Blocks may nest or overlap (other
    threads, generators): a hook a block enabled is disabled when the last block holding it
    exits, not before; one enabled by ``enable()`` before any block stays enabled."""
    held: list[str] = []
    try:
        with _lock:
            for name in dict.fromkeys(names):
                if not _get(name).enabled:
                    enable(name, **options)
                    _enabled_by_patched.add(name)
                _holders[name] = _holders.get(name, 0) + 1
                held.append(name)
        yield
    finally:
        with _lock:
            for name in reversed(held):
                _holders[name] -= 1
                if _holders[name] == 0:
                    del _holders[name]
                    if name in _enabled_by_patched:
                        _enabled_by_patched.discard(name)
                        disable(name)


def enable_from_spec(spec: str, *, at_startup: bool = False) -> list[str]:
    """Enable hooks from ``FUSEDOPS_HOOKS`` syntax: ``all`` or ``name[:value],...``.

    ``all`` enables every hook that has something to patch with its default options (a hook
    whose libraries are not installed is left disabled, without a warning). at_startup: called
    while the interpreter starts (sys.path is not final: no importability warnings)."""
    names = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition(":")
        chosen = available() if name == "all" else [name]
        for each in chosen:
            hook = _get(each)
            if name == "all" and (hook.needs_options or not hook.all_targets()):
                continue
            options = hook.parse_env(value) if (value and hook.parse_env) else {}
            _enable(each, options, check_importable=not at_startup)
            names.append(each)
    return names


def state() -> dict[str, dict[str, Any]]:
    """Per registered hook: ``{"enabled": bool, "patched": [locations], "waiting":
    [locations], "unpatched": ["location: reason"]}``; a location is ``module.attr`` or
    ``module.attr[key]``, waiting ones are patched when their module is imported, unpatched ones
    were found but left as they are (e.g. a class of a code shape fusedops does not know)."""
    with _lock:
        _sweep()
        waiting: dict[str, list[str]] = {name: [] for name in _HOOKS}
        for entries in _pending.values():
            for hook, target in entries:
                waiting[hook.name].append(target.location)
        return {
            name: {
                "enabled": hook.enabled,
                "patched": [patch.location for patch in hook.applied],
                "waiting": waiting[name],
                "unpatched": list(hook.unpatched),
            }
            for name, hook in sorted(_HOOKS.items())
        }


def report(verbose: bool = False) -> str:
    """What each hook patched and what waits for an import, as text (``python -m fusedops
    info`` prints it when hooks are enabled). verbose: list every waiting location, not only
    a count per package past eight of them."""
    lines = []
    for name, hook_state in state().items():
        if not hook_state["enabled"]:
            lines.append(f"{name}: not enabled")
            continue
        patched, waiting = hook_state["patched"], hook_state["waiting"]
        unpatched = hook_state["unpatched"]
        counts = f"{len(patched)} patched, {len(waiting)} waiting for import"
        lines.append(f"{name}: enabled, {counts}, {len(unpatched)} left unpatched")
        lines += [f"  patched {location}" for location in patched]
        lines += [f"  left unpatched {location}" for location in unpatched]
        if verbose or len(waiting) <= 8:
            lines += [f"  waiting {location}" for location in waiting]
        else:
            packages: dict[str, int] = {}
            for location in waiting:
                top = location.partition(".")[0]
                packages[top] = packages.get(top, 0) + 1
            counts = ", ".join(f"{top}: {n}" for top, n in sorted(packages.items()))
            lines.append(f"  waiting: {counts} (report(verbose=True) lists them)")
    return "\n".join(lines)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def replace_modules(
    model,
    hooks: Iterable[str] | None = None,
    *,
    verbose: bool = False,
    counts: dict[str, int] | None = None,
    **options: Any,
):
    """Swap the modules of a built ``model`` for fused subclasses, in place, keeping weights.

    Each matching submodule's class is changed to the fused subclass (parameters, buffers,
    registered hooks and the optimizer's references stay as they are). ``hooks`` names the
    hooks whose swaps apply (default: all); ``options`` go to each hook (e.g. ``classes=`` and
    ``gelu=True`` for quick_gelu). Returns ``model`` (``model = replace_modules(model)`` works).
    A module whose ``forward`` is set on the instance (accelerate's hooks: a wrapper calling
    the class's forward bound as ``_old_forward``) gets that bound forward rebound to the fused
    class's; any other instance-level forward leaves the module as it is, with a warning (not
    counted; ``unfused`` lists it).

    How many modules of each class were swapped (``{"module.Class": n}``, the class before the
    swap) is logged on the ``fusedops.hooks`` logger at INFO, printed when ``verbose``, and
    added to ``counts`` when a dict is passed.
    """
    swapped: dict[str, int] = {}
    for module, fused in module_swaps(model, hooks, **options):
        name = _qualified(type(module))
        if _swap_class(module, fused):
            swapped[name] = swapped.get(name, 0) + 1
    summary = ", ".join(f"{n} x {name}" for name, n in sorted(swapped.items())) or "nothing"
    _log.info("replace_modules swapped %s", summary)
    if verbose:
        print(f"fusedops.replace_modules swapped {summary}")
    if counts is not None:
        for name, n in swapped.items():
            counts[name] = counts.get(name, 0) + n
    return model


def module_swaps(model, hooks: Iterable[str] | None = None, **options: Any) -> list:
    """What ``replace_modules(model, hooks, **options)`` would swap, without swapping:
    ``(module, fused class)`` for each submodule of ``model`` (itself included) that a hook
    covers, in ``model.modules()`` order."""
    chosen = [_get(name) for name in (available() if hooks is None else hooks)]
    found = []
    for module in model.modules():
        for hook in chosen:
            fused = hook.swap_for(type(module), **options)
            if fused is not None:
                found.append((module, fused))
                break
    return found


def _swap_class(module, fused: type) -> bool:
    """``module.__class__ = fused``, keeping a forward set on the instance on the fused code;
    False (and a warning, the module unchanged) where that cannot be done."""
    original = type(module)
    if "forward" in module.__dict__ and fused.forward is not original.forward:
        bound = module.__dict__.get("_old_forward")
        if getattr(bound, "__self__", None) is not module or (
            getattr(bound, "__func__", None) is not original.forward
        ):
            warnings.warn(
                f"fusedops.replace_modules: a {_qualified(original)} module left unfused: its "
                "forward is set on the instance (not as accelerate's hooks set it, over the "
                "class's forward bound as _old_forward), so a fused class would not run",
                stacklevel=3,
            )
            return False
        module._old_forward = types.MethodType(fused.forward, module)
    module.__class__ = fused
    return True


def unfused(model, hooks: Iterable[str] | None = None, **options: Any) -> dict[str, int]:
    """``{"module.Class": n}`` of the modules of ``model`` that a hook knows (``hooks``,
    default all, with ``options`` as for replace_modules) but that are not fused: empty when
    everything the hooks cover runs fused code."""
    chosen = [_get(name) for name in (available() if hooks is None else hooks)]
    found: dict[str, int] = {}
    for module in model.modules():
        if any(hook.swap_for(type(module), **options) is not None for hook in chosen):
            name = _qualified(type(module))
            found[name] = found.get(name, 0) + 1
    return found


def resolve(dotted: str) -> Any:
    """The object at ``"module:attr"`` (imports the module)."""
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)

"""The one dispatch rule of fusedops.

Every op registers itself here (``register_op``) and asks ``select`` for an implementation each
time it runs. Backends are registered objects (``registry.Backend``; the built-in four in
``builtin.py``, third parties through ``register_backend`` or the ``fusedops.backends`` entry
points). The rule, in order:

1. An explicit choice wins: the op's ``backend=`` argument, then ``with use_backend(...)``, then
   the ``FUSEDOPS_BACKEND`` environment variable. If the chosen backend cannot take the inputs,
   ``BackendUnavailableError`` lists its reasons (the op's ``unsupported_reasons`` among them).
2. Else the kernel backends (``Pick.VERIFIED``) whose devices hold the main tensor, in the op's
   preference order: the first one that has **passed the GPU suite at its current sources**
   (``gpu_verified``; the table is ``fusedops/kernels/verified.json``), is installed/built and
   has no reason to refuse these inputs (device, dtype, the op's ``unsupported_reasons``).
   ``FUSEDOPS_UNVERIFIED=1`` lets unverified kernels into this automatic pick; otherwise
   skipping one says so once per op in a warning.
3. Otherwise the fallback (``Pick.FALLBACK``: ``native``, the op written with PyTorch's own
   ops, correct and unfused, never slower than the code the op replaces; an op without a native
   namespace uses its reference there).

A backend that runs only when forced (``Pick.FORCED``: the ``reference``, the tests' oracle) is
never picked automatically. ``candidates(op, *tensors)`` lists what the automatic rule may run
on given inputs, with the reasons for the rest. The rule below names no backend: it reads
what each registered one declares (``tests/test_backends.py`` checks).

An implementation is a namespace with the op's functions (``forward``, ``backward``, ...), the
same names and signatures for every backend. Nothing here imports triton or initialises CUDA;
a backend's module is imported the first time it is selected.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from fusedops._env import getenv
from fusedops.dispatch import builtin  # noqa: F401  (registers the built-in backends)
from fusedops.dispatch.op_table import _OPS, KERNEL_DTYPES, Op, register_op
from fusedops.dispatch.registry import (
    _BACKENDS,
    ENTRY_POINT_GROUP,
    Backend,
    BackendUnavailableError,
    Pick,
    Registration,
    _lock,
    backends,
    get_backend,
    is_kernel,
    load_plugins,
    register_backend,
)
from fusedops.kernels import verified

__all__ = [
    "ENTRY_POINT_GROUP",
    "KERNEL_DTYPES",
    "Backend",
    "BackendUnavailableError",
    "Candidates",
    "Op",
    "Pick",
    "Registration",
    "availability",
    "backend_names",
    "backends",
    "candidates",
    "get_backend",
    "getenv",
    "gpu_verified",
    "implementation",
    "is_kernel",
    "kernel_backend_names",
    "last_used",
    "observing",
    "pick",
    "register_backend",
    "register_op",
    "registered_ops",
    "requested",
    "select",
    "select_name",
    "source_files",
    "use_backend",
    "verified_entry",
]

_forced_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fusedops_backend", default=None
)

#: The backend each op ran on last (op name -> backend name); read by the demo and `info`.
last_used: dict[str, str] = {}


def registered_ops() -> dict[str, Op]:
    """All registered ops by name (ops register when their module is imported)."""
    return dict(_OPS)


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, in registration order."""
    return tuple(backend.name for backend in backends())


def kernel_backend_names() -> tuple[str, ...]:
    """The names of the registered kernel backends (``Pick.VERIFIED``)."""
    return tuple(backend.name for backend in backends() if backend.kernel)


def _validate_name(backend: str, source: str) -> str:
    if backend not in _BACKENDS:
        load_plugins()
        if backend not in _BACKENDS:
            raise ValueError(
                f"{source}: unknown backend {backend!r}; choose one of {backend_names()}"
            )
    return backend


def requested(backend: str | None = None) -> str | None:
    """The explicit backend choice in force: ``backend``, else use_backend, else the env var."""
    if backend is not None:
        return _validate_name(backend, "backend")
    forced = _forced_backend.get()
    if forced is not None:
        return forced
    env = getenv("FUSEDOPS_BACKEND", "").strip()
    return _validate_name(env, "FUSEDOPS_BACKEND") if env else None


@contextlib.contextmanager
def use_backend(backend: str | None) -> Iterator[None]:
    """Force every fusedops op inside the block onto ``backend`` (None restores automatic)."""
    if backend is not None:
        _validate_name(backend, "use_backend")
    token = _forced_backend.set(backend)
    try:
        yield
    finally:
        _forced_backend.reset(token)


def allow_unverified() -> bool:
    """True when ``FUSEDOPS_UNVERIFIED=1`` lets kernels not verified on a GPU be picked
    automatically."""
    return getenv("FUSEDOPS_UNVERIFIED", "0").strip() == "1"


# ------------------------------------------------------------------------------------------
# GPU verification


def source_files(name: str, backend: str) -> tuple:
    """The files whose hash gates the GPU verification of op ``name``'s ``backend`` kernel
    (the backend's ``source_files``; empty where it has nothing to verify)."""
    op = _OPS[name]
    key = ("files", backend)
    files = op._cache.get(key)
    if files is None:
        files = tuple(get_backend(backend).source_files(op))
        op._cache[key] = files
    return files


def verified_entry(name: str, backend: str) -> dict | None:
    """The GPU-verified record of op ``name``'s ``backend`` kernel (gpu, date, commit, evidence)
    while its sources still match the ones that passed; None otherwise."""
    cache = _OPS[name]._cache
    key = ("sources", backend)
    digest = cache.get(key)
    if digest is None:
        files = source_files(name, backend)
        digest = cache[key] = verified.sources_hash(files) if files else ""
    return verified.entry(name, backend, digest)


def gpu_verified(name: str, backend: str) -> bool:
    """True when op ``name``'s ``backend`` kernel passed the GPU suite at its current sources."""
    return verified_entry(name, backend) is not None


_warned_unverified: set[str] = set()


def _warn_unverified(name: str, skipped: list[str], fallback: Backend | None) -> None:
    if name in _warned_unverified:
        return
    _warned_unverified.add(name)
    kernels = " and ".join(skipped)
    instead = f", so {fallback.instead}" if fallback is not None else ""
    warnings.warn(
        f"fusedops.{name}: the {kernels} kernel has not passed the GPU test suite at its "
        f"current sources{instead}. Set "
        "FUSEDOPS_UNVERIFIED=1 to pick unverified kernels, or force one with backend=..., "
        "use_backend(...) or FUSEDOPS_BACKEND.",
        RuntimeWarning,
        stacklevel=3,
    )


# ------------------------------------------------------------------------------------------
# The rule


def _on_devices(devices: tuple[str, ...]) -> Callable[[Any], bool] | None:
    """A test of whether a tensor is on one of ``devices`` (None: any device will do), through
    ``Tensor.is_<type>`` where torch has one (``device.type`` costs microseconds a call)."""
    if not devices:
        return None
    tests = [
        operator.attrgetter(f"is_{device}")
        if hasattr(torch.Tensor, f"is_{device}")
        else (lambda t, device=device: t.device.type == device)
        for device in devices
    ]
    if len(tests) == 1:
        return tests[0]
    return lambda t: any(test(t) for test in tests)


class _Plan:
    """What the automatic rule tries for one op, derived from the backend table."""

    __slots__ = (
        "kernels",
        "fallbacks",
        "first_fallback",
        "elsewhere",
        "first_refuse",
        "first_name",
    )

    def __init__(self, kernels, fallbacks):
        #: the kernels in preference order, in runs of the same devices: (their device test,
        #: None for any device; the run)
        self.kernels: tuple[tuple[Callable[[Any], bool] | None, tuple[Backend, ...]], ...]
        self.kernels = kernels
        #: the fallbacks in order, each with its refusal: None where it takes every input,
        #: else ``refuse(*tensors) -> reasons``
        self.fallbacks: tuple[tuple[Backend, Callable[..., list[str]] | None], ...]
        self.fallbacks = fallbacks
        #: the first fallback (its ``instead`` for the unverified warning), or None
        self.first_fallback = fallbacks[0][0] if fallbacks else None
        # The common call in fewer steps: where every kernel takes the same devices (or there
        # is none), a tensor on none of them (``elsewhere(main)`` is true on a kernel's device)
        # gets the first fallback unless it refuses (``first_refuse``, None: it refuses
        # nothing; ``first_name``).
        tests = {test for test, _ in kernels}
        self.elsewhere = None
        self.first_refuse, self.first_name = fallbacks[0][1] if fallbacks else None, None
        if len(tests) <= 1 and None not in tests and fallbacks:
            self.elsewhere = tests.pop() if tests else _never
            self.first_name = fallbacks[0][0].name


def _reasons_of(reasons: Callable, op: Op, *tensors: Any) -> list[str]:
    return reasons(op, tensors)


def _forced_refusal(backend: Backend, op: Op) -> Callable[[Op, Sequence], list[str]]:
    """``backend.reasons`` for a forced call of ``op``, as ``_refusal`` trims it."""
    refuse = _refusal(backend, op)
    if refuse is None:
        return _nothing
    if isinstance(refuse, functools.partial) and refuse.func is _reasons_of:
        return backend.reasons
    return lambda op, tensors: refuse(*tensors)


def _never(main: Any) -> bool:
    return False


def _nothing(op: Op, tensors: Sequence) -> list[str]:
    return []


_OVERRIDABLE = ("reasons", "unavailable", "input_reasons", "op_reasons")


def _refusal(backend: Backend, op: Op) -> Callable[..., list[str]] | None:
    """``backend.reasons`` for ``op`` as ``refuse(*tensors)``, without the calls that can only
    answer "none" (a backend declaring no devices and overriding none of the reasons: only the
    op's own limits), or None where it refuses nothing."""
    cls = type(backend)
    plain = not backend.devices and all(
        getattr(cls, name) is getattr(Backend, name) and name not in vars(backend)
        for name in _OVERRIDABLE
    )
    if not plain:
        return functools.partial(_reasons_of, backend.reasons, op)
    if op.unsupported_reasons is None:
        return None
    return functools.partial(op.unsupported_reasons, backend.asks_as or backend.name)


def _plan(op: Op) -> _Plan:
    plan = op._plan
    if plan is not None:
        return plan
    with _lock:
        registered = backends()
        ranked = [(b.position(op), i) for i, b in enumerate(registered) if b.kernel]
        runs: list[tuple[tuple[str, ...], list[Backend]]] = []
        for _, i in sorted(r for r in ranked if r[0] is not None):
            kernel = registered[i]
            if runs and runs[-1][0] == kernel.devices:
                runs[-1][1].append(kernel)
            else:
                runs.append((kernel.devices, [kernel]))
        kernels = tuple((_on_devices(devices), tuple(run)) for devices, run in runs)
        fallback = [(b.priority, i) for i, b in enumerate(registered) if b.pick is Pick.FALLBACK]
        fallbacks = tuple((registered[i], _refusal(registered[i], op)) for _, i in sorted(fallback))
        plan = _Plan(kernels, fallbacks)
        op._plan = plan
    return plan


def select_name(name: str, *tensors: torch.Tensor, backend: str | None = None) -> str:
    """The backend that the dispatch rule picks for op ``name`` on ``tensors``."""
    op = _OPS[name]
    choice = requested(backend)
    if choice is not None:
        refuse = op._cache.get(choice)
        if refuse is None:
            refuse = op._cache[choice] = _forced_refusal(_BACKENDS[choice], op)
        reasons = refuse(op, tensors)
        if reasons:
            raise BackendUnavailableError(
                f"fusedops.{name}: backend {choice!r} was requested but cannot run: "
                + "; ".join(reasons)
            )
        return choice
    plan = op._plan or _plan(op)
    main = tensors[0]
    elsewhere = plan.elsewhere
    if elsewhere is not None and not elsewhere(main):
        refuse = plan.first_refuse
        if refuse is None or not refuse(*tensors):
            return plan.first_name
        runs = ()
    else:
        runs = plan.kernels
    refused: list[str] = []
    unverified: list[str] = []
    for on_device, run in runs:
        if on_device is not None and not on_device(main):
            continue
        for kernel in run:
            reasons = kernel.unavailable(op)
            # Verification before the inputs: an unverified kernel must not trigger a build.
            if not reasons and not allow_unverified() and not gpu_verified(name, kernel.name):
                unverified.append(kernel.name)
                continue
            reasons = reasons or kernel.reasons(op, tensors)
            if not reasons:
                return kernel.name
            refused.append(f"{kernel.name}: {'; '.join(reasons)}")
    if unverified:
        _warn_unverified(name, unverified, plan.first_fallback)
    for fallback, refuse in plan.fallbacks:
        if refuse is None:
            return fallback.name
        reasons = refuse(*tensors)
        if not reasons:
            return fallback.name
        refused.append(f"{fallback.name}: {'; '.join(reasons)}")
    raise BackendUnavailableError(f"fusedops.{name}: no backend can run: " + " | ".join(refused))


class Candidates(NamedTuple):
    """What the automatic rule may run for one call (``candidates``)."""

    #: backend names in preference order: usable kernels first, then the fallback
    usable: tuple[str, ...]
    #: every other registered backend -> why the automatic rule would not run it
    refused: dict[str, tuple[str, ...]]


def candidates(name: str, *tensors: torch.Tensor) -> Candidates:
    """The backends the automatic rule may run for op ``name`` on ``tensors`` now, in
    preference order (verified kernels, or unverified ones with ``FUSEDOPS_UNVERIFIED=1``,
    that take the inputs; then the fallback), and every other registered backend with its
    reasons (never the forced-only reference). Explicit choices (``backend=``, use_backend,
    FUSEDOPS_BACKEND) are not applied: this is the list to time against each other. May build
    the CUDA extension, as selecting a verified CUDA kernel does."""
    op = _OPS[name]
    plan = _plan(op)
    main = tensors[0]
    usable: list[str] = []
    refused: dict[str, tuple[str, ...]] = {}
    for on_device, kernel in ((test, k) for test, run in plan.kernels for k in run):
        reasons = kernel.unavailable(op)
        if not reasons and on_device is not None and not on_device(main):
            reasons = [
                f"input is on {main.device.type}; the automatic pick runs {kernel.name} on "
                f"{' or '.join(kernel.devices)} tensors only"
            ]
        elif not reasons and not allow_unverified() and not gpu_verified(name, kernel.name):
            reasons = [
                "not verified on a GPU at its current sources (FUSEDOPS_UNVERIFIED=1 lets "
                "unverified kernels into the automatic pick)"
            ]
        reasons = reasons or kernel.reasons(op, tensors)
        if reasons:
            refused[kernel.name] = tuple(reasons)
        else:
            usable.append(kernel.name)
    for fallback, _ in plan.fallbacks:
        reasons = fallback.reasons(op, tensors)
        if reasons:
            refused[fallback.name] = tuple(reasons)
        else:
            usable.append(fallback.name)
    for backend in backends():
        if backend.name in refused or backend.name in usable:
            continue
        if backend.pick is Pick.FORCED:
            refused[backend.name] = ("runs only when forced",)
        else:
            refused[backend.name] = (f"not in {name}'s automatic preference",)
    return Candidates(tuple(usable), refused)


def _implementation(op: Op, backend: str) -> Any:
    impl = op._impls.get(backend)
    if impl is not None:
        return impl
    with _lock:
        impl = _BACKENDS[backend].implementation(op)
        op._impls[backend] = impl
    return impl


def implementation(name: str, backend: str) -> Any:
    """The implementation namespace of op ``name`` on ``backend`` (already picked)."""
    return _implementation(_OPS[name], backend)


def select(name: str, *tensors: torch.Tensor, backend: str | None = None) -> Any:
    """The implementation namespace the dispatch rule picks for op ``name`` on ``tensors``."""
    return _implementation(_OPS[name], pick(name, *tensors, backend=backend))


def pick(name: str, *tensors: torch.Tensor, backend: str | None = None) -> str:
    """``select_name``, recorded in ``last_used`` (for ops that run their native path
    themselves, with torch's autograd, instead of through an implementation namespace)."""
    chosen = select_name(name, *tensors, backend=backend)
    last_used[name] = chosen
    return chosen


@contextlib.contextmanager
def observing() -> Iterator[list]:
    """Record the dispatch of each fused op called in the block: yields a list that gets
    ``(op name, the tensors passed to dispatch)`` per call (what ``fusedops.optimize`` asks
    ``candidates`` about). ``pick`` (which ``select`` and the ops' eager paths call) is
    replaced by a recording one for the block, so calls outside a block pay nothing; calls
    from other threads during the block are recorded too."""
    global pick
    seen: list = []
    previous = pick

    def recording(name: str, *tensors: torch.Tensor, backend: str | None = None) -> str:
        seen.append((name, tensors))
        return previous(name, *tensors, backend=backend)

    pick = recording
    try:
        yield seen
    finally:
        pick = previous


def availability() -> dict[str, dict[str, str]]:
    """op -> backend -> "available" or why not, whatever the inputs (``fusedops.info``)."""
    table = {}
    for name, op in sorted(_OPS.items()):
        row = {}
        for backend in backends():
            reasons = backend.unavailable(op)
            row[backend.name] = "available" if not reasons else "; ".join(reasons)
        table[name] = row
    return table

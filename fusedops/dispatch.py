"""The one dispatch rule of fusedops.

Every op registers its backends here (``register_op``) and asks ``select`` for an implementation
each time it runs. The rule, in order:

1. An explicit choice wins: the op's ``backend=`` argument, then ``with use_backend(...)``, then
   the ``FUSEDOPS_BACKEND`` environment variable. If the chosen backend cannot take the inputs,
   ``BackendUnavailableError`` lists its reasons (the op's ``unsupported_reasons`` among them).
2. On a CUDA tensor: the first kernel backend of the op's preference (cuda, then triton, by
   default) that has **passed the GPU suite at its current sources** (``gpu_verified``; the table
   is ``fusedops/kernels/verified.json``), is installed/built and has no reason to refuse these
   inputs (device, dtype, the op's ``unsupported_reasons``). ``FUSEDOPS_UNVERIFIED=1`` lets
   unverified kernels into this automatic pick; otherwise skipping one says so once per op in a
   warning.
3. Otherwise (CPU tensors, no verified kernel, or none can take the inputs): ``native``, the op
   written with PyTorch's own native ops (``F.layer_norm``, ``torch._fused_adamw_``, dropout +
   add, ...): correct and unfused, never slower than the code the op replaces. An op without a
   native namespace uses its reference there.

The ``reference`` backend is the oracle the tests compare against (plain PyTorch, fp32/fp64
math written from the definition); it runs only when forced. Under ``TRITON_INTERPRET=1`` the
triton backend also accepts CPU tensors when chosen explicitly; that is how the test suite
checks Triton kernels on a CPU machine.

An implementation is a namespace with the op's functions (``forward``, ``backward``, ...), the
same names and signatures for every backend. Nothing here imports triton or initialises CUDA;
a backend's module is imported the first time it is selected.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

BACKENDS = ("cuda", "triton", "reference", "native")
KERNEL_BACKENDS = ("cuda", "triton")
KERNEL_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

_forced_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fusedops_backend", default=None
)
_lock = threading.Lock()

#: The backend each op ran on last (op name -> backend name); read by the demo and `info`.
last_used: dict[str, str] = {}


class BackendUnavailableError(RuntimeError, ValueError):
    """No backend can run an op on the given inputs; the message lists every reason.

    A ``RuntimeError`` (a backend missing from this environment) and a ``ValueError`` (inputs a
    forced backend refuses: dtype, device, the op's ``unsupported_reasons``), so code that
    catches either for bad input catches it."""


@dataclass(frozen=True)
class Op:
    """One op's backend table.

    reference: namespace holding the plain-PyTorch implementation's functions.
    triton_module: dotted module path of the Triton launchers (imported on first use).
    cuda_module: dotted module path of the CUDA launchers' Python side (calls the extension).
    dtypes: input dtypes the kernels (triton and cuda) accept.
    preference: kernel backends to try, in order, for CUDA tensors.
    unsupported_reasons: the op module's ``unsupported_reasons(backend, *tensors) -> list[str]``,
        its limits per backend (empty list: ``backend`` takes these tensors); asked with
        "reference" for the native backend (both are plain PyTorch). None: no limits beyond
        ``dtypes``.
    native: namespace with the reference's function names written with PyTorch's native ops
        (the automatic pick where no verified kernel runs); None: the reference serves.
    """

    name: str
    reference: Any
    triton_module: str | None = None
    cuda_module: str | None = None
    dtypes: frozenset = KERNEL_DTYPES
    preference: tuple[str, ...] = ("cuda", "triton")
    unsupported_reasons: Callable[..., list[str]] | None = None
    native: Any = None
    _impls: dict = field(default_factory=dict, compare=False, repr=False)


_OPS: dict[str, Op] = {}


def register_op(name: str, reference: Any, *, kernels: str | None = None, **options: Any) -> Op:
    """Register (or re-register) op ``name`` with its reference namespace and backend options
    (``Op``'s fields). ``kernels="<module>"`` names both kernel modules by the package layout,
    ``fusedops.kernels.triton.<module>`` and ``fusedops.kernels.cuda.<module>``."""
    if kernels is not None:
        options = {
            "triton_module": f"fusedops.kernels.triton.{kernels}",
            "cuda_module": f"fusedops.kernels.cuda.{kernels}",
            **options,
        }
    op = Op(name=name, reference=reference, **options)
    _OPS[name] = op
    return op


def registered_ops() -> dict[str, Op]:
    """All registered ops by name (ops register when their module is imported)."""
    return dict(_OPS)


def _validate_name(backend: str, source: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{source}: unknown backend {backend!r}; choose one of {BACKENDS}")
    return backend


_ENVIRON = os.environ
# On POSIX os.environ keeps its values, encoded, in this dict (every assignment, ``del`` and
# monkeypatch.setenv go through it); elsewhere, None.
_ENVIRON_DATA = getattr(_ENVIRON, "_data", None) if os.name == "posix" else None
_ENV_ENCODING = sys.getfilesystemencoding()


def getenv(name: str, default: str) -> str:
    """``os.environ.get(name, default)`` without its per-call Python frames (Mapping.get,
    __getitem__, key encoding, value decoding: about 2 us, and dispatch reads the environment on
    every call). Falls back to ``os.environ.get`` where os.environ has no such dict or has been
    replaced."""
    data = _ENVIRON_DATA
    if type(data) is not dict or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    value = data.get(name.encode(_ENV_ENCODING, "surrogateescape"))
    return default if value is None else value.decode(_ENV_ENCODING, "surrogateescape")


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


def triton_interpreter() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return getenv("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _triton_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


def _cuda_missing() -> str | None:
    from fusedops.kernels.cuda import build

    return build.unavailable_reason()


def allow_unverified() -> bool:
    """True when ``FUSEDOPS_UNVERIFIED=1`` lets kernels not verified on a GPU be picked
    automatically."""
    return getenv("FUSEDOPS_UNVERIFIED", "0").strip() == "1"


def _kernel_module(op: Op, backend: str) -> str | None:
    return {"triton": op.triton_module, "cuda": op.cuda_module}.get(backend)


def verified_entry(name: str, backend: str) -> dict | None:
    """The GPU-verified record of op ``name``'s ``backend`` kernel (gpu, date, commit, evidence)
    while its sources still match the ones that passed; None otherwise."""
    from fusedops.kernels import verified

    module = _kernel_module(_OPS[name], backend)
    return None if module is None else verified.entry(name, backend, module)


def gpu_verified(name: str, backend: str) -> bool:
    """True when op ``name``'s ``backend`` kernel passed the GPU suite at its current sources."""
    return verified_entry(name, backend) is not None


_warned_unverified: set[str] = set()


def _warn_unverified(name: str, skipped: list[str]) -> None:
    if name in _warned_unverified:
        return
    _warned_unverified.add(name)
    kernels = " and ".join(skipped)
    warnings.warn(
        f"fusedops.{name}: the {kernels} kernel has not passed the GPU test suite at its "
        "current sources, so PyTorch's native op runs instead (correct, unfused). Set "
        "FUSEDOPS_UNVERIFIED=1 to pick unverified kernels, or force one with backend=..., "
        "use_backend(...) or FUSEDOPS_BACKEND.",
        RuntimeWarning,
        stacklevel=3,
    )


def install_reasons(op: Op, backend: str) -> list[str]:
    """Why ``backend`` of ``op`` cannot run at all here, whatever the inputs (no CUDA probing
    beyond what has already happened; the CUDA extension's state is reported as known)."""
    if backend in ("reference", "native"):
        return []
    if backend == "triton":
        if op.triton_module is None:
            return ["no triton kernel for this op"]
        missing = _triton_missing()
        return [missing] if missing else []
    if op.cuda_module is None:
        return ["no CUDA kernel for this op"]
    from fusedops.kernels.cuda import build

    state = build.known_state()
    return [state] if state else []


def input_reasons(op: Op, backend: str, tensors: Sequence[torch.Tensor]) -> list[str]:
    """Why ``backend`` of ``op`` cannot take these inputs (empty list: it can)."""
    reasons = install_reasons(op, backend)
    main = tensors[0]
    if backend in KERNEL_BACKENDS:
        # is_cuda, not device.type == "cuda": torch.device.type costs microseconds a call
        if backend == "cuda" and not main.is_cuda:
            reasons.append(f"input is on {main.device.type}, the CUDA kernel needs a CUDA tensor")
        if backend == "triton" and not main.is_cuda and not triton_interpreter():
            reasons.append(
                f"input is on {main.device.type}; triton needs a CUDA tensor "
                "(or TRITON_INTERPRET=1 for the CPU interpreter)"
            )
        if main.dtype not in op.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in op.dtypes))
            reasons.append(f"dtype {main.dtype} not supported (kernels take {names})")
        if backend == "cuda" and not reasons:
            missing = _cuda_missing()  # builds the extension on first use
            if missing:
                reasons.append(missing)
    if op.unsupported_reasons is not None:
        asked = "reference" if backend == "native" else backend  # both plain PyTorch
        reasons.extend(op.unsupported_reasons(asked, *tensors))
    return reasons


def _implementation(op: Op, backend: str) -> Any:
    impl = op._impls.get(backend)
    if impl is not None:
        return impl
    with _lock:
        if backend == "reference":
            impl = op.reference
        elif backend == "native":
            impl = op.native if op.native is not None else op.reference
        elif backend == "triton":
            impl = importlib.import_module(op.triton_module)
        else:
            impl = importlib.import_module(op.cuda_module)
        op._impls[backend] = impl
    return impl


def select_name(name: str, *tensors: torch.Tensor, backend: str | None = None) -> str:
    """The backend that the dispatch rule picks for op ``name`` on ``tensors``."""
    op = _OPS[name]
    choice = requested(backend)
    if choice is not None:
        reasons = input_reasons(op, choice, tensors)
        if reasons:
            raise BackendUnavailableError(
                f"fusedops.{name}: backend {choice!r} was requested but cannot run: "
                + "; ".join(reasons)
            )
        return choice
    refused: list[str] = []
    if tensors[0].is_cuda:
        unverified: list[str] = []
        for candidate in op.preference:
            reasons = install_reasons(op, candidate)
            # Verification before the inputs: an unverified CUDA kernel must not trigger the
            # extension build.
            if not reasons and not allow_unverified() and not gpu_verified(name, candidate):
                unverified.append(candidate)
                continue
            reasons = reasons or input_reasons(op, candidate, tensors)
            if not reasons:
                return candidate
            refused.append(f"{candidate}: {'; '.join(reasons)}")
        if unverified:
            _warn_unverified(name, unverified)
    if op.unsupported_reasons is None:  # native has no limits of its own: input_reasons' answer
        return "native"
    # input_reasons(op, "native", tensors), inlined: native has no install or kernel reasons
    reasons = op.unsupported_reasons("reference", *tensors)
    if not reasons:
        return "native"
    refused.append(f"native: {'; '.join(reasons)}")
    raise BackendUnavailableError(f"fusedops.{name}: no backend can run: " + " | ".join(refused))


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


def availability() -> dict[str, dict[str, str]]:
    """op -> backend -> "available" or why not (for ``python -m fusedops info``)."""
    table = {}
    for name, op in sorted(_OPS.items()):
        row = {}
        for backend in BACKENDS:
            reasons = install_reasons(op, backend)
            row[backend] = "available" if not reasons else "; ".join(reasons)
        table[name] = row
    return table

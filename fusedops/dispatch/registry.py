"""The table of registered backends (the ops' is ``op_table``).

A **backend** is one way to run fusedops' ops: a kernel family (the CUDA extension, Triton),
PyTorch's own native ops, the plain-PyTorch reference, or one a third party registers. Each is
a ``Backend`` object declaring what the dispatch rule needs to know, the way an xformers
attention operator declares what it supports:

- ``name``, and ``devices``: the device types whose tensors the automatic pick offers it;
- ``pick``: how the automatic pick treats it (``Pick.VERIFIED``: a kernel, picked only while it
  has passed the GPU suite at its current sources; ``Pick.FALLBACK``: picked wherever no kernel
  is, as PyTorch's native ops are; ``Pick.FORCED``: only when forced, as the reference);
- ``position(op)``: its place in an op's automatic preference (lower first; None: never picked
  automatically for that op);
- ``unavailable(op)``: why it cannot run ``op`` here at all (extension not built, triton
  missing, no kernel for this op), without probing a GPU;
- ``module(op)`` / ``implementation(op)``: where its implementation of an op lives;
- ``source_files(op)``: the files whose hash gates GPU verification (``Pick.VERIFIED`` only);
- ``reasons(op, tensors)``: why it refuses these inputs (device, dtype, the op's own limits).

A backend registers itself, as Liger-Kernel's do: ``register_backend(backend)`` (undone by the
handle it returns, also a context manager). The built-in four register in ``builtin.py``;
packages register theirs through the entry-point group ``fusedops.backends``
(``load_plugins``). Registering imports neither triton, CUDA nor JAX: a backend's modules are
imported the first time dispatch selects it.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fusedops.dispatch.op_table import _OPS, Op

#: The entry-point group third-party backends register through.
ENTRY_POINT_GROUP = "fusedops.backends"


class BackendUnavailableError(RuntimeError, ValueError):
    """No backend can run an op on the given inputs; the message lists every reason.

    A ``RuntimeError`` (a backend missing from this environment) and a ``ValueError`` (inputs a
    forced backend refuses: dtype, device, the op's ``unsupported_reasons``), so code that
    catches either for bad input catches it."""


class Pick(enum.Enum):
    """How the automatic pick treats a backend."""

    #: A kernel: picked automatically only while it has passed the GPU suite at its current
    #: sources (or with ``FUSEDOPS_UNVERIFIED=1``), in the op's preference order.
    VERIFIED = "verified"
    #: Picked wherever no kernel runs (PyTorch's native ops): never slower than the code the op
    #: replaces.
    FALLBACK = "fallback"
    #: Runs only when forced (the reference: the tests' oracle).
    FORCED = "forced"


class Backend:
    """One way to run fusedops' ops. Subclass it, set the class attributes, override what
    differs, and ``register_backend(MyBackend())``; ``docs/adding-a-backend.md`` walks through
    one. The defaults describe a backend that takes tensors on any device and asks the op's
    ``unsupported_reasons`` under its own name."""

    #: The name ``backend=``, ``use_backend`` and ``FUSEDOPS_BACKEND`` choose it by.
    name: str = ""
    #: Device types (``"cuda"``, ``"cpu"``, ...) whose tensors the automatic pick offers it and
    #: it takes when forced; empty: any device.
    devices: tuple[str, ...] = ()
    #: How the automatic pick treats it.
    pick: Pick = Pick.FORCED
    #: Its position in the automatic preference where an op names none (lower first).
    priority: int = 100
    #: The name it is asked under in ops' ``unsupported_reasons`` (default: ``name``).
    asks_as: str | None = None
    #: What it means when it runs as the fallback (warnings: "..., so <instead>").
    instead: str = "the fallback runs instead"

    def __repr__(self) -> str:
        return f"<fusedops backend {self.name!r} ({self.pick.value})>"

    @property
    def kernel(self) -> bool:
        """True for a kernel backend (``Pick.VERIFIED``)."""
        return self.pick is Pick.VERIFIED

    def position(self, op: Op) -> int | None:
        """Its place in ``op``'s automatic preference, lower first; None: never picked
        automatically for ``op``. Default: the op's ``preference`` where it names one (a backend
        it leaves out is never picked automatically), else ``priority``."""
        if op.preference is not None:
            return op.preference.index(self.name) if self.name in op.preference else None
        return self.priority

    def unavailable(self, op: Op) -> list[str]:
        """Why it cannot run ``op`` here whatever the inputs (empty: it can); must not probe a
        GPU or build anything."""
        return []

    def module(self, op: Op) -> str | None:
        """The dotted name of the module holding its implementation of ``op`` (None: it has
        none, or the implementation is not a module)."""
        return None

    def implementation(self, op: Op) -> Any:
        """Its implementation of ``op``: a namespace with the op's backend functions (the
        reference's names and signatures). Default: ``module(op)``, imported."""
        name = self.module(op)
        if name is None:
            raise BackendUnavailableError(
                f"backend {self.name!r} has no implementation of {op.name}"
            )
        return importlib.import_module(name)

    def source_files(self, op: Op) -> list[Path]:
        """The files whose contents make up its kernel for ``op`` (sorted; GPU verification
        hashes them). Empty: nothing to verify (no kernel, or not a ``Pick.VERIFIED``
        backend)."""
        return []

    def input_reasons(self, op: Op, tensors: Sequence[torch.Tensor]) -> list[str]:
        """Why it refuses these inputs by device or dtype (the main tensor first). Default:
        the main tensor's device outside ``devices``."""
        if not self.devices:
            return []
        main = tensors[0]
        if main.device.type in self.devices:
            return []
        return [f"input is on {main.device.type}; the {self.name} backend takes {self.devices}"]

    def op_reasons(self, op: Op, tensors: Sequence[torch.Tensor]) -> list[str]:
        """The op's own limits for it (``op.unsupported_reasons`` asked under ``asks_as``)."""
        if op.unsupported_reasons is None:
            return []
        return op.unsupported_reasons(self.asks_as or self.name, *tensors)

    def reasons(self, op: Op, tensors: Sequence[torch.Tensor]) -> list[str]:
        """Every reason it cannot run ``op`` on ``tensors`` (empty: it can): ``unavailable``,
        ``input_reasons``, ``op_reasons``."""
        return self.unavailable(op) + self.input_reasons(op, tensors) + self.op_reasons(op, tensors)

    def device_note(self) -> str | None:
        """Why it cannot run on this machine's devices (``fusedops.info``), or None."""
        return None

    def describe(self) -> str | None:
        """A line about its state for ``fusedops.info`` (an extension's build state), or None."""
        return None


# ------------------------------------------------------------------------------------------
# The tables.

_BACKENDS: dict[str, Backend] = {}
#: The names of the registered kernel backends (``Pick.VERIFIED``), kept with ``_BACKENDS``.
_KERNELS: set[str] = set()
_lock = threading.RLock()
_plugins_loaded = False


def _forget_derived(name: str | None = None) -> None:
    """Drop what was derived from the backend table (plans, source files, the kernel names,
    and ``name``'s implementations)."""
    _KERNELS.clear()
    _KERNELS.update(b.name for b in _BACKENDS.values() if b.pick is Pick.VERIFIED)
    for op in _OPS.values():
        op._cache.clear()
        op._plan = None
        if name is not None:
            op._impls.pop(name, None)


class Registration:
    """The handle ``register_backend`` returns: ``undo()`` (or leaving a ``with`` block)
    unregisters the backend and restores the one it replaced, if any."""

    def __init__(self, backend: Backend, replaced: Backend | None):
        self.backend, self.replaced, self._done = backend, replaced, False

    def undo(self) -> None:
        """Unregister the backend (once; later calls do nothing)."""
        with _lock:
            if self._done:
                return
            self._done = True
            name = self.backend.name
            if _BACKENDS.get(name) is self.backend:
                if self.replaced is None:
                    del _BACKENDS[name]
                else:
                    _BACKENDS[name] = self.replaced
            _forget_derived(name)

    def __enter__(self) -> Backend:
        return self.backend

    def __exit__(self, *exc: object) -> None:
        self.undo()


def register_backend(backend: Backend, *, replace: bool = False) -> Registration:
    """Add ``backend`` to the table dispatch picks from; returns a ``Registration`` whose
    ``undo()`` (or the end of a ``with register_backend(...):`` block) removes it.

    TypeError: not a ``Backend``; ValueError: no name, a ``pick`` that is not a ``Pick``, or
    the name already registered (``replace=True`` replaces it until the undo)."""
    if not isinstance(backend, Backend):
        raise TypeError(f"backend: expected a fusedops.dispatch.Backend, got {backend!r}")
    if not isinstance(backend.name, str) or not backend.name.isidentifier():
        raise ValueError(f"backend: its name must be an identifier, got {backend.name!r}")
    if not isinstance(backend.pick, Pick):
        raise ValueError(f"backend {backend.name!r}: pick must be a Pick, got {backend.pick!r}")
    if not isinstance(backend.devices, tuple):
        raise ValueError(f"backend {backend.name!r}: devices must be a tuple of device types")
    with _lock:
        replaced = _BACKENDS.get(backend.name)
        if replaced is not None and not replace:
            raise ValueError(
                f"backend: {backend.name!r} is already registered ({replaced!r}); "
                "pass replace=True to replace it"
            )
        _BACKENDS[backend.name] = backend
        _forget_derived(backend.name)
    return Registration(backend, replaced)


def load_plugins() -> None:
    """Register the backends packages declare in the ``fusedops.backends`` entry-point group,
    once per process. An entry point may name a ``Backend`` instance, a ``Backend`` subclass
    (instantiated), a callable returning a backend, or a module that registers its own on
    import; one that fails to load is skipped with a warning naming it."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                _register_loaded(entry.load())
            except Exception as error:  # noqa: BLE001  (a broken plugin must not break fusedops)
                warnings.warn(
                    f"fusedops: the backend entry point {entry.name!r} ({entry.value}) "
                    f"failed to load: {type(error).__name__}: {error}",
                    RuntimeWarning,
                    stacklevel=2,
                )


def _register_loaded(loaded: Any) -> None:
    if callable(loaded) and not isinstance(loaded, Backend):  # a Backend class or a factory
        loaded = loaded()
    if isinstance(loaded, Backend):
        if _BACKENDS.get(loaded.name) is not loaded:
            register_backend(loaded)
    elif loaded is not None and not hasattr(loaded, "__file__"):  # a module registered itself
        raise TypeError(f"expected a Backend, a Backend class or a module, got {loaded!r}")


def backends() -> list[Backend]:
    """The registered backends, in registration order (plugins loaded first)."""
    load_plugins()
    return list(_BACKENDS.values())


def is_kernel(name: str) -> bool:
    """True when ``name`` is a registered kernel backend (``Pick.VERIFIED``); False for any
    other name, registered or not."""
    return name in _KERNELS


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``; ValueError naming the registered ones if none."""
    found = _BACKENDS.get(name)
    if found is None:
        load_plugins()
        found = _BACKENDS.get(name)
    if found is None:
        raise ValueError(f"unknown backend {name!r}; choose one of {tuple(_BACKENDS)}")
    return found

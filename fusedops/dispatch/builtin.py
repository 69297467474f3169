"""The four backends fusedops ships, registered as any other backend is.

- ``cuda``: the CUDA extension's kernels (``fusedops/kernels/cuda/<op>.py`` calling the
  extension built from ``<op>.cu`` and ``<op>_bindings.cpp``), CUDA tensors only.
- ``triton``: the Triton kernels (``fusedops/kernels/triton/<op>.py``), CUDA tensors, and CPU
  tensors under ``TRITON_INTERPRET=1`` when forced (how the test suite runs them on a CPU).
- ``reference``: the op module's plain-PyTorch oracle; only when forced.
- ``native``: the op written with PyTorch's own ops (the op module's ``native`` namespace, else
  its reference); the automatic pick wherever no verified kernel runs.

Nothing here imports triton, builds the extension or touches CUDA on import; the extension's
state is asked only when a kernel of it is considered.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fusedops import _alloc
from fusedops._env import triton_interpreter
from fusedops.dispatch.op_table import Op
from fusedops.dispatch.registry import Backend, Pick, register_backend
from fusedops.kernels import verified


class _KernelFamily(Backend):
    """A folder of kernel modules, ``fusedops/kernels/<family>/<op.kernels>.py``, taking CUDA
    tensors of the op's ``dtypes``."""

    family = ""
    pick = Pick.VERIFIED
    devices = ("cuda",)
    #: What ``unavailable`` says for an op without a kernel of this family.
    no_kernel = ""

    @property
    def folder(self) -> Path:
        """The family's folder, ``fusedops/kernels/<family>/``."""
        return verified.PACKAGE_ROOT / "kernels" / self.family

    def own_files(self, op: Op) -> list[Path]:
        """The files of ``op``'s kernel in ``folder`` (its launcher module)."""
        path = self.folder / f"{op.kernels}.py"
        return [path] if path.exists() else []

    def has_kernel(self, op: Op) -> bool:
        """Whether ``op`` has a kernel of this family (its files exist; asked once per op)."""
        key = ("has kernel", self.name)
        found = op._cache.get(key)
        if found is None:
            found = op._cache[key] = op.kernels is not None and bool(self.own_files(op))
        return found

    def module(self, op: Op) -> str | None:
        if op.kernels is None or not (self.folder / f"{op.kernels}.py").exists():
            return None
        return f"fusedops.kernels.{self.family}.{op.kernels}"

    def source_files(self, op: Op) -> list[Path]:
        module = self.module(op)
        return [] if module is None else sorted(verified.module_sources(module))

    def device_reason(self, main: torch.Tensor) -> str | None:
        """Why the kernels cannot take a tensor on ``main``'s device, or None."""
        raise NotImplementedError

    def input_reasons(self, op: Op, tensors: Sequence[torch.Tensor]) -> list[str]:
        main = tensors[0]
        found = []
        device = self.device_reason(main)
        if device is not None:
            found.append(device)
        if main.dtype not in op.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in op.dtypes))
            found.append(f"dtype {main.dtype} not supported (kernels take {names})")
        return found

    def reasons(self, op: Op, tensors: Sequence[torch.Tensor]) -> list[str]:
        # Backend.reasons with the calls that answer nothing left out (a forced kernel is
        # asked on every call)
        found = self.unavailable(op)
        main = tensors[0]
        if main.dtype not in op.dtypes or self.device_reason(main) is not None:
            found += self.input_reasons(op, tensors)
        if not found and self.probe is not None:
            found = self.probe()
        if op.unsupported_reasons is not None:
            found += op.unsupported_reasons(self.name, *tensors)
        return found

    #: ``probe() -> reasons`` only known by trying (a build), asked where no other reason was
    #: found; None: nothing to try.
    probe = None


class Cuda(_KernelFamily):
    """The CUDA extension's kernels (built on first use)."""

    name = "cuda"
    family = "cuda"
    priority = 0
    #: The extension's files every CUDA kernel is built with: editing one unverifies them all.
    SHARED_FILES = ("library.cpp", "bindings.h", "dtype.h", "device.cuh", "build.py")
    #: An op's own files beside its launcher module ``<op>.py``.
    OWN_SUFFIXES = (".cu", ".h", "_bindings.cpp")

    def own_files(self, op: Op) -> list[Path]:
        """The op's launcher module ``<op>.py`` (optional: without one, its binding allocates
        the outputs) and its files named like it: ``<op>.cu``, ``<op>.h`` (optional: without
        one, the binding declares the launchers it calls), ``<op>_bindings.cpp``."""
        stem = self.folder / str(op.kernels)
        suffixes = (".py", *self.OWN_SUFFIXES)
        return [own for own in (stem.with_name(stem.name + s) for s in suffixes) if own.exists()]

    def implementation(self, op: Op) -> Any:
        module = self.module(op)
        if module is not None:
            return importlib.import_module(module)
        return BindingLaunchers(op.kernels)

    def unavailable(self, op: Op) -> list[str]:
        if not self.has_kernel(op):
            return ["no CUDA kernel for this op"]
        from fusedops.kernels.cuda import build

        state = build.known_state()
        return [state] if state else []

    def probe_build(self) -> str | None:
        """Why the extension cannot be used (building it on first use), or None."""
        from fusedops.kernels.cuda import build

        return build.unavailable_reason()

    def device_reason(self, main: torch.Tensor) -> str | None:
        # is_cuda, not device.type == "cuda": torch.device.type costs microseconds a call
        if main.is_cuda:
            return None
        return f"input is on {main.device.type}, the CUDA kernel needs a CUDA tensor"

    def probe(self) -> list[str]:
        missing = self.probe_build()  # builds the extension on first use
        return [missing] if missing else []

    def source_files(self, op: Op) -> list[Path]:
        if not self.has_kernel(op):
            return []
        files = set(super().source_files(op)) | set(self.own_files(op))
        files.update(self.folder / name for name in self.SHARED_FILES)
        return sorted(files)

    def device_note(self) -> str | None:
        return None if torch.cuda.is_available() else "no CUDA device"

    def describe(self) -> str | None:
        from fusedops.kernels.cuda import build

        state = build.known_state() or ("loaded" if build.is_loaded() else "built on first use")
        return f"CUDA extension: {state}"


class Triton(_KernelFamily):
    """The Triton kernels."""

    name = "triton"
    family = "triton"
    priority = 1

    def missing(self) -> str | None:
        """Why triton cannot be imported here, or None (looked up once)."""
        return _triton_missing()

    def unavailable(self, op: Op) -> list[str]:
        if not self.has_kernel(op):
            return ["no triton kernel for this op"]
        missing = self.missing()
        return [missing] if missing else []

    def device_reason(self, main: torch.Tensor) -> str | None:
        if main.is_cuda or triton_interpreter():
            return None
        return (
            f"input is on {main.device.type}; triton needs a CUDA tensor "
            "(or TRITON_INTERPRET=1 for the CPU interpreter)"
        )

    def device_note(self) -> str | None:
        if torch.cuda.is_available() or triton_interpreter():
            return None
        return "no CUDA device (TRITON_INTERPRET=1 runs it on CPU)"


class BindingLaunchers:
    """The CUDA kernel of an op without a launcher module (``kernels/cuda/<op>.py``): its
    binding allocates the outputs, so each backend function ``f(*args)`` is the extension's
    ``<op>_<f>(*args, poison)``, ``poison`` true while tests poison outputs (the binding fills
    what it allocates with NaN / the integer maximum then, as ``fusedops._alloc`` does)."""

    def __init__(self, stem: str):
        self.stem = stem

    def __repr__(self) -> str:
        return f"<CUDA launchers of {self.stem}: torch.ops.fusedops_cuda.{self.stem}_*>"

    def __getattr__(self, function: str) -> Any:
        if function.startswith("_"):
            raise AttributeError(function)
        from fusedops.kernels.cuda import build

        launch = getattr(build.library(), f"{self.stem}_{function}")

        def call(*args: Any) -> Any:
            return launch(*args, _alloc.poisoning())

        call.__name__ = function
        return call


@functools.cache
def _triton_missing() -> str | None:
    return "triton is not installed" if importlib.util.find_spec("triton") is None else None


class Reference(Backend):
    """The op module's plain-PyTorch oracle (fp32/fp64 math from the definition)."""

    name = "reference"
    pick = Pick.FORCED

    def implementation(self, op: Op) -> Any:
        return op.reference


class Native(Backend):
    """PyTorch's own ops (the op's ``native`` namespace, else its reference). Its limits are
    the reference's: both are plain PyTorch."""

    name = "native"
    pick = Pick.FALLBACK
    asks_as = "reference"
    instead = "PyTorch's native op runs instead (correct, unfused)"

    def implementation(self, op: Op) -> Any:
        return op.native if op.native is not None else op.reference


#: In this order: ``fusedops.dispatch.backend_names()`` lists them so.
BUILTIN = (Cuda(), Triton(), Reference(), Native())
for _backend in BUILTIN:
    register_backend(_backend)

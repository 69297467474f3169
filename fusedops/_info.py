"""``fusedops.info()``: what this environment runs (``python -m fusedops info`` prints it)."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import TextIO


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _verified_cell(name: str, backend: str) -> str:
    from fusedops import dispatch

    entry = dispatch.verified_entry(name, backend)
    if entry is None:
        return "unverified"
    return f"verified ({entry['gpu']}, {entry['date']})"


def report() -> str:
    """The text of ``info()``: versions, the device, each backend's state, the op x backend
    table (every backend but the forced-only ones: "available" or why not, and for kernels
    whether they passed the GPU suite at their current sources), and the hooks' report when
    hooks are enabled."""
    import torch

    from fusedops import __version__, dispatch, ops
    from fusedops._env import triton_interpreter

    ops.load_all()
    has_cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if has_cuda else "CPU only (no CUDA device)"
    lines = [
        f"fusedops {__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}",
        f"triton {_version('triton')}, jax {_version('jax')}, jaxlib {_version('jaxlib')}",
        f"CUDA toolkit of torch: {torch.version.cuda or 'none (CPU build)'}",
        f"device: {device}",
        f"TRITON_INTERPRET={'1' if triton_interpreter() else '0'}",
    ]
    listed = [b for b in dispatch.backends() if b.pick is not dispatch.Pick.FORCED]
    lines += [line for line in (b.describe() for b in dispatch.backends()) if line]
    lines.append("")
    rows = []
    for name, row in dispatch.availability().items():
        cells = []
        for backend in listed:
            cell = row[backend.name]
            note = backend.device_note() if cell == "available" else None
            cell = note or cell
            if backend.kernel:
                cell = f"{_verified_cell(name, backend.name)}; {cell}"
            cells.append(cell)
        rows.append((name, *cells))
    header = ("op", *(b.name for b in listed))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    lines += [
        "",
        "verified: passed the GPU suite at its current sources (fusedops/kernels/verified.json);"
        " on CUDA tensors the automatic pick takes only verified kernels, else PyTorch's native"
        " op (FUSEDOPS_UNVERIFIED=1 allows unverified ones; backend=... forces any).",
    ]
    from fusedops import hooks

    if hooks.enabled():
        lines += ["", "hooks (what each patched; what waits for an import):", hooks.report()]
    return "\n".join(lines)


def info(file: TextIO | None = None) -> None:
    """Print what this environment runs (``report()``) to ``file`` (default: stdout): versions,
    the device, each registered backend's state and, per op, which backends are available
    here, with the reasons for those that are not and the GPU verification of each kernel."""
    print(report(), file=file or sys.stdout)

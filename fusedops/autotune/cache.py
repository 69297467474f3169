"""Decisions kept across runs: ``$FUSEDOPS_CACHE_DIR/autotune`` (default
``~/.cache/fusedops/autotune``), one JSON file per decision.

A decision's key holds everything that could change it: the device (name and compute
capability on CUDA; the CPU model and torch's thread count on the CPU), the driver, the torch,
triton and jax versions, the hash of fusedops' kernel sources, and the region's own signature
(its module structure, autocast, grad mode, train/eval, the inputs' shapes, dtypes and
devices). A second run of the same script on the same machine finds its decisions and runs no
trials. A corrupt, unreadable or stale entry is ignored with a warning (and timed again); a
directory that cannot be written leaves the decisions in memory, with one warning.
``FUSEDOPS_AUTOTUNE=0`` turns the timing off (``optimize`` then keeps the user's code).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import warnings
from pathlib import Path

import torch

FORMAT = 1
ENV_SWITCH = "FUSEDOPS_AUTOTUNE"

_memory: dict[str, dict] = {}
_warned_unwritable = False


def timing_enabled() -> bool:
    """Whether ``optimize`` may time candidates (``FUSEDOPS_AUTOTUNE``, on unless "0")."""
    return os.environ.get(ENV_SWITCH, "1").strip() != "0"


def directory() -> Path:
    """Where decisions are kept."""
    root = os.environ.get("FUSEDOPS_CACHE_DIR") or str(Path.home() / ".cache" / "fusedops")
    return Path(root) / "autotune"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _kernel_sources() -> str:
    """A hash over every registered kernel's source hash (an edited kernel makes new keys)."""
    from fusedops import dispatch, ops

    ops.load_all()
    digest = hashlib.sha256()
    for name in sorted(dispatch.registered_ops()):
        for backend in dispatch.kernel_backend_names():
            digest.update(f"{name}:{backend}:".encode())
            files = dispatch.source_files(name, backend)
            if files:
                from fusedops.kernels import verified

                digest.update(verified.sources_hash(files).encode())
    return digest.hexdigest()[:16]


def environment(device: torch.device) -> dict:
    """The part of a key that describes this machine and its software for ``device``."""
    found = {
        "torch": torch.__version__,
        "triton": _version("triton"),
        "jax": _version("jax"),
        "kernels": _kernel_sources(),
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        found["device"] = torch.cuda.get_device_name(index)
        found["capability"] = list(torch.cuda.get_device_capability(index))
        found["driver"] = str(torch.version.cuda) + "/" + str(torch._C._cuda_getDriverVersion())
    else:
        found["device"] = f"{device.type}: {_cpu_model()}"
        found["threads"] = torch.get_num_threads()
    return found


def key_of(parts: dict) -> str:
    """The file name of a decision: a hash of its key's parts."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(parts: dict) -> dict | None:
    """The decision kept for ``parts``, or None (also for a corrupt or stale entry, with a
    warning naming it)."""
    key = key_of(parts)
    if key in _memory:
        return _memory[key]
    path = directory() / f"{key}.json"
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        warnings.warn(f"fusedops.optimize: cannot read {path}: {error}; timing again", stacklevel=3)
        return None
    try:
        entry = json.loads(text)
        if entry.get("format") != FORMAT or entry.get("key") != parts:
            raise ValueError("written for another key or format")
        decision = entry["decision"]
        if not isinstance(decision, dict) or not isinstance(decision.get("pick"), str):
            raise ValueError("no pick")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        warnings.warn(
            f"fusedops.optimize: ignoring the cached decision {path} ({error}); timing again",
            stacklevel=3,
        )
        return None
    _memory[key] = decision
    return decision


def store(parts: dict, decision: dict) -> None:
    """Keep ``decision`` for ``parts``: on disk where the directory can be written, in memory
    always (one warning where the disk cannot be used)."""
    global _warned_unwritable
    key = key_of(parts)
    _memory[key] = decision
    folder = directory()
    entry = {"format": FORMAT, "key": parts, "decision": decision}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{key}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(entry, sort_keys=True, indent=1, default=str))
        temporary.replace(folder / f"{key}.json")
    except OSError as error:
        if not _warned_unwritable:
            _warned_unwritable = True
            warnings.warn(
                f"fusedops.optimize: cannot write decisions to {folder} ({error}); they are "
                "kept in memory for this process only",
                stacklevel=3,
            )


def forget_memory() -> None:
    """Drop the decisions kept in memory (tests: the next look-up reads the disk)."""
    _memory.clear()

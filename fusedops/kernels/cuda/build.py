"""JIT build of the CUDA extension (ninja through ``torch.utils.cpp_extension.load``).

Built on first use on a CUDA machine and cached per torch / CUDA / GPU arch under
``$FUSEDOPS_CACHE_DIR`` (default ``~/.cache/fusedops``); ``python -m fusedops build`` builds ahead
of time. A failed build logs one line and the dispatcher falls back to Triton. The extension is
``library.cpp`` (the ``fusedops_cuda`` namespace), every op's ``<op>_bindings.cpp`` (found by
glob: each registers ``torch.ops.fusedops_cuda.<function>`` for its op's launchers as a library
fragment) and every ``<op>.cu``; ``kernels/cuda/<op>.py`` allocates outputs and calls them.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch

log = logging.getLogger("fusedops")

SOURCE_DIR = Path(__file__).resolve().parent
EXTENSION_NAME = "fusedops_cuda"
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]

_lock = threading.Lock()
_loaded = False
_error: str | None = None


def kernel_sources() -> list[Path]:
    """Every ``.cu`` file of the extension, sorted."""
    return sorted(SOURCE_DIR.glob("*.cu"))


def library_source() -> Path:
    """The C++ file claiming the ``fusedops_cuda`` namespace (TORCH_LIBRARY; it defines no op)."""
    return SOURCE_DIR / "library.cpp"


def binding_sources() -> list[Path]:
    """library.cpp, then every op's ``<op>_bindings.cpp`` (TORCH_LIBRARY_FRAGMENTs), sorted."""
    return [library_source(), *sorted(SOURCE_DIR.glob("*_bindings.cpp"))]


def cache_dir() -> Path:
    """Build directory for this torch / CUDA version and the current GPU's arch."""
    root = Path(os.environ.get("FUSEDOPS_CACHE_DIR", Path.home() / ".cache" / "fusedops"))
    major, minor = torch.cuda.get_device_capability()
    tag = f"torch{torch.__version__}-cu{torch.version.cuda}-sm{major}{minor}".replace("+", "_")
    return root / "cuda" / tag


def known_state() -> str | None:
    """Why the extension cannot be used, if known without building; None if it may be."""
    if torch.version.cuda is None:
        return "torch is a CPU-only build"
    return _error


def is_loaded() -> bool:
    """Whether the extension has been built and loaded in this process."""
    return _loaded


def ensure_built(verbose: bool = False) -> None:
    """Build (or load from cache) and load the extension; raises on failure."""
    global _loaded
    with _lock:
        if _loaded:
            return
        from torch.utils.cpp_extension import load

        build_dir = cache_dir()
        build_dir.mkdir(parents=True, exist_ok=True)
        load(
            name=EXTENSION_NAME,
            sources=[str(p) for p in (*binding_sources(), *kernel_sources())],
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=NVCC_FLAGS,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=verbose,
        )
        _loaded = True


def unavailable_reason() -> str | None:
    """None when the extension is loaded (building it on first call), else one line saying why."""
    global _error
    reason = known_state()
    if reason is not None or _loaded:
        return reason
    try:
        ensure_built()
    except Exception as exc:  # any build/load failure means: fall back, say why once
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        _error = f"CUDA extension build failed: {first_line}"
        log.warning("fusedops: %s (falling back to triton/reference)", _error)
        return _error
    return None


def library():
    """``torch.ops.fusedops_cuda``: the extension's ops (build it first with ensure_built)."""
    return getattr(torch.ops, EXTENSION_NAME)

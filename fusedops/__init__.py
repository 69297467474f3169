"""fusedops: drop-in fused Triton/CUDA kernels for PyTorch training.

Functional API (``fusedops.quick_gelu``, ...), modules (``fusedops.nn``), hooks
(``fusedops.hooks``), backend choice (``fusedops.use_backend``). Attributes load on first
access: ``import fusedops`` imports neither torch, triton nor JAX and initialises nothing, so
``fusedops.hooks`` can be enabled before ``import torch``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_ATTRIBUTES = {
    "quick_gelu": "fusedops.ops.quick_gelu",
    "layer_norm": "fusedops.ops.layer_norm",
    "rms_norm": "fusedops.ops.layer_norm",
    "use_backend": "fusedops.dispatch",
    "BackendUnavailableError": "fusedops.dispatch",
    "replace_modules": "fusedops.hooks",
}
_SUBMODULES = ("dispatch", "hooks", "kernels", "nn", "ops", "optim", "testing", "xla")

__all__ = sorted(_ATTRIBUTES) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"fusedops.{name}")
    raise AttributeError(f"module 'fusedops' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

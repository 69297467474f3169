"""fusedops: drop-in fused Triton/CUDA kernels for PyTorch training.

Functional API (``fusedops.quick_gelu``, ...), modules (``fusedops.nn``), hooks
(``fusedops.hooks``), backend choice (``fusedops.use_backend``). Attributes load on first
access: ``import fusedops`` imports neither torch, triton nor JAX and initialises nothing, so
``fusedops.hooks`` can be enabled before ``import torch``.
"""

from __future__ import annotations

from fusedops._lazy import lazy_module

__version__ = "0.1.0"

#: The public names that are not ops' (each op module's ``__all__`` gives the ops' names).
_ATTRIBUTES = {
    "use_backend": "fusedops.dispatch",
    "BackendUnavailableError": "fusedops.dispatch",
    "replace_modules": "fusedops.hooks",
    "auto_checkpoint": "fusedops.utils.checkpoint",
    "info": "fusedops._info",
    "optimize": "fusedops.autotune",
    "optimize_report": "fusedops.autotune",
}
_SUBMODULES = (
    "dispatch",
    "hooks",
    "integrations",
    "io",
    "kernels",
    "nn",
    "ops",
    "optim",
    "testing",
    "utils",
    "xla",
)


def _op_attributes() -> dict[str, str]:
    """The ops' public names (``fusedops.quick_gelu``, ...): each op module's ``__all__``, read
    from its source on the first look-up that needs them (``fusedops._layout``)."""
    from fusedops import _layout

    return _layout.op_attributes()


# ``__all__`` (every public name, sorted, then the submodules) comes from ``__getattr__`` too.
__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES, _SUBMODULES, _op_attributes)

"""fusedops.xla: static regions of PyTorch programs compiled by XLA through JAX.

``partial_trace`` compiles a function or module region by region (forward and backward each one
XLA program); ``xla_trace`` compiles a whole training step (forward, backward, optimizer update)
as one XLA program. Attributes load on first access: ``import fusedops.xla`` does not import jax.
"""

from __future__ import annotations

from fusedops._lazy import lazy_module

_ATTRIBUTES = {
    "partial_trace": "fusedops.xla.api",
    "xla_trace": "fusedops.xla.train_step",
    "XLATraceError": "fusedops.xla.errors",
    "UnsupportedOpsError": "fusedops.xla.errors",
    "run_demo_stage": "fusedops.xla._demo",
}

__all__ = sorted(_ATTRIBUTES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES)

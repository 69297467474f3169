"""SGD on the CUDA extension: one ``sgd_step`` call per group; sgd.cu's launcher fills the
pointer tables and launches once per table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusedops.kernels.cuda.build import library
from fusedops.kernels.shared.sgd import step_arguments

if TYPE_CHECKING:
    import torch

#: Elements per chunk (one CUDA block of 512 threads).
CHUNK = 65536


def step(*lists: list[torch.Tensor], chunk: int = CHUNK, **options: Any) -> None:
    """SGD update of a tensor group on CUDA, in place: the backend interface of
    fusedops/kernels/shared/sgd.py (layout: fusedops.ops.sgd)."""
    lists, o = step_arguments(lists, options)
    params, grads, momentum_buffers, masters, firsts = lists
    has_momentum = o.momentum != 0
    library().sgd_step(
        params,
        grads,
        momentum_buffers if has_momentum else [],
        masters,
        firsts if has_momentum else [],
        o.lr_tensor,
        o.lr,
        o.momentum,
        o.dampening,
        o.weight_decay,
        o.nesterov,
        o.maximize,
        o.grad_scale,
        o.found_inf,
        chunk,
    )

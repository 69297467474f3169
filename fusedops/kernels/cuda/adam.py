"""Adam / AdamW on the CUDA extension: one ``adam_step`` call per group; adam.cu's launcher
fills the pointer tables and launches once per table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusedops.kernels.cuda.build import library
from fusedops.kernels.shared.adam import step_arguments

if TYPE_CHECKING:
    import torch

#: Elements per chunk (one CUDA block of 512 threads).
CHUNK = 65536


def step(*lists: list[torch.Tensor], chunk: int = CHUNK, **options: Any) -> None:
    """Adam/AdamW update of a tensor group on CUDA, in place: the backend interface of
    fusedops/kernels/shared/adam.py (layout: fusedops.ops.adam); ``clip_coef`` (0-d float32 on
    the device, or None) multiplies the unscaled gradient."""
    lists, o = step_arguments(lists, options)
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps = lists
    library().adam_step(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs if o.amsgrad else [],
        masters,
        steps,
        o.lr_tensor,
        o.lr,
        o.beta1,
        o.beta2,
        o.eps,
        o.weight_decay,
        o.amsgrad,
        o.maximize,
        o.decoupled,
        o.grad_scale,
        o.found_inf,
        o.clip_coef,
        chunk,
    )

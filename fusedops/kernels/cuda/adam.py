"""Adam / AdamW on the CUDA extension: one ``adam_step`` call per group; adam.cu's launcher
fills the pointer tables and launches once per table."""

from __future__ import annotations

from fusedops.kernels.cuda.build import library

#: Elements per chunk (one CUDA block of 512 threads).
CHUNK = 65536


def step(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    masters,
    steps,
    *,
    lr,
    lr_tensor,
    beta1,
    beta2,
    eps,
    weight_decay,
    amsgrad,
    maximize,
    decoupled,
    grad_scale,
    found_inf,
    clip_coef=None,
    chunk: int = CHUNK,
) -> None:
    """Adam/AdamW update of a tensor group on CUDA (layout: fusedops.ops.adam), in place;
    ``clip_coef`` (0-d float32 on the device, or None) multiplies the unscaled gradient."""
    library().adam_step(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs if amsgrad else [],
        masters,
        steps,
        lr_tensor,
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
        amsgrad,
        maximize,
        decoupled,
        grad_scale,
        found_inf,
        clip_coef,
        chunk,
    )

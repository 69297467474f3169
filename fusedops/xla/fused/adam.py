"""The Adam / AdamW update (``fusedops::adam_step``) in XLA.

``adam_step`` mutates its tensor lists in place. Inside a graph (``torch.compile`` of a function
that calls ``FusedAdam.step``, or ``partial_trace`` over it) functionalization turns the call
into an ``auto_functionalized`` node; ``fusedops.xla.lower`` runs this lowering for it and
writes what it returns back as the new values of the mutated lists. Same math and dtypes as
``fusedops.ops.adam``'s reference: fp32 (fp64 for fp64 params) whatever the stored dtypes, the
update computed on the master copies when there are any, nothing written where ``found_inf``
is set, the gradient multiplied by ``clip_coef`` inside the update (gradient clipping; the
gradients themselves are not clipped), and the steps advanced by one (not where ``found_inf``
is set).

``xla_trace`` does not need this op: it turns ``opt.step()`` of FusedAdam/FusedAdamW into the
same functional math (``fusedops.xla.optim_math``).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from fusedops.xla.lower_table import register

fusedops = torch.ops.fusedops


def _update_one(p, g, m, v, v_max, step, *, rate, beta1, beta2, eps, weight_decay, amsgrad,
                maximize, decoupled, grad_scale, clip_coef):  # fmt: skip
    """One tensor's new (p, m, v, v_max or None, unscaled grad or None), in the compute dtype."""
    if grad_scale is not None:
        g = g / grad_scale.astype(g.dtype)
    unscaled = g if grad_scale is not None else None
    if clip_coef is not None:
        g = g * clip_coef.astype(g.dtype)
    if maximize:
        g = -g
    if weight_decay != 0:
        if decoupled:
            p = p * (1 - rate * weight_decay)
        else:
            g = g + weight_decay * p
    m = m + (1 - beta1) * (g - m)
    v = v * beta2 + (1 - beta2) * g * g
    bias_correction1 = 1 - jnp.power(beta1, step)
    bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(beta2, step))
    v_hat = jnp.maximum(v_max, v) if amsgrad else v
    denom = jnp.sqrt(v_hat) / bias_correction2_sqrt + eps
    p = p - (m / denom) * (rate / bias_correction1)
    return p, m, v, (v_hat if amsgrad else None), unscaled


@register(fusedops.adam_step.default, mutates=True)
def adam_step(
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor,
    beta1, beta2, eps, weight_decay, amsgrad, maximize, decoupled, grad_scale, found_inf,
    clip_coef=None, backend=None,
) -> dict:  # fmt: skip
    """New values of the lists ``adam_step`` writes (name -> list of arrays, stored dtypes)."""
    skip = None if found_inf is None else found_inf != 0
    rate = lr if lr_tensor is None else lr_tensor.astype(jnp.float32)
    new = {"params": [], "exp_avgs": [], "exp_avg_sqs": [], "max_exp_avg_sqs": [], "masters": []}
    new["grads"] = list(grads)
    new["steps"] = [s + 1 for s in steps]
    for i, param in enumerate(params):
        compute = jnp.float64 if param.dtype == jnp.float64 else jnp.float32
        p = (masters[i] if masters else param).astype(compute)
        v_max = max_exp_avg_sqs[i].astype(compute) if amsgrad else None
        p, m, v, v_max, unscaled = _update_one(
            p, grads[i].astype(compute), exp_avgs[i].astype(compute),
            exp_avg_sqs[i].astype(compute), v_max, new["steps"][i].astype(compute),
            rate=rate, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            amsgrad=amsgrad, maximize=maximize, decoupled=decoupled, grad_scale=grad_scale,
            clip_coef=clip_coef,
        )  # fmt: skip
        writes = [("params", param, p), ("exp_avgs", exp_avgs[i], m)]
        writes.append(("exp_avg_sqs", exp_avg_sqs[i], v))
        if amsgrad:
            writes.append(("max_exp_avg_sqs", max_exp_avg_sqs[i], v_max))
        if masters:
            writes.append(("masters", masters[i], p))
        for name, old, value in writes:
            value = value.astype(old.dtype)
            new[name].append(value if skip is None else jnp.where(skip, old, value))
        if unscaled is not None:
            value = unscaled.astype(grads[i].dtype)
            new["grads"][i] = value if skip is None else jnp.where(skip, grads[i], value)
    if found_inf is not None:
        new["steps"] = [s - found_inf.astype(s.dtype) for s in new["steps"]]
    return new

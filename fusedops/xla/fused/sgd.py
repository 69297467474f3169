"""The SGD update (``fusedops::sgd_step``) in XLA.

``sgd_step`` mutates its tensor lists in place. Inside a graph (``torch.compile`` of a function
that calls ``FusedSGD.step``, or ``partial_trace`` over it) functionalization turns the call
into an ``auto_functionalized`` node; ``fusedops.xla.lower`` runs this lowering for it and
writes what it returns back as the new values of the mutated lists. Same math and dtypes as
``fusedops.ops.sgd``'s reference: fp32 (fp64 for fp64 params) whatever the stored dtypes, the
update computed on the master copies when there are any, a momentum buffer at its first step
(``firsts`` flag) set to the gradient, nothing written where ``found_inf`` is set.

``xla_trace`` does not need this op: it turns ``opt.step()`` of FusedSGD into the same
functional math (``fusedops.xla.optim_math``).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from fusedops.xla.lower_table import register

fusedops = torch.ops.fusedops


@register(fusedops.sgd_step.default, mutates=True)
def sgd_step(
    params, grads, momentum_buffers, masters, firsts, lr, lr_tensor, momentum, dampening,
    weight_decay, nesterov, maximize, grad_scale, found_inf, backend=None,
) -> dict:  # fmt: skip
    """New values of the lists ``sgd_step`` writes (name -> list of arrays, stored dtypes)."""
    skip = None if found_inf is None else found_inf != 0
    new = {"params": [], "momentum_buffers": [], "masters": [], "grads": list(grads)}
    for i, param in enumerate(params):
        compute = jnp.float64 if param.dtype == jnp.float64 else jnp.float32
        p = (masters[i] if masters else param).astype(compute)
        g = grads[i].astype(compute)
        unscaled = None
        if grad_scale is not None:
            g = g / grad_scale.astype(compute)
            unscaled = g
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + weight_decay * p
        writes = []
        if momentum != 0:
            b = momentum_buffers[i].astype(compute) * momentum + (1 - dampening) * g
            if firsts:
                b = jnp.where(firsts[i] != 0, g, b)
            g = g + momentum * b if nesterov else b
            writes.append(("momentum_buffers", momentum_buffers[i], b))
        rate = lr if lr_tensor is None else lr_tensor.astype(compute).reshape(())
        p = p - rate * g
        writes.append(("params", param, p))
        if masters:
            writes.append(("masters", masters[i], p))
        for name, old, value in writes:
            value = value.astype(old.dtype)
            new[name].append(value if skip is None else jnp.where(skip, old, value))
        if unscaled is not None:
            value = unscaled.astype(grads[i].dtype)
            new["grads"][i] = value if skip is None else jnp.where(skip, grads[i], value)
    return new


def samples(name):
    """Argument tuples of ``fusedops::sgd_step`` (random each call): every option, master
    weights, a zero-size param, first-step flags, grad_scale with and without found_inf."""
    from fusedops.testing import random_tensor

    assert name == "sgd_step", name
    f32, bf16 = torch.float32, torch.bfloat16

    def lists(dtype=f32, momentum=True, masters=False, firsts=False):
        shapes = [(3, 5), (7,), (0,)]
        params = [random_tensor(s, dtype) for s in shapes]
        grads = [random_tensor(s, dtype) for s in shapes]
        state = f32 if masters else dtype
        buffers = [random_tensor(s, state) for s in shapes] if momentum else []
        master = [p.float() + 0.01 for p in params] if masters else []
        flags = [torch.tensor(float(i % 2)) for i in range(len(shapes))] if firsts else []
        return [params, grads, buffers, master, flags]

    def options(lr=0.01, lr_tensor=None, momentum=0.9, dampening=0.0, weight_decay=0.0,
                nesterov=False, maximize=False, grad_scale=None, found_inf=None):  # fmt: skip
        return (lr, lr_tensor, momentum, dampening, weight_decay, nesterov, maximize,
                grad_scale, found_inf)  # fmt: skip

    return [
        (*lists(momentum=False), *options(momentum=0.0, weight_decay=0.1)),
        (*lists(), *options(weight_decay=0.05, maximize=True)),
        (*lists(), *options(nesterov=True, weight_decay=0.1)),
        (*lists(firsts=True), *options(dampening=0.3)),
        (*lists(bf16, masters=True), *options(lr=0.0, lr_tensor=torch.tensor(0.02))),
        (*lists(bf16), *options(grad_scale=torch.tensor(4.0), found_inf=torch.tensor(0.0))),
        (*lists(), *options(grad_scale=torch.tensor(4.0), found_inf=torch.tensor(1.0))),
    ]

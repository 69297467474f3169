"""SGD (with momentum, dampening, Nesterov, weight decay, maximize) of a group of tensors (one
device, one param dtype) in one call: torch.optim.SGD's update.

Every backend implements ``step(*lists, **options)`` (fusedops/kernels/shared/sgd.py: the five
lists positionally, the hyperparameters of ``StepOptions`` by keyword); the lists hold tensors
with at least one element, all on one device, each dense (contiguous, or sharing its param's
strides), elementwise aligned with its param:

- params: the parameters (fp32/fp16/bf16; fp64 on the reference and native backends), updated
  in place;
- grads: their gradients (param dtype); written back unscaled when ``grad_scale`` is given;
- momentum_buffers: empty when ``momentum`` is 0; else one per param, in the param dtype, or
  float32 when master weights are used;
- masters: float32 master copies of the params (empty list: no master weights); when given the
  update is computed on them and the params receive the result rounded to their dtype;
- firsts: empty, or one 0-d float32 tensor per param on the params' device (the same tensor may
  stand for several params): nonzero where that param's momentum buffer takes its first step.

Besides the hyperparameters, ``step`` takes ``lr_tensor``, ``grad_scale`` and ``found_inf``,
optional 0-d float32 tensors on the params' device, all read on the device.

The math is torch.optim.SGD's, in fp32 for fp16/bf16 params (fp64 for fp64)::

    g = grad / grad_scale   (written back: the unscaled gradient)
    g = -g if maximize
    g = g + weight_decay * p                                   (weight_decay != 0)
    b = g if first else momentum * b + (1 - dampening) * g     (momentum != 0)
    g = g + momentum * b if nesterov else b                    (momentum != 0)
    p = p - lr * g

torch starts a momentum buffer as a copy of the first step's ``g``: callers start it as zeros
and pass a ``firsts`` flag for its first step, or none where ``dampening`` is 0 (then the
general rule on zeros gives ``g`` exactly). With ``found_inf`` (a 0-d float32 tensor, nonzero
when the scaled gradients overflowed) nothing is written: the skip happens on the device, with
no host synchronisation.

The native backend runs ``torch._fused_sgd_`` (torch's own fused step, CPU and CUDA), and
torch's ``_foreach_*`` ops on devices without it, for fp16/bf16 params on the CPU (where torch's
fused kernel skips their vectorised part, pytorch/pytorch#191763) and for calls with ``firsts``
flags (which ``_fused_sgd_`` cannot take per tensor).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from fusedops import dispatch
from fusedops.kernels.shared.sgd import step_arguments
from fusedops.ops._define import define_op
from fusedops.ops._transfer import to_device

#: Nothing public here: the optimizer is fusedops.optim.FusedSGD.
__all__: list[str] = []


def _compute_dtype(param: torch.Tensor) -> torch.dtype:
    return torch.float64 if param.dtype == torch.float64 else torch.float32


def _reference_step(*lists: list[torch.Tensor], **options: Any) -> None:
    """Plain-PyTorch SGD update of each tensor (the test oracle), from the definition: the five
    lists of the layout above, the hyperparameters by keyword (``StepOptions``)."""
    lists, o = step_arguments(lists, options)
    params, grads, momentum_buffers, masters, firsts = lists
    skip = None if o.found_inf is None else o.found_inf != 0
    for i, param in enumerate(params):
        compute = _compute_dtype(param)
        p = (masters[i] if masters else param).to(compute, copy=True)
        g = grads[i].to(compute, copy=True)
        unscaled = None
        if o.grad_scale is not None:
            g = g / o.grad_scale.to(compute)
            unscaled = g
        if o.maximize:
            g = -g
        if o.weight_decay != 0:
            g = g + o.weight_decay * p
        updates = []
        if o.momentum != 0:
            b = momentum_buffers[i].to(compute) * o.momentum + (1 - o.dampening) * g
            if firsts:
                b = torch.where(firsts[i] != 0, g, b)
            g = g + o.momentum * b if o.nesterov else b
            updates.append((momentum_buffers[i], b))
        rate = o.lr if o.lr_tensor is None else o.lr_tensor.to(compute)
        p = p - rate * g
        updates.append((param, p))
        if masters:
            updates.append((masters[i], p))
        if unscaled is not None:
            updates.append((grads[i], unscaled))
        for target, value in updates:
            value = value.to(target.dtype)
            target.copy_(value if skip is None else torch.where(skip, target, value))


reference = SimpleNamespace(step=_reference_step)


def _fused_devices() -> tuple[str, ...]:
    """The device types torch's fused optimizer kernels run on."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
    except ImportError:  # a torch without the helper
        return ("cpu", "cuda")
    return tuple(_get_fused_kernels_supported_devices())


def _write(targets: list[torch.Tensor], values: list[torch.Tensor], skip) -> None:
    """``targets`` receive ``values`` (converted to their dtypes); where ``skip`` (a 0-d bool
    tensor on their device, or None) is true they keep their own."""
    if not targets:
        return
    if skip is None:
        torch._foreach_copy_(targets, values)
        return
    for target, value in zip(targets, values):
        target.copy_(torch.where(skip, target, value.to(target.dtype)))


def _foreach_step(lists: list[list[torch.Tensor]], o) -> None:
    """The update through torch's ``_foreach_*`` ops on compute-dtype copies (devices without
    ``_fused_sgd_``, and calls with ``firsts`` flags)."""
    params, grads, momentum_buffers, masters, firsts = lists
    compute = _compute_dtype(params[0])
    skip = None if o.found_inf is None else o.found_inf != 0
    p = [t.to(compute, copy=True) for t in (masters or params)]
    g = [t.to(compute, copy=True) for t in grads]
    targets: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    if o.grad_scale is not None:
        torch._foreach_div_(g, o.grad_scale.to(compute))
        targets, values = [*grads], [t.clone() for t in g]
    if o.maximize:
        torch._foreach_neg_(g)
    if o.weight_decay != 0:
        torch._foreach_add_(g, p, alpha=o.weight_decay)
    if o.momentum != 0:
        b = [t.to(compute, copy=True) for t in momentum_buffers]
        torch._foreach_mul_(b, o.momentum)
        torch._foreach_add_(b, g, alpha=1 - o.dampening)
        if firsts:
            b = [torch.where(first != 0, gi, bi) for first, gi, bi in zip(firsts, g, b)]
        if o.nesterov:
            torch._foreach_add_(g, b, alpha=o.momentum)
        else:
            g = b
        targets, values = [*targets, *momentum_buffers], [*values, *b]
    if o.lr_tensor is None:
        torch._foreach_add_(p, g, alpha=-o.lr)
    else:
        torch._foreach_sub_(p, torch._foreach_mul(g, o.lr_tensor.to(compute)))
    targets, values = [*targets, *params], [*values, *p]
    if masters:
        targets, values = [*targets, *masters], [*values, *p]
    _write(targets, values, skip)


def _native_step(*lists: list[torch.Tensor], **options: Any) -> None:
    """``_reference_step`` through ``torch._fused_sgd_`` (torch's own fused step, CPU and
    CUDA): the momentum buffers continue (``is_first_step=False``: callers start them as zeros,
    exact where dampening is 0), grad_scale and found_inf handled by torch on the device. With
    master weights torch's step runs on the fp32 masters with fp32 copies of the gradients; the
    params (and, with grad_scale, the gradients) receive the results rounded. Calls with
    ``firsts`` flags, fp16/bf16 params on the CPU and devices without ``_fused_sgd_`` take
    ``_foreach_step``."""
    lists, o = step_arguments(lists, options)
    params, grads, momentum_buffers, masters, firsts = lists
    device, dtype = params[0].device.type, params[0].dtype
    # torch's CPU kernel leaves the vectorised part of fp16/bf16 tensors unchanged (torch 2.12
    # and 2.13, pytorch/pytorch#191763): 16-bit params on the CPU take the _foreach_ ops
    cpu_low_precision = device == "cpu" and dtype in (torch.float16, torch.bfloat16)
    if firsts or cpu_low_precision or device not in _fused_devices():
        _foreach_step(lists, o)
        return
    update_grads = [g.to(torch.float32, copy=True) for g in grads] if masters else grads
    torch._fused_sgd_(
        masters or params,
        update_grads,
        momentum_buffers if o.momentum != 0 else [],
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        lr=o.lr if o.lr_tensor is None else o.lr_tensor,
        dampening=o.dampening,
        nesterov=o.nesterov,
        maximize=o.maximize,
        is_first_step=False,
        grad_scale=o.grad_scale,
        found_inf=o.found_inf,
    )
    if masters:  # torch unscaled the fp32 copies in place where grad_scale is given
        written, sources = list(params), list(masters)
        if o.grad_scale is not None:
            written, sources = [*written, *grads], [*sources, *update_grads]
        _write(written, sources, None if o.found_inf is None else o.found_inf != 0)


native = SimpleNamespace(step=_native_step)

# Triton first on CUDA tensors, as for Adam, whose multi-tensor Triton step measured faster
# than its CUDA one on an H100 (benchmarks/GPU_STATUS.md); SGD's own kernels are unmeasured.
dispatch.register_op(
    "sgd",
    reference,
    kernels="sgd",
    preference=("triton", "cuda"),
    native=native,
)


def sgd_step_body(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum_buffers: list[torch.Tensor],
    masters: list[torch.Tensor],
    firsts: list[torch.Tensor],
    lr: float,
    lr_tensor: torch.Tensor | None,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
    backend: str | None = None,
) -> None:
    """The body of the custom op ``fusedops::sgd_step`` (what the op runs, and what plain eager
    calls run directly): one SGD step of a group of tensors, in place. Its arguments are the
    op's, in the op's order, as ``sgd_step`` passes them.

    The lists are elementwise aligned with ``params`` (one device, one param dtype: fp32/fp16/
    bf16 on the kernels, also fp64 on the reference and native backends; zero-element params
    allowed and left alone); see the module docstring for their layout and the math. ``lr`` is a
    Python float, or 0.0 with ``lr_tensor`` a 0-d float32 tensor on the params' device that
    replaces it. ``grad_scale`` and ``found_inf`` are None or 0-d float32 tensors on the params'
    device. ``backend``: "cuda" | "triton" | "native" | "reference", or None for the dispatch
    rule. Returns None. ``fusedops.xla.optim_math`` runs it on copies, on the reference
    backend, to trace FusedSGD's step."""
    kernel_lists = _nonempty(params, grads, momentum_buffers, masters, firsts)
    if not kernel_lists[0]:
        return
    implementation = dispatch.select("sgd", kernel_lists[0][0], backend=backend)
    implementation.step(
        *kernel_lists,
        lr=lr,
        lr_tensor=lr_tensor,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        maximize=maximize,
        grad_scale=grad_scale,
        found_inf=found_inf,
    )


def _sgd_step_fake(*args, **kwargs) -> None:
    return None


# It writes its lists in place: mutates_args, no backward. In plain eager mode the body runs
# directly (define_op), elsewhere the custom op.
SGD_STEP = define_op(
    "sgd_step",
    forward=sgd_step_body,
    fake=_sgd_step_fake,
    mutates_args=("params", "grads", "momentum_buffers", "masters"),
)


def _nonempty(*lists: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The lists restricted to the params with at least one element (optional lists stay
    empty)."""
    sizes = list(map(torch.Tensor.numel, lists[0]))
    if all(sizes):
        return list(lists)
    keep = [i for i, size in enumerate(sizes) if size > 0]
    return [[values[i] for i in keep] if values else [] for values in lists]


def sgd_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum_buffers: list[torch.Tensor],
    masters: list[torch.Tensor],
    firsts: list[torch.Tensor],
    *,
    lr: float | torch.Tensor,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    maximize: bool = False,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """One SGD step of a group of tensors, in place (torch.optim.SGD's math).

    All tensors are on one device; params share one dtype (fp32/fp16/bf16 on the kernels, also
    fp64 on the reference and native backends); zero-element params are allowed. See the module
    docstring for the lists' layout (``momentum_buffers`` empty when momentum is 0, ``masters``
    and ``firsts`` empty when unused). ``lr`` is a float or a 1-element tensor (read on the
    device); ``grad_scale`` (0-d float32) unscales the gradients; ``found_inf`` (0-d float32,
    nonzero: skip) skips the whole update on the device. backend: "cuda" | "triton" | "native" |
    "reference" to force one (default: the dispatch rule; native: torch._fused_sgd_).
    """
    if not params:
        return
    lr_tensor = None
    if isinstance(lr, torch.Tensor):
        # (from an accelerator onto host params: a blocking copy, fusedops/ops/_transfer.py)
        lr_tensor = to_device(lr.detach().reshape(()), params[0].device, torch.float32)
        lr = 0.0
    SGD_STEP(
        params,
        grads,
        momentum_buffers,
        masters,
        firsts,
        float(lr),
        lr_tensor,
        float(momentum),
        float(dampening),
        float(weight_decay),
        bool(nesterov),
        bool(maximize),
        grad_scale,
        found_inf,
        backend,
    )

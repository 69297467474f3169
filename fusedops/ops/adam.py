"""Adam / AdamW update of a group of tensors (one device, one param dtype) in one call.

Every backend implements ``step(*lists, **options)`` (fusedops/kernels/shared/adam.py: the seven
lists positionally, the hyperparameters of ``StepOptions`` by keyword); the lists hold
tensors with at least one element, all on one device, each dense (contiguous, or sharing its
param's strides), elementwise aligned with its param:

- params: the parameters (fp32/fp16/bf16; fp64 on the reference backend), updated in place;
- grads: their gradients (param dtype); written back unscaled when ``grad_scale`` is given;
- exp_avgs, exp_avg_sqs (and max_exp_avg_sqs when amsgrad, else empty): the moments, in the
  param dtype, or float32 when master weights are used;
- masters: float32 master copies of the params (empty list: no master weights); when given the
  update is computed on them and the params receive the result rounded to their dtype;
- steps: one float32 0-d tensor per param on the params' device, already incremented for this
  step (``adam_step`` increments them, and decrements them again where ``found_inf`` is set).

Besides the hyperparameters, ``step`` takes three optional 0-d float32 tensors on the params'
device, all read on the device: ``grad_scale``, ``found_inf`` and ``clip_coef`` (gradient
clipping: the factor ``min(1, max_norm / (norm + 1e-6))`` that ``clip_grad_norm_`` would
multiply the gradients by, applied to the gradient inside the update; the gradients in memory
are never clipped).

The math is torch.optim.Adam's (``decoupled=True``: AdamW), in fp32 for fp16/bf16 params::

    g = grad / grad_scale   (written back: the unscaled gradient)
    g = g * clip_coef;  g = -g if maximize
    p = p * (1 - lr * wd) if decoupled else (g = g + wd * p)
    m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g;  vmax = max(vmax, v)
    p = p - lr / (1 - beta1**step) * m / (sqrt(v or vmax) / sqrt(1 - beta2**step) + eps)

With ``found_inf`` (a 0-d float32 tensor, nonzero when the scaled gradients overflowed) nothing
is written: the skip happens on the device, with no host synchronisation.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from fusedops import dispatch
from fusedops.kernels.shared.adam import step_arguments
from fusedops.ops._define import define_op
from fusedops.ops._transfer import to_device

#: Nothing public here: the optimizers are fusedops.optim.FusedAdam / FusedAdamW.
__all__: list[str] = []


def _reference_step(*lists: list[torch.Tensor], **options: Any) -> None:
    """Plain-PyTorch Adam/AdamW update of each tensor (the CPU path and the test oracle): the
    seven lists of the layout above, the hyperparameters by keyword (``StepOptions``)."""
    lists, o = step_arguments(lists, options)
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps = lists
    skip = None if o.found_inf is None else o.found_inf != 0
    rate = o.lr if o.lr_tensor is None else o.lr_tensor.to(torch.float32)
    for i, param in enumerate(params):
        compute = torch.float64 if param.dtype == torch.float64 else torch.float32
        # In place when nothing may have to be undone (no found_inf) and nothing is rounded.
        work = lambda t: t if skip is None and t.dtype == compute else t.to(compute, copy=True)  # noqa: B023
        p = work(masters[i] if masters else param)
        g = grads[i].to(compute, copy=True)
        if o.grad_scale is not None:
            g.div_(o.grad_scale.to(compute))
        unscaled = g.clone() if o.grad_scale is not None else None
        if o.clip_coef is not None:
            g.mul_(o.clip_coef.to(compute))
        if o.maximize:
            g.neg_()
        if o.weight_decay != 0:
            if o.decoupled:
                p.mul_(1 - rate * o.weight_decay)
            else:
                g.add_(p, alpha=o.weight_decay)
        m = work(exp_avgs[i]).lerp_(g, 1 - o.beta1)
        v = work(exp_avg_sqs[i]).mul_(o.beta2).addcmul_(g, g, value=1 - o.beta2)
        step = steps[i].to(compute)
        bias_correction1 = 1 - torch.pow(o.beta1, step)
        bias_correction2_sqrt = (1 - torch.pow(o.beta2, step)).sqrt()
        v_hat = v
        if o.amsgrad:
            v_hat = torch.maximum(max_exp_avg_sqs[i].to(compute), v)
        denom = v_hat.sqrt().div_(bias_correction2_sqrt).add_(o.eps)
        p.sub_(m.div(denom).mul_(rate / bias_correction1))

        updates = [(param, p), (exp_avgs[i], m), (exp_avg_sqs[i], v)]
        if o.amsgrad:
            updates.append((max_exp_avg_sqs[i], v_hat))
        if masters:
            updates.append((masters[i], p))
        if unscaled is not None:
            updates.append((grads[i], unscaled))
        for target, value in updates:
            if skip is not None:
                value = torch.where(skip, target.to(compute), value)
            if value is not target:
                target.copy_(value)


reference = SimpleNamespace(step=_reference_step)


def _native_step(*lists: list[torch.Tensor], **options: Any) -> None:
    """``_reference_step`` through ``torch._fused_adam_`` / ``torch._fused_adamw_`` (torch's own
    fused step, CPU and CUDA): the same steps convention (already incremented), grad_scale and
    found_inf handled by torch on the device. With master weights torch's step runs on the fp32
    masters with fp32 copies of the gradients; the params receive the masters rounded. With
    ``clip_coef`` torch's step reads clipped copies of the gradients (the gradients in memory
    keep their unclipped values, unscaled when ``grad_scale`` is given); 16-bit params without
    master weights then take the reference's formula (a 16-bit copy would round the clipped
    gradient)."""
    lists, o = step_arguments(lists, options)
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps = lists
    clipped = o.clip_coef is not None
    if clipped and not masters and params[0].dtype in (torch.float16, torch.bfloat16):
        _reference_step(*lists, **options)
        return
    fused = torch._fused_adamw_ if o.decoupled else torch._fused_adam_
    update_grads = grads
    if clipped or masters:
        update_grads = [g.to(torch.float32 if masters else g.dtype, copy=True) for g in grads]
        if clipped:
            torch._foreach_mul_(update_grads, o.clip_coef.to(update_grads[0].dtype))
    fused(
        masters or params,
        update_grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        steps,
        lr=o.lr if o.lr_tensor is None else o.lr_tensor,
        beta1=o.beta1,
        beta2=o.beta2,
        weight_decay=o.weight_decay,
        eps=o.eps,
        amsgrad=o.amsgrad,
        maximize=o.maximize,
        grad_scale=o.grad_scale,
        found_inf=o.found_inf,
    )
    written, sources = (list(params), list(masters)) if masters else ([], [])
    if o.grad_scale is not None and update_grads is not grads:
        # torch unscaled update_grads in place; clipped copies hold the clipped values instead
        unscaled = update_grads
        if clipped:
            unscaled = list(torch._foreach_div([g.to(torch.float32) for g in grads], o.grad_scale))
        written, sources = [*written, *grads], [*sources, *unscaled]
    if not written:
        return
    if o.found_inf is None:
        torch._foreach_copy_(written, sources)
    else:  # no host sync: keep the old values where found_inf is set
        skip = o.found_inf != 0
        for target, source in zip(written, sources):
            target.copy_(torch.where(skip, target, source.to(target.dtype)))


native = SimpleNamespace(step=_native_step)

# Triton first on CUDA tensors: on an H100 (benchmarks/bench_adam.py) its step reached 96% of
# copy bandwidth on a 1.1B-parameter list in fp32 and bf16, the CUDA kernel 90% and 76%.
dispatch.register_op(
    "adam",
    reference,
    kernels="adam",
    preference=("triton", "cuda"),
    native=native,
)


def adam_step_body(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    masters: list[torch.Tensor],
    steps: list[torch.Tensor],
    lr: float,
    lr_tensor: torch.Tensor | None,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
    clip_coef: torch.Tensor | None,
    backend: str | None = None,
) -> None:
    """The body of the custom op ``fusedops::adam_step`` (what the op runs, and what plain eager
    calls run directly): one Adam / AdamW step of a group of tensors, in place. Its arguments
    are the op's, in the op's order, as ``adam_step`` passes them.

    The seven lists are elementwise aligned with ``params`` (one device, one param dtype:
    fp32/fp16/bf16 on the kernels, also fp64 on the reference backend; zero-element params
    allowed): ``grads`` in the param dtype; ``exp_avgs``, ``exp_avg_sqs`` and
    ``max_exp_avg_sqs`` (empty unless ``amsgrad``) in the param dtype, or float32 with master
    weights; ``masters`` float32 copies of the params (empty: no master weights); ``steps`` one
    float32 0-d tensor per param. ``lr`` is a Python float, or 0.0 with ``lr_tensor`` a 0-d
    float32 tensor on the params' device that replaces it. ``grad_scale``, ``found_inf`` and
    ``clip_coef`` are None or 0-d float32 tensors on the params' device (see the module
    docstring for the math). ``backend``: "cuda" | "triton" | "native" | "reference", or None
    for the dispatch rule.

    Every ``steps`` tensor is incremented by one; then the backend picked for the params with
    at least one element updates them in place (params, moments, masters, and the gradients
    when ``grad_scale`` unscales them), writing nothing where ``found_inf`` is nonzero; then,
    with ``found_inf``, its value (0.0 or 1.0 from a GradScaler) is subtracted from every step,
    so a skipped step does not count. Returns None. Callers outside the op use it to run the
    op's exact math on tensors they own (``fusedops.xla.optim_math`` runs it on copies, on the
    reference backend)."""
    torch._foreach_add_(steps, 1)
    kernel_lists = _nonempty(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps)
    if kernel_lists[0]:
        implementation = dispatch.select("adam", kernel_lists[0][0], backend=backend)
        implementation.step(
            *kernel_lists,
            lr=lr,
            lr_tensor=lr_tensor,
            beta1=beta1,
            beta2=beta2,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled=decoupled,
            grad_scale=grad_scale,
            found_inf=found_inf,
            clip_coef=clip_coef,
        )
    if found_inf is not None:
        torch._foreach_sub_(steps, [found_inf] * len(steps))


def _adam_step_fake(*args, **kwargs) -> None:
    return None


# It writes its lists in place: mutates_args, no backward. In plain eager mode the body runs
# directly (define_op), elsewhere the custom op.
ADAM_STEP = define_op(
    "adam_step",
    forward=adam_step_body,
    fake=_adam_step_fake,
    mutates_args=(
        "params",
        "grads",
        "exp_avgs",
        "exp_avg_sqs",
        "max_exp_avg_sqs",
        "masters",
        "steps",
    ),
)


def _nonempty(*lists: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The lists restricted to the params with at least one element (optional lists stay
    empty)."""
    sizes = list(map(torch.Tensor.numel, lists[0]))
    if all(sizes):
        return list(lists)
    keep = [i for i, size in enumerate(sizes) if size > 0]
    return [[values[i] for i in keep] if values else [] for values in lists]


def adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    masters: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    amsgrad: bool = False,
    maximize: bool = False,
    decoupled: bool = False,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
    clip_coef: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """One Adam (``decoupled=False``) or AdamW step of a group of tensors, in place.

    All tensors are on one device; params share one dtype (fp32/fp16/bf16 on the kernels, also
    fp64 on the reference); zero-element params are allowed (only their step advances). See the
    module docstring for the lists' layout. ``lr`` is a float or a 1-element tensor (read on the
    device). ``steps`` are incremented here; ``grad_scale`` (0-d float32) unscales the gradients;
    ``found_inf`` (0-d float32, nonzero: skip) skips the whole update on the device;
    ``clip_coef`` (0-d float32 on the params' device, e.g. ``min(1, max_norm / (norm + 1e-6))``)
    multiplies the (unscaled) gradient inside the update, the gradients in memory keep theirs.
    backend: "cuda" | "triton" | "native" | "reference" to force one (default: the dispatch
    rule; native: torch._fused_adam_ / torch._fused_adamw_).
    """
    if not params:
        return
    lr_tensor = None
    if isinstance(lr, torch.Tensor):
        # (from an accelerator onto host params: a blocking copy, fusedops/ops/_transfer.py)
        lr_tensor = to_device(lr.detach().reshape(()), params[0].device, torch.float32)
        lr = 0.0
    ADAM_STEP(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        masters,
        steps,
        float(lr),
        lr_tensor,
        float(beta1),
        float(beta2),
        float(eps),
        float(weight_decay),
        bool(amsgrad),
        bool(maximize),
        bool(decoupled),
        grad_scale,
        found_inf,
        clip_coef,
        backend,
    )

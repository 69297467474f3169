"""torch.optim's SGD / Adam / AdamW updates (single-tensor path) as functional tensor math.

Each ``*_update`` takes a parameter, its gradient, its state (same names and layout as
``torch.optim``: ``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``) and the group's hyperparameters, with ``lr`` a 0-d float64 tensor, and
returns ``(new_param, new_state)`` without writing anything in place. Python-float math in
torch (bias corrections) is float64 here, and scalars are cast to the parameter's dtype where
torch casts them, so results match ``torch.optim`` to rounding.

fusedops' ``FusedAdam`` / ``FusedAdamW`` / ``FusedSGD`` (kinds ``"FusedAdam"``, ``"FusedAdamW"``,
``"FusedSGD"``) keep their own state layout (FusedAdam: float32 ``step``; with
``master_weights``, float32 moments or momentum buffer and ``master_param``) and their update is
the body of fusedops' ``adam_step`` / ``sgd_step`` op (``fusedops.ops.adam.adam_step_body``,
``fusedops.ops.sgd.sgd_step_body``) on its reference backend, run on copies of the traced
tensors, so the traced step has exactly the optimizer's math (fp32 for 16-bit params, master
weights). (The ops themselves cannot be traced here: ``torch.func.functionalize`` does not
functionalize custom ops that write tensor lists.)
"""

from __future__ import annotations

import torch

from fusedops.xla.errors import XLATraceError

SUPPORTED = ("SGD", "Adam", "AdamW")
FUSED = ("FusedAdam", "FusedAdamW", "FusedSGD")

#: hyperparameters that shape the compiled program (lr is an input and never recompiles)
STATIC_KEYS = {
    "SGD": ("momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "Adam": ("betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"),
}
STATIC_KEYS["AdamW"] = STATIC_KEYS["Adam"]
STATIC_KEYS["FusedAdam"] = STATIC_KEYS["FusedAdamW"] = (*STATIC_KEYS["Adam"], "master_weights")
STATIC_KEYS["FusedSGD"] = (*STATIC_KEYS["SGD"], "master_weights")
#: optimizer attributes that shape the program of a fused optimizer (gradient clipping)
FUSED_STATIC_ATTRIBUTES = ("max_grad_norm", "norm_type")


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    from fusedops.optim.adam import is_fused_adam
    from fusedops.optim.sgd import is_fused_sgd

    return is_fused_adam(optimizer) or is_fused_sgd(optimizer)


def kind(optimizer: torch.optim.Optimizer) -> str:
    """'SGD', 'Adam', 'AdamW', 'FusedAdam', 'FusedAdamW' or 'FusedSGD'; XLATraceError naming
    any other optimizer, and for a fused one that a ``torch.amp.GradScaler`` drives (xla_trace
    has no loss scaling)."""
    if _fused(optimizer):
        if getattr(optimizer, "grad_scale", None) is not None or (
            getattr(optimizer, "found_inf", None) is not None
        ):
            raise XLATraceError(
                f"xla_trace: {type(optimizer).__name__} with a GradScaler's grad_scale/found_inf "
                "is not supported (no loss scaling inside xla_trace)"
            )
        if isinstance(optimizer, torch.optim.SGD):
            return "FusedSGD"
        return "FusedAdamW" if isinstance(optimizer, torch.optim.AdamW) else "FusedAdam"
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls.__name__ in SUPPORTED:
            name = "AdamW" if isinstance(optimizer, torch.optim.AdamW) else cls.__name__
            return name
    raise XLATraceError(
        f"xla_trace: optimizer {type(optimizer).__name__} is not supported "
        f"(supported: {', '.join(SUPPORTED)})"
    )


def stateless(name: str, group: dict, p: torch.Tensor) -> bool:
    """Whether the optimizer keeps no state for ``p`` (torch's SGD without momentum; FusedSGD
    without momentum nor a master copy): its ``state`` is then left untouched."""
    if name == "SGD":
        return group["momentum"] == 0
    if name == "FusedSGD":
        low_precision = p.dtype in (torch.float16, torch.bfloat16)
        return group["momentum"] == 0 and not (group["master_weights"] and low_precision)
    return False


def init_state(name: str, group: dict, p: torch.Tensor, state: dict, optimizer=None) -> None:
    """Create ``state`` for ``p`` as torch.optim's first ``step`` would, where the first step's
    math is the same as a later one's on zero state (so one program serves every step). Fused
    optimizers (``optimizer``) create and check their own state (FusedSGD starts a momentum
    buffer here only where dampening is 0, as for SGD; its pending first-step flags of eager
    steps under a GradScaler are dropped: the traced steps write the buffer)."""
    if name == "FusedSGD":
        optimizer._state_for(p, group, start_buffer=group["dampening"] == 0)
        optimizer._fusedops_first.pop(id(p), None)
        return
    if name in FUSED:
        optimizer._state_for(p, group)
        return
    if name == "SGD":
        if group["momentum"] != 0 and "momentum_buffer" not in state and group["dampening"] == 0:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.get_default_dtype())
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def state_names(name: str, group: dict, state: dict) -> tuple[str, ...]:
    """The state entries the update reads and writes, in a fixed order."""
    if name == "SGD":
        return ("momentum_buffer",) if "momentum_buffer" in state else ()
    if name == "FusedSGD":
        return tuple(n for n in ("momentum_buffer", "master_param") if n in state)
    names = ("step", "exp_avg", "exp_avg_sq")
    names += ("max_exp_avg_sq",) if group["amsgrad"] else ()
    return names + (("master_param",) if name in FUSED and "master_param" in state else ())


def sgd_update(p, grad, state: dict, group: dict, lr):
    """One ``torch.optim.SGD`` step for one parameter (functional)."""
    grad = -grad if group["maximize"] else grad
    if group["weight_decay"] != 0:
        grad = grad + p * group["weight_decay"]
    new_state = {}
    momentum = group["momentum"]
    if momentum != 0:
        buf = state.get("momentum_buffer")
        first = buf is None  # torch.optim's first step: the buffer starts as the gradient
        buf = grad.clone() if first else buf * momentum + grad * (1 - group["dampening"])
        new_state["momentum_buffer"] = buf
        grad = grad + buf * momentum if group["nesterov"] else buf
    return p - grad * lr.to(p.dtype), new_state


def adam_update(p, grad, state: dict, group: dict, lr, decoupled: bool):
    """One ``torch.optim.Adam`` / ``AdamW`` step for one parameter (functional)."""
    beta1, beta2 = group["betas"]
    wd, eps = group["weight_decay"], group["eps"]
    grad = -grad if group["maximize"] else grad
    step = state["step"] + 1
    if wd != 0:
        if decoupled:
            p = p * (1 - lr * wd).to(p.dtype)
        else:
            grad = grad + p * wd
    exp_avg = state["exp_avg"] + (grad - state["exp_avg"]) * (1 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + grad * grad * (1 - beta2)
    step64 = step.to(torch.float64)
    bias_correction1 = 1 - torch.pow(beta1, step64)
    bias_correction2 = 1 - torch.pow(beta2, step64)
    step_size = (lr / bias_correction1).to(p.dtype)
    bc2_sqrt = (bias_correction2**0.5).to(p.dtype)
    new_state = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    second = exp_avg_sq
    if group["amsgrad"]:
        second = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
        new_state["max_exp_avg_sq"] = second
    denom = second.sqrt() / bc2_sqrt + eps
    return p - step_size * (exp_avg / denom), new_state


def fused_adam_update(p, grad, state: dict, group: dict, lr, decoupled: bool, clip_coef=None):
    """One FusedAdam / FusedAdamW step for one parameter: the body of fusedops' ``adam_step``
    op (reference backend: plain torch ops) on copies of ``p`` and its state (functional);
    ``clip_coef`` (0-d float32 or None): the gradient clipping factor of the step."""
    from fusedops.ops.adam import adam_step_body

    beta1, beta2 = group["betas"]
    new = {n: t.clone() for n, t in state.items()}
    p, grad = p.clone(), grad.to(p.dtype)
    if p.is_complex():  # as FusedAdam: real and imaginary parts are independent
        real = {n: torch.view_as_real(t) if t.is_complex() else t for n, t in new.items()}
        new_p, new_real = fused_adam_update(
            torch.view_as_real(p), torch.view_as_real(grad), real, group, lr, decoupled, clip_coef
        )
        back = {n: torch.view_as_complex(t) if new[n].is_complex() else t
                for n, t in new_real.items()}  # fmt: skip
        return torch.view_as_complex(new_p), back
    amsgrad = group["amsgrad"]
    adam_step_body(
        [p], [grad], [new["exp_avg"]], [new["exp_avg_sq"]],
        [new["max_exp_avg_sq"]] if amsgrad else [],
        [new["master_param"]] if "master_param" in new else [], [new["step"]],
        0.0, lr.reshape(()).to(torch.float32), float(beta1), float(beta2), float(group["eps"]),
        float(group["weight_decay"]), bool(amsgrad), bool(group["maximize"]), decoupled,
        None, None, clip_coef, "reference",
    )  # fmt: skip
    return p, new


def fused_sgd_update(p, grad, state: dict, group: dict, lr):
    """One FusedSGD step for one parameter: the body of fusedops' ``sgd_step`` op (reference
    backend: plain torch ops) on copies of ``p`` and its state (functional). A momentum buffer
    missing from ``state`` is started as FusedSGD's first step starts it (zeros and a first-step
    flag)."""
    from fusedops.ops.sgd import sgd_step_body

    new = {n: t.clone() for n, t in state.items()}
    p, grad = p.clone(), grad.to(p.dtype)
    if p.is_complex():  # as FusedSGD: real and imaginary parts are independent
        real = {n: torch.view_as_real(t) if t.is_complex() else t for n, t in new.items()}
        new_p, new_real = fused_sgd_update(
            torch.view_as_real(p), torch.view_as_real(grad), real, group, lr
        )
        # (a complex param's state is its momentum buffer alone, complex too)
        return torch.view_as_complex(new_p), {
            n: torch.view_as_complex(t) for n, t in new_real.items()
        }
    momentum = float(group["momentum"])
    firsts = []
    if momentum != 0 and "momentum_buffer" not in new:
        dtype = torch.float32 if "master_param" in new else p.dtype
        new["momentum_buffer"] = torch.zeros_like(p, dtype=dtype)
        firsts = [torch.ones((), dtype=torch.float32, device=p.device)]
    sgd_step_body(
        [p], [grad], [new["momentum_buffer"]] if momentum != 0 else [],
        [new["master_param"]] if "master_param" in new else [], firsts,
        0.0, lr.reshape(()).to(device=p.device, dtype=torch.float32), momentum,
        float(group["dampening"]), float(group["weight_decay"]), bool(group["nesterov"]),
        bool(group["maximize"]), None, None, "reference",
    )  # fmt: skip
    return p, new


def clip_step(optimizer, grads: list[torch.Tensor]) -> tuple:
    """(total norm, clipping factor) of a fused optimizer's step over ``grads`` (every gradient
    it updates), as its eager step computes them; (None, None) without ``max_grad_norm``."""
    max_norm = getattr(optimizer, "max_grad_norm", None) if _fused(optimizer) else None
    if max_norm is None:
        return None, None
    from fusedops.ops import grad_norm

    norm = grad_norm.total_norm(grads, optimizer.norm_type)
    return norm, grad_norm.clip_coefficient(norm, max_norm)


def update(name: str, p, grad, state: dict, group: dict, lr, clip_coef=None):
    """Dispatch to the update of optimizer ``name`` (``SUPPORTED`` or ``FUSED``);
    ``clip_coef``: a fused optimizer's gradient clipping factor (``clip_step``)."""
    if name == "FusedSGD":
        return fused_sgd_update(p, grad, state, group, lr)
    if name in FUSED:
        decoupled = name == "FusedAdamW" or bool(group.get("decoupled_weight_decay", False))
        return fused_adam_update(p, grad, state, group, lr, decoupled, clip_coef)
    if name == "SGD":
        return sgd_update(p, grad, state, group, lr)
    decoupled = name == "AdamW" or bool(group.get("decoupled_weight_decay", False))
    return adam_update(p, grad, state, group, lr, decoupled)

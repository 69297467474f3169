"""torch.optim's SGD / Adam / AdamW updates (single-tensor path) as functional tensor math.

Each ``*_update`` takes a parameter, its gradient, its state (same names and layout as
``torch.optim``: ``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``) and the group's hyperparameters, with ``lr`` a 0-d float64 tensor, and
returns ``(new_param, new_state)`` without writing anything in place. Python-float math in
torch (bias corrections) is float64 here, and scalars are cast to the parameter's dtype where
torch casts them, so results match ``torch.optim`` to rounding.
"""

from __future__ import annotations

import torch

from fusedops.xla.errors import XLATraceError

SUPPORTED = ("SGD", "Adam", "AdamW")

#: hyperparameters that shape the compiled program (lr is an input and never recompiles)
STATIC_KEYS = {
    "SGD": ("momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "Adam": ("betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"),
}
STATIC_KEYS["AdamW"] = STATIC_KEYS["Adam"]


def kind(optimizer: torch.optim.Optimizer) -> str:
    """'SGD', 'Adam' or 'AdamW'; XLATraceError naming any other optimizer."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls.__name__ in SUPPORTED:
            name = "AdamW" if isinstance(optimizer, torch.optim.AdamW) else cls.__name__
            return name
    raise XLATraceError(
        f"xla_trace: optimizer {type(optimizer).__name__} is not supported "
        f"(supported: {', '.join(SUPPORTED)})"
    )


def init_state(name: str, group: dict, p: torch.Tensor, state: dict) -> None:
    """Create ``state`` for ``p`` as torch.optim's first ``step`` would, where the first step's
    math is the same as a later one's on zero state (so one program serves every step)."""
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
    names = ("step", "exp_avg", "exp_avg_sq")
    return names + (("max_exp_avg_sq",) if group["amsgrad"] else ())


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


def update(name: str, p, grad, state: dict, group: dict, lr):
    """Dispatch to the update of optimizer ``name`` (see ``SUPPORTED``)."""
    if name == "SGD":
        return sgd_update(p, grad, state, group, lr)
    decoupled = name == "AdamW" or bool(group.get("decoupled_weight_decay", False))
    return adam_update(p, grad, state, group, lr, decoupled)

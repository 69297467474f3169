"""``fuse_optimizer``: a torch.optim.Adam / AdamW / SGD instance turned into FusedAdam /
FusedAdamW / FusedSGD in place.

The fused classes subclass torch's and keep its state layout, so the object keeps its identity,
param_groups and state (an LR scheduler, a GradScaler or a checkpointing helper holding it keeps
working); only its class changes, and the fused class's own options get their defaults
(``master_weights=False``, ``backend=None``; FusedAdam's ``max_grad_norm=None``). Only an
optimizer whose class is exactly one of torch's three is swapped: a subclass may override
``step`` or add state the fused class knows nothing of, so it is left as it is, as is any other
optimizer; ``unfusable_reason`` says why.
"""

from __future__ import annotations

import functools
import weakref

import torch

from fusedops.optim.adam import FusedAdam, FusedAdamW, _FusedAdamMixin, _unpatched
from fusedops.optim.sgd import FusedSGD

__all__ = ["fuse_optimizer", "unfusable_reason"]


def _fused_classes() -> dict[type, type]:
    """torch's own class (even while a hook replaces its name) -> its fused subclass."""
    return {
        _unpatched(torch.optim.Adam): FusedAdam,
        _unpatched(torch.optim.AdamW): FusedAdamW,
        _unpatched(torch.optim.SGD): FusedSGD,
    }


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, (_FusedAdamMixin, FusedSGD))


def unfusable_reason(optimizer: object) -> str | None:
    """Why ``fuse_optimizer`` leaves ``optimizer`` as it is; None where it swaps its class or
    the class is fused already. TypeError for anything that is not a torch optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if _is_fused(optimizer):
        return None
    cls = type(optimizer)
    if cls not in _fused_classes():
        torch_bases = [c for c in cls.__mro__[1:] if c in _fused_classes()]
        if torch_bases:
            return (
                f"{cls.__qualname__} subclasses torch.optim.{torch_bases[0].__name__}: its own "
                "code may rely on torch's step, so it is left as it is"
            )
        return f"no fused version of {cls.__qualname__} (fusedops fuses Adam, AdamW and SGD)"
    if any(group.get("differentiable", False) for group in optimizer.param_groups):
        return "differentiable=True: the fused step is not differentiable"
    step = optimizer.__dict__.get("step")
    if step is not None and not getattr(step, "_wrapped_by_lr_sched", False):
        return "its step() is replaced on the instance: the swap would not reach it"
    return None


def fuse_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Swap a torch.optim.Adam / AdamW / SGD instance's class for FusedAdam / FusedAdamW /
    FusedSGD, in place, and return it (the same object: param_groups and state kept; the fused
    class's extra options at their defaults: no master weights, the dispatch rule's backend, no
    clipping). An optimizer already fused, or one ``unfusable_reason`` names a reason for (a
    subclass, another optimizer, ``differentiable=True``), is returned unchanged. An LR
    scheduler's wrapper of ``step`` is rebuilt around the fused step. TypeError for anything
    that is not a torch optimizer."""
    if unfusable_reason(optimizer) is not None or _is_fused(optimizer):
        return optimizer
    fused = _fused_classes()[type(optimizer)]
    optimizer.__class__ = fused
    if fused is FusedSGD:
        optimizer._setup(master_weights=False, backend=None, differentiable=False)
    else:
        optimizer._setup(False, None, False, None, 2.0)
    optimizer._patch_step_function()  # the fused class's step runs the optimizer's step hooks
    if "step" in optimizer.__dict__:  # an LR scheduler wrapped the old class's step
        optimizer.step = _lr_scheduler_wrapper(optimizer)
    return optimizer


def _lr_scheduler_wrapper(optimizer: torch.optim.Optimizer):
    """What ``torch.optim.lr_scheduler.LRScheduler`` wraps ``optimizer.step`` in (it records the
    call for its order check), around the optimizer's class's step now."""
    reference = weakref.ref(optimizer)
    step = type(optimizer).step

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        opt = reference()
        opt._opt_called = True
        return step.__get__(opt, opt.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    return wrapper

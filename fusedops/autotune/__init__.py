"""``fusedops.optimize(model)``: one call that puts fusedops on a model and measures every choice
on the user's own device, so the model never runs slower than the code it replaces.

::

    model = MyModel().to(device)
    model = DistributedDataParallel(model)          # if any: optimize after the wrap
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = fusedops.optimize(model, optimizer=optimizer)
    for batch in loader:                            # the training loop, unchanged
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

The model's forward becomes a *region* (``fusedops.autotune.region``): on the first call of
each input signature it is timed, forward and backward, as each candidate
(``fusedops.autotune.candidates``: the user's code, the same code with fusedops' fused modules,
``torch.compile``, ``partial_trace``'s XLA programs), on the call's own inputs, leaving no trace
(``fusedops.autotune.trial``); the fastest candidate whose outputs and gradients match the
user's code runs from then on, where it beats that code by the margin (3%). Decisions are kept
in ``$FUSEDOPS_CACHE_DIR/autotune`` (``fusedops.autotune.cache``), so a second run times
nothing. The ``fusedops.autotune`` logger says at INFO what ``optimize`` changed and each
decision; ``optimize_report(model)`` returns them as a table.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable

import torch

from fusedops.autotune import candidates as _candidates
from fusedops.autotune.region import FSDP2_REFUSED, MARGIN, MAX_SIGNATURES, Region
from fusedops.autotune.region import _fsdp2 as region_fsdp2

__all__ = ["optimize", "optimize_report", "restore"]

log = logging.getLogger(__name__)

_REGION = "_fusedops_region"


def _target(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward becomes the region: the model, or the module a
    DistributedDataParallel wraps (DDP keeps calling it, its reducer sees the region's
    outputs)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    return model.module if isinstance(model, ddp) else model


def optimize(
    model: torch.nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    candidates: Iterable[str] = _candidates.DEFAULT,
    margin: float = MARGIN,
    cache: bool = True,
    max_signatures: int = MAX_SIGNATURES,
    steps: int | None = None,
) -> torch.nn.Module:
    """Make ``model`` run its fastest way on this device; returns ``model`` itself.

    Call it where the training loop starts: after ``model.to(device)`` and after wrapping in
    ``DistributedDataParallel`` (or before the wrap: both work). The model keeps its class,
    ``state_dict`` keys, parameter objects (an optimizer built before keeps working), buffers,
    ``train()``/``eval()``, hooks and attributes: only its ``forward`` is replaced, by a region
    that times the candidates on its first calls (module docstring) and then runs the pick.

    optimizer: a ``torch.optim.Adam``, ``AdamW`` or ``SGD`` whose class is swapped in place for
        fusedops' fused one (``fusedops.optim.fuse_optimizer``: the same object, param groups and
        state kept, so LR schedulers and GradScaler keep working); another optimizer is left as
        it is, with a log line.
    candidates: the ways to try, from ``"eager"`` (the model's own code; always tried, as the
        reference), ``"fused"``, ``"compile"``, ``"xla"``.
    margin: a candidate replaces the model's own code only when its time is at most this
        fraction of that code's (0 < margin <= 1).
    cache: keep and reuse decisions across runs (``$FUSEDOPS_CACHE_DIR/autotune``).
    max_signatures: input signatures (shapes, dtypes, train/eval, autocast) timed per model;
        later new ones run the last pick untimed.
    steps: optional, the calls of the model the run will make (training steps times calls
        per step). A compiling candidate (``compile``, ``xla``) is left out, with a log line,
        where the calls left cannot repay its compile: the model's own code takes less over
        them than the compile is expected to take (the longest compile measured in this
        process, else ``fusedops.autotune.region.COMPILE_ESTIMATE_S``). Without it, compiles
        are bounded by ``COMPILE_BUDGET_S`` seconds per process (600).

    On CUDA each candidate's host and device time are measured apart and its peak memory;
    one over ``MEMORY_FRACTION`` (0.9) of the memory the process could use is dropped.

    Calling it again on the same model does nothing, with a warning. TypeError: ``model`` not
    a ``torch.nn.Module``, ``optimizer`` not an optimizer; ValueError: an unknown candidate, a
    margin outside (0, 1], ``max_signatures`` < 1, ``steps`` neither None nor an int >= 1, or an
    FSDP2 (``fully_shard``) model, which
    ``optimize`` does not time yet.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimize: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if isinstance(candidates, str):
        raise TypeError("optimize: candidates must be a list of names, not a string")
    names = list(dict.fromkeys(["eager", *candidates]))
    unknown = [name for name in names if name not in _builders()]
    if unknown:
        raise ValueError(
            f"optimize: unknown candidates {unknown}; choose from {sorted(_builders())}"
        )
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin <= 1:
        raise ValueError(f"optimize: margin must be a number in (0, 1], got {margin!r}")
    if (
        isinstance(max_signatures, bool)
        or not isinstance(max_signatures, int)
        or (max_signatures < 1)
    ):
        raise ValueError(f"optimize: max_signatures must be an int >= 1, got {max_signatures!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"optimize: steps must be None or an int >= 1, got {steps!r}")
    if region_fsdp2(model):
        raise ValueError(FSDP2_REFUSED)
    target = _target(model)
    if _REGION in target.__dict__:
        warnings.warn(
            f"fusedops.optimize: {type(target).__qualname__} is optimized already; nothing done",
            stacklevel=2,
        )
        return model
    if optimizer is not None:
        _fuse_optimizer(optimizer)
    forward = type(target).forward.__get__(target)
    if "forward" in target.__dict__:
        forward = target.__dict__["forward"]
    region = Region(
        target,
        forward,
        names=names,
        margin=float(margin),
        use_cache=bool(cache),
        max_signatures=max_signatures,
        steps=steps,
    )
    target.__dict__[_REGION] = region
    target.__dict__["_fusedops_forward"] = target.__dict__.get("forward")
    target.forward = region
    log.info(
        "fusedops.optimize: on for %s: its forward is timed as %s on its first calls",
        type(target).__qualname__,
        ", ".join(names),
    )
    return model


def _builders() -> dict:
    return _candidates.BUILDERS


def _fuse_optimizer(optimizer: torch.optim.Optimizer) -> None:
    from fusedops.optim import fuse_optimizer, unfusable_reason

    before = type(optimizer).__qualname__
    why = unfusable_reason(optimizer)
    fuse_optimizer(optimizer)
    after = type(optimizer).__qualname__
    if after != before:
        log.info("fusedops.optimize: optimizer %s -> %s (in place)", before, after)
    else:
        log.info("fusedops.optimize: optimizer %s left as it is: %s", before, why)


def _region(model: torch.nn.Module) -> Region:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    region = _target(model).__dict__.get(_REGION)
    if region is None:
        raise ValueError(f"{type(model).__qualname__} was not optimized (fusedops.optimize)")
    return region


def optimize_report(model: torch.nn.Module) -> str:
    """The decisions ``optimize`` made for ``model`` as a table: per region and input
    signature, each candidate's trial time (or why it was left out), the pick, and whether it
    was timed, read from the cache, or not timed. TypeError/ValueError: not an optimized
    module."""
    rows = _region(model).rows()
    if not rows:
        return "fusedops.optimize: no call yet"
    names: list[str] = []
    for row in rows:
        names += [n for n in row["candidates"] if n not in names]
    header = ["region", "call", "signature", *names, "pick", "source"]
    table = [
        [row["region"], str(row["call"]), row["signature"]]
        + [row["candidates"].get(n, "-") for n in names]
        + [row["pick"], row["source"]]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
        for r in [header, ["-" * w for w in widths], *table]
    ]
    return "\n".join(lines)


def restore(model: torch.nn.Module) -> torch.nn.Module:
    """Undo ``optimize`` on ``model`` (its own forward and classes again; the optimizer keeps
    its fused class); returns ``model``."""
    target = _target(model)
    region = _region(model)
    region.restore()
    previous = target.__dict__.pop("_fusedops_forward", None)
    del target.__dict__[_REGION]
    if previous is None:
        target.__dict__.pop("forward", None)
    else:
        target.__dict__["forward"] = previous
    return model

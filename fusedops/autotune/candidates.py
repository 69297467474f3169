"""The ways a region can run, each a ``Candidate`` over the same parameters and buffers.

- ``eager``: the region's forward as the user wrote it (their modules, PyTorch's ops). Always a
  candidate and the reference the others are compared with: ``optimize`` is never slower than
  it by construction.
- ``fused``: the same forward with the modules fusedops' hooks cover swapped for their fused
  subclasses (``fusedops.hooks.module_swaps``: LayerNorm, RMSNorm, QuickGELU, Swin blocks, ...),
  each fused op on the backend the dispatch rule picks. The classes are swapped in while this
  candidate runs and back for the others (``Swaps``), so a region keeps its pick's classes.
- ``compile``: ``torch.compile`` of the forward (inductor, the user's modules).
- ``xla``: ``fusedops.xla.partial_trace`` of the forward (its regions as XLA programs).

A candidate that cannot be built here (no module to swap, JAX missing) is left out with its
reason. ``BUILDERS`` maps each name to its builder; tests add stand-ins there.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Candidate:
    """One way to run a region: ``run(*args, **kwargs)``; ``compiles``: whether its first run
    compiles (its cost counts against the compile budget); ``swapped``: whether it runs with
    the fused classes swapped in (``swaps``, shared by the region: the others run without);
    ``drop()`` frees what it holds when it loses; ``note``: what it is, for the log."""

    name: str
    run: Callable[..., Any]
    compiles: bool = False
    swapped: bool = False
    swaps: Any = None
    drop: Callable[[], None] = field(default=lambda: None)
    note: str = ""


class Unavailable(Exception):
    """A candidate that cannot be built here; the message says why."""


def eager(module: torch.nn.Module, forward: Callable) -> Candidate:
    """The region's forward as written."""
    return Candidate("eager", forward)


class Swaps:
    """The fused classes for a module's submodules: ``ensure(True)`` swaps them in,
    ``ensure(False)`` back; a call that asks for the state they are in changes nothing, so a
    region that keeps running one candidate pays nothing per call."""

    def __init__(self, pairs: list):
        self.pairs = [(module, type(module), fused) for module, fused in pairs]
        self.applied = False

    def ensure(self, applied: bool) -> None:
        if applied == self.applied:
            return
        from fusedops.autotune.backends import BackendPick

        for module, original, fused in self.pairs:
            module.__class__ = fused if applied else original
            if applied:  # each fused module on the backend its trials pick
                module.forward = BackendPick(module)
            else:
                module.__dict__.pop("forward", None)
        self.applied = applied


def fused(module: torch.nn.Module, forward: Callable) -> Candidate:
    """The forward with the modules fusedops covers swapped for their fused subclasses (those
    whose forward is set on the instance are left out, as ``replace_modules`` leaves them)."""
    from fusedops import hooks

    pairs = [
        (m, cls)
        for m, cls in hooks.module_swaps(module)
        if m is not module and "forward" not in m.__dict__
    ]
    if not pairs:
        raise Unavailable("no module of this model has a fused class")
    names = sorted({type(m).__name__ for m, _ in pairs})
    note = f"{len(pairs)} modules: {', '.join(names)}"
    return Candidate("fused", forward, swapped=True, swaps=Swaps(pairs), note=note)


def compiled(module: torch.nn.Module, forward: Callable) -> Candidate:
    """``torch.compile`` of the forward (inductor)."""
    return _compiling("compile", lambda: torch.compile(forward))


def _compiling(name: str, make: Callable[[], Callable]) -> Candidate:
    """A candidate running ``make()``'s program, made on first run and again after a drop."""
    program = None

    def run(*args, **kwargs):
        nonlocal program
        if program is None:
            program = make()
        return program(*args, **kwargs)

    def drop() -> None:
        nonlocal program
        program = None

    return Candidate(name, run, compiles=True, drop=drop)


def xla(module: torch.nn.Module, forward: Callable) -> Candidate:
    """``fusedops.xla.partial_trace`` of the forward."""
    if importlib.util.find_spec("jax") is None:
        raise Unavailable("jax is not installed (pip install fusedops[xla])")
    from fusedops.xla import partial_trace

    return _compiling("xla", lambda: partial_trace(forward))


#: Candidate name -> builder(module, forward) -> Candidate (raises ``Unavailable``).
BUILDERS: dict[str, Callable[[torch.nn.Module, Callable], Candidate]] = {
    "eager": eager,
    "fused": fused,
    "compile": compiled,
    "xla": xla,
}

#: The candidates ``optimize`` tries by default, in this order.
DEFAULT = ("eager", "fused", "compile", "xla")

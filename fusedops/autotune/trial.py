"""Trial runs of a region's candidates that leave no trace, timed and compared.

A trial is one forward of a candidate on the call's own inputs and, where gradients flow, one
backward by ``torch.autograd.grad`` with respect to the region's parameters and the inputs that
need gradients: nothing accumulates into ``.grad`` and no graph outside the region runs. After
each trial the region's buffers and the inputs it wrote in place get their values back (batch
norm statistics), and torch's random state (the CPU generator and every initialised CUDA
generator) is restored, so the call itself runs once, as it would have without the trials. The
optimizer step is not part of a trial.

Time is read from ``clock()`` (``time.perf_counter``; tests put a stand-in there), around a
run that ends with a device synchronisation where a tensor lives on a CUDA device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fusedops.testing import tolerance

#: Seconds, by ``time.perf_counter`` unless a test replaces it.
clock: Callable[[], float] = time.perf_counter

#: Trial rounds per candidate: at least, at most, and the seconds the rounds of one candidate
#: may take (rounds = this budget over the first timed run, within the bounds).
MIN_ROUNDS, MAX_ROUNDS, ROUNDS_BUDGET_S = 2, 8, 1.0

#: The terms a region's output or gradient element is taken to sum, for the comparison
#: tolerance: candidates sum in other orders (fused kernels, compiled code, XLA) over up to a
#: few layers of products of this length.
COMPARED_TERMS = 2**16


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``: a tensor, or nested tuples, lists, dicts (model outputs such as
    transformers' ``ModelOutput``) and dataclasses of them, in order; other leaves left out."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in flat_tensors(item)]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flat_tensors(item)]
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return [t for name in fields for t in flat_tensors(getattr(value, name, None))]
    return []


def _version(tensor: torch.Tensor) -> int | None:
    return None if tensor.is_inference() else tensor._version


def _cuda_generators() -> list[int]:
    cuda = torch.cuda
    return list(range(cuda.device_count())) if cuda.is_available() and cuda.is_initialized() else []


@dataclass
class Snapshot:
    """What a trial may change, taken before the trials: the values of the region's buffers and
    of the inputs not needing gradients, and torch's random state."""

    kept: list = field(default_factory=list)
    cpu_rng: torch.Tensor | None = None
    cuda_rng: list = field(default_factory=list)

    @classmethod
    def take(cls, module: torch.nn.Module, inputs: Iterable[torch.Tensor]) -> Snapshot:
        seen: set[int] = set()
        kept = []
        with torch.no_grad():
            for tensor in [*module.buffers(), *inputs]:
                if id(tensor) in seen or tensor.requires_grad:
                    continue
                seen.add(id(tensor))
                kept.append((tensor, _version(tensor), tensor.detach().clone()))
        cuda = [(i, torch.cuda.get_rng_state(i)) for i in _cuda_generators()]
        return cls(kept, torch.get_rng_state(), cuda)

    def restore(self) -> None:
        """Put back the values of the snapshot (every one: a kernel may write a buffer without
        moving its version counter, as batch norm's running statistics on the CPU), and the
        random state."""
        inference = torch.is_inference_mode_enabled()
        with torch.no_grad():
            for tensor, version, value in self.kept:
                if version is not None or inference:
                    tensor.copy_(value)
        torch.set_rng_state(self.cpu_rng)
        for index, state in self.cuda_rng:
            torch.cuda.set_rng_state(state, index)


@dataclass
class Result:
    """One trial: its seconds, the outputs and the gradients (with respect to ``wrt``)."""

    seconds: float
    outputs: list[torch.Tensor]
    grads: list[torch.Tensor | None]


class Trials:
    """Trial runs of candidates of one region call: ``args``/``kwargs`` are the call's, with
    each tensor needing gradients replaced by a detached alias (a trial's backward stops there);
    ``parameters``: the region's parameters needing gradients."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        self.backward = torch.is_grad_enabled()
        aliases: dict[int, torch.Tensor] = {}

        def stand_in(value):
            if isinstance(value, torch.Tensor) and self.backward and value.requires_grad:
                return aliases.setdefault(id(value), value.detach().requires_grad_(True))
            if isinstance(value, tuple):
                return tuple(stand_in(v) for v in value)
            if isinstance(value, list):
                return [stand_in(v) for v in value]
            if isinstance(value, dict):
                return {k: stand_in(v) for k, v in value.items()}
            return value

        self.args = stand_in(args)
        self.kwargs = stand_in(kwargs)
        inputs = flat_tensors([self.args, self.kwargs])
        parameters = [p for p in module.parameters() if p.requires_grad]
        self.wrt = [*parameters, *aliases.values()] if self.backward else []
        self.snapshot = Snapshot.take(module, inputs)
        self.on_cuda = any(t.is_cuda for t in [*inputs, *parameters[:1]])

    def _sync(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()

    def run(self, function: Callable) -> Result:
        """One trial of ``function`` (called with the call's arguments): seconds, outputs and
        gradients; then the snapshot is restored."""
        try:
            self._sync()
            start = clock()
            out = function(*self.args, **self.kwargs)
            outputs = [t for t in flat_tensors(out) if t.is_floating_point() or t.is_complex()]
            grads: list = []
            differentiable = [t for t in outputs if t.requires_grad]
            if self.wrt and differentiable:
                grads = list(
                    torch.autograd.grad(
                        differentiable,
                        self.wrt,
                        grad_outputs=[torch.ones_like(t) for t in differentiable],
                        allow_unused=True,
                    )
                )
            self._sync()
            seconds = clock() - start
            return Result(seconds, [t.detach() for t in outputs], grads)
        finally:
            self.snapshot.restore()

    def time(self, function: Callable, first: Result) -> float:
        """The best seconds of ``function`` over rounds of two runs each (the second timed: the
        first after another candidate's shares the cores with its idle threads), as many rounds
        as ``ROUNDS_BUDGET_S`` allows given ``first`` (a run already made)."""
        rounds = int(ROUNDS_BUDGET_S / max(first.seconds, 1e-9))
        rounds = min(max(rounds, MIN_ROUNDS), MAX_ROUNDS)
        best = math.inf
        for _ in range(rounds):
            self.run(function)
            best = min(best, self.run(function).seconds)
        return best


def _largest(tensors: list) -> float:
    found = [float(t.detach().double().abs().max()) for t in tensors if t is not None and t.numel()]
    found = [value for value in found if math.isfinite(value)]
    return max(found, default=0.0)


def mismatch(expected: Result, actual: Result) -> str | None:
    """Why ``actual``'s outputs or gradients differ from ``expected``'s (the user's code), or
    None. Each element is compared within ``fusedops.testing.tolerance`` for its dtype and
    ``COMPARED_TERMS`` summed terms, at the magnitude of the largest element of its kind (all
    outputs, or all gradients): a gradient that cancels to near zero (a bias before a batch
    norm) carries the rounding of the terms it summed, which are of the size of the others."""
    if len(expected.outputs) != len(actual.outputs):
        return f"{len(actual.outputs)} outputs where the model gives {len(expected.outputs)}"
    if len(expected.grads) != len(actual.grads):
        return f"{len(actual.grads)} gradients where the model gives {len(expected.grads)}"
    for what, wants, gots in (
        ("output", expected.outputs, actual.outputs),
        ("gradient", expected.grads, actual.grads),
    ):
        magnitude = max(_largest(wants), 1e-30)
        for index, (want, got) in enumerate(zip(wants, gots)):
            if want is None or got is None:
                if (want is None) != (got is None):
                    return f"{what} {index}: None on one side only"
                continue
            if want.shape != got.shape:
                return f"{what} {index}: shape {tuple(got.shape)} where {tuple(want.shape)}"
            wide_want, wide_got = want.double(), got.to(want.device).double()
            finite = torch.isfinite(wide_want)
            if not torch.equal(finite, torch.isfinite(wide_got)):
                return f"{what} {index}: non-finite elements differ"
            if not finite.any():
                continue
            rtol, atol = tolerance(want.dtype, terms=COMPARED_TERMS, magnitude=magnitude)
            excess = (wide_got - wide_want)[finite].abs() - rtol * wide_want[finite].abs()
            worst = float(excess.max())
            if worst > atol:
                return f"{what} {index}: differs by {worst:.3g} beyond tolerance {atol:.3g}"
    return None

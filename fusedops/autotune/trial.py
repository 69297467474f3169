"""Trial runs of a region's candidates that leave no trace, timed and compared.

A trial is one forward of a candidate on the call's own inputs and, where gradients flow, one
backward by ``torch.autograd.grad`` with respect to the region's parameters and the inputs that
need gradients: nothing accumulates into ``.grad`` and no graph outside the region runs. After
each trial the region's buffers and the inputs it wrote in place get their values back (batch
norm statistics), and torch's random state (the CPU generator and every initialised CUDA
generator) is restored, so the call itself runs once, as it would have without the trials. The
optimizer step is not part of a trial.

Time is read from ``clock()`` (``time.perf_counter``; tests put a stand-in there), around a
run that ends with a device synchronisation where a tensor lives on a CUDA device. After the
first run (which compiles, JITs Triton kernels, lets ``cudnn.benchmark`` search and the
allocator grow) warm-up runs follow until one takes within ``SETTLED`` of the one before; then
the candidates take turns over a few rounds (``Trials.time_together``) and each one's best run
is its time, and on CUDA its host and device time are measured apart
(``fusedops.autotune.measure``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fusedops.autotune import measure
from fusedops.testing import tolerance

#: Seconds, by ``time.perf_counter`` unless a test replaces it.
clock: Callable[[], float] = time.perf_counter

#: Trial rounds per candidate: at least, at most, and the seconds the rounds of one candidate
#: may take (rounds = this budget over the settled run, within the bounds).
MIN_ROUNDS, MAX_ROUNDS, ROUNDS_BUDGET_S = 2, 8, 1.0
#: Warm-up: runs after the first until one takes within this ratio of the one before (either
#: way), at most ``MAX_WARMUP`` runs.
SETTLED, MAX_WARMUP = 1.1, 4

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


@dataclass
class Timing:
    """A candidate's measured time: ``seconds``, the best wall time of a run (forward and
    backward, synchronised); ``host`` and ``device``, its host and device time apart (equal to
    ``seconds`` on the CPU; ``fusedops.autotune.measure.split``)."""

    seconds: float
    host: float
    device: float

    def cost(self, bound: str) -> float:
        """What a step pays for it where the step is ``bound`` ("device": the host runs ahead,
        its device time counts; "host": its host time counts)."""
        return self.device if bound == "device" else self.host


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

    def _once(self, function: Callable) -> tuple[list, list]:
        """``function``'s forward and backward, unsynchronised: (outputs, gradients)."""
        outputs = flat_tensors(function(*self.args, **self.kwargs))
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
        return outputs, grads

    def run(self, function: Callable) -> Result:
        """One trial of ``function`` (called with the call's arguments): seconds, outputs and
        gradients; then the snapshot is restored."""
        try:
            self._sync()
            start = clock()
            outputs, grads = self._once(function)
            self._sync()
            seconds = clock() - start
            return Result(seconds, [t.detach() for t in outputs], grads)
        finally:
            self.snapshot.restore()

    def settle(self, function: Callable, first: Result) -> float:
        """Warm-up runs after ``first`` until one takes within ``SETTLED`` of the one before
        (at most ``MAX_WARMUP``); the last one's seconds."""
        previous = first.seconds
        for _ in range(MAX_WARMUP):
            now = self.run(function).seconds
            settled = now <= SETTLED * previous and previous <= SETTLED * now
            previous = now
            if settled:
                break
        return previous

    def time_together(
        self, functions: Mapping[str, Callable], settled: Mapping[str, float]
    ) -> dict[str, Timing]:
        """Each of ``functions``' time (all warmed up; ``settled``: each one's last warm-up
        seconds): the best seconds over rounds in which every function runs twice in turn (the
        second run timed: the first after another function's shares the cores with its idle
        threads), as many rounds as ``ROUNDS_BUDGET_S`` a function allows; on CUDA each one's
        host and device time apart (``measure.split``). Taking turns, the functions meet the
        same load: a burst of other work on the machine, or a slower stretch of it, slows all of
        them rather than the one whose rounds it fell on."""
        per_round = sum(max(settled[name], 1e-9) for name in functions)
        rounds = int(ROUNDS_BUDGET_S * len(functions) / per_round)
        rounds = min(max(rounds, MIN_ROUNDS), MAX_ROUNDS)
        best = dict.fromkeys(functions, math.inf)
        order = list(functions)
        for index in range(rounds):
            for name in order[index % len(order) :] + order[: index % len(order)]:
                self.run(functions[name])
                best[name] = min(best[name], self.run(functions[name]).seconds)
        return {
            name: Timing(best[name], *self.split(function, best[name]))
            for name, function in functions.items()
        }

    def split(self, function: Callable, wall: float) -> tuple[float, float]:
        """``function``'s (host seconds, device seconds) where a run takes ``wall``
        (``measure.split``: on the CPU ``(wall, wall)``, without a run)."""
        try:
            once = functools.partial(self._once, function)
            return measure.split(once, wall, self.on_cuda, clock)
        finally:
            self.snapshot.restore()


def _exact(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` compares exactly: integer and boolean outputs (indices, counts,
    masks), as NMS's indices are the same on every backend (docs/ops.md)."""
    return not (tensor.is_floating_point() or tensor.is_complex())


def _largest(tensors: list) -> float:
    found = [
        float(t.detach().double().abs().max())
        for t in tensors
        if t is not None and t.numel() and not _exact(t)
    ]
    found = [value for value in found if math.isfinite(value)]
    return max(found, default=0.0)


def mismatch(expected: Result, actual: Result) -> str | None:
    """Why ``actual``'s outputs or gradients differ from ``expected``'s (the user's code), or
    None. Each element is compared within ``fusedops.testing.tolerance`` for its dtype and
    ``COMPARED_TERMS`` summed terms, at the magnitude of the largest element of its kind (all
    outputs, or all gradients): a gradient that cancels to near zero (a bias before a batch
    norm) carries the rounding of the terms it summed, which are of the size of the others.
    Integer and boolean outputs (indices: NMS's keep list) must be equal, the documented rule
    for NMS (the same indices on every backend); a candidate that reorders them, as gaussian
    soft-NMS may for two picks within rounding, is dropped, never trusted."""
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
            if _exact(want) or _exact(got):
                if want.dtype != got.dtype or not torch.equal(want, got.to(want.device)):
                    return f"{what} {index}: {want.dtype} values differ (compared exactly)"
                continue
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

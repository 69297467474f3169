"""Inside the ``fused`` candidate: the backend each fused module's ops run on, picked by timing.

A fused module (fusedops' LayerNorm, a fused Swin block, ...) calls one or a few fused ops.
On its first call of each signature (its class, train/eval, grad mode, autocast, the inputs'
shapes, dtypes, strides and devices) it is run, forward and backward, on each backend the
dispatch rule may run all of its ops on (``dispatch.candidates`` of every op it called: the
verified kernels, or unverified ones under ``FUSEDOPS_UNVERIFIED=1``, and native), leaving no
trace (``fusedops.autotune.trial``), its host and device time apart (on CUDA;
``fusedops.autotune.measure``): the one that counts is the one the region is bound by
(``BOUND``, from the region's own times: where the host runs ahead of the device an op's host
time is hidden). A backend whose outputs or gradients differ from native's
(``trial.mismatch``) is dropped for that signature with one warning naming the module, the
backend, the input shapes and the difference; a backend that fails is dropped. The fastest of
the rest runs that signature's later calls (``use_backend``). These picks are what the region's
own trial of the ``fused`` candidate then measures in place: the region decides.

A fused module calls one op (LayerNorm, RMSNorm, QuickGELU) or a few (a Swin block's window
ops); its signature fixes its ops' signatures (op, dtypes, device, shapes, strides), so this is
one trial per op signature where the module calls one op, and a module calling several runs
them on one backend. The comparison is ``trial.mismatch``'s: within ``fusedops.testing``'s
tolerance for floating outputs, exact for integer ones. A random op compares like the others:
torch's random state is restored before each run, and bias-dropout-add derives its mask from a
seed drawn from it, the same mask on every backend on CUDA (docs/ops.md).

No trial runs while torch.compile or torch.export traces the module, nor under CUDA graph
capture. Where only one backend may run, nothing is timed.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from fusedops import dispatch
from fusedops.autotune import ranks, trial

log = logging.getLogger(__name__.rpartition(".")[0])

#: (module class, signature) -> the backend picked for it (shared by every module of the class);
#: ``AUTOMATIC``: none forced, the dispatch rule picks as it does without ``optimize``.
PICKS: dict[tuple[type, str], str] = {}
AUTOMATIC = "automatic"
#: What each signature's trial measured: (module class, signature) -> {backend: the seconds
#: that count (``BOUND``'s) or why it was dropped}.
TRIALS: dict[tuple[type, str], dict[str, Any]] = {}
#: Host and device seconds apart: (module class, signature) -> {backend: ``trial.Timing``}.
TIMINGS: dict[tuple[type, str], dict[str, trial.Timing]] = {}
#: What the region running the fused candidate is bound by, "device" or "host" (set by the
#: region from its own times before the fused candidate's trial; "device" until then).
BOUND = "device"


def _signature(module: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    def describe(value):
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), tuple(value.stride()), str(value.dtype), value.device.type,
                    value.requires_grad)  # fmt: skip
        if isinstance(value, (tuple, list)):
            return tuple(describe(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((str(k), describe(v)) for k, v in value.items()))
        return type(value).__name__

    autocast = tuple(
        (device, str(torch.get_autocast_dtype(device)))
        for device in ("cpu", "cuda")
        if torch.is_autocast_enabled(device)
    )
    return repr(
        (module.training, torch.is_grad_enabled(), autocast, describe(args), describe(kwargs))
    )


def _usable(observed: list) -> list[str]:
    """The backends every observed op call may run on (``dispatch.candidates``), in the first
    call's preference order; native always among them."""
    common: list[str] | None = None
    for name, tensors in observed:
        usable = list(dispatch.candidates(name, *tensors).usable)
        common = usable if common is None else [b for b in common if b in usable]
    return common or []


class BackendPick:
    """The forward installed on a fused module while the ``fused`` candidate runs: its class's
    forward on the backend picked for the call's signature (module docstring)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.module).forward(self.module, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (
            torch.compiler.is_compiling()
            or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
            or dispatch.requested() is not None  # the user forced a backend around the call
        ):
            return self._forward(*args, **kwargs)
        key = (type(self.module), _signature(self.module, args, kwargs))
        chosen = PICKS.get(key)
        if chosen is None:  # in a decision the ranks share: rank 0's pick (ranks.py)
            chosen = PICKS[key] = ranks.from_rank0(self._decide(key, args, kwargs))
        if chosen == AUTOMATIC:
            return self._forward(*args, **kwargs)
        with dispatch.use_backend(chosen):
            return self._forward(*args, **kwargs)

    def _decide(self, key: tuple, args: tuple, kwargs: dict) -> str:
        tensors = trial.flat_tensors([args, kwargs])
        device = tensors[0].device.type if tensors else "cpu"
        if not any(
            b.kernel and (not b.devices or device in b.devices) for b in dispatch.backends()
        ):
            TRIALS[key] = {AUTOMATIC: f"no kernel backend takes {device} tensors"}
            return AUTOMATIC
        trials = trial.Trials(self.module, args, kwargs)
        with dispatch.observing() as observed, dispatch.use_backend("native"):
            reference = trials.run(self._forward)
        backends = _usable(observed)
        measured: dict[str, Any] = {}
        if len(backends) <= 1:
            TRIALS[key] = {AUTOMATIC: f"only {backends} may run these inputs"}
            return AUTOMATIC

        def run_on(backend):
            def run(*a, **k):
                with dispatch.use_backend(backend):
                    return self._forward(*a, **k)

            return run

        runners: dict[str, Any] = {}
        settled: dict[str, float] = {}
        for backend in backends:
            runner = run_on(backend)
            try:
                first = trials.run(runner)
                wrong = None if backend == "native" else trial.mismatch(reference, first)
                if wrong is not None:
                    measured[backend] = f"differs from native: {wrong}"
                    shapes = [tuple(t.shape) for t in trial.flat_tensors([args, kwargs])]
                    warnings.warn(
                        f"fusedops.optimize: {type(self.module).__qualname__} on {backend} "
                        f"(inputs {shapes}) differs from PyTorch's native ops: {wrong}; not "
                        "used for these inputs",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                    continue
                settled[backend] = trials.settle(runner, first)
                runners[backend] = runner
            except Exception as error:  # noqa: BLE001  (a failing backend is dropped)
                measured[backend] = f"failed: {type(error).__name__}: {error}"[:200]
        try:  # the backends take turns (trial.Trials.time_together)
            timings = trials.time_together(runners, settled) if runners else {}
        except Exception as error:  # noqa: BLE001  (one failed after passing runs: all dropped)
            timings = {}
            for backend in runners:
                measured[backend] = f"failed while timed: {type(error).__name__}: {error}"[:200]
        for backend, timing in timings.items():
            TIMINGS.setdefault(key, {})[backend] = timing
            measured[backend] = timing.cost(BOUND)
        measured = {backend: measured[backend] for backend in backends if backend in measured}
        TRIALS[key] = measured
        timed = {b: s for b, s in measured.items() if isinstance(s, float)}
        chosen = min(timed, key=timed.get) if timed else "native"
        timings = TIMINGS.get(key, {})

        def cell(backend: str, value: Any) -> str:
            if not isinstance(value, float):
                return f"{backend} dropped ({value})"
            host, device = 1e3 * timings[backend].host, 1e3 * timings[backend].device
            return f"{backend} {1e3 * value:.3g} ms (host {host:.3g}, device {device:.3g})"

        log.info(
            "fusedops.optimize: %s (%s-bound) %s -> %s",
            type(self.module).__qualname__,
            BOUND,
            ", ".join(cell(b, s) for b, s in measured.items()),
            chosen,
        )
        return chosen


def forget() -> None:
    """Drop every pick (tests; a new process starts without them)."""
    PICKS.clear()
    TRIALS.clear()
    TIMINGS.clear()

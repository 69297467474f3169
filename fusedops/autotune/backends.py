"""Inside the ``fused`` candidate: the backend each fused module's ops run on, picked by timing.

A fused module (fusedops' LayerNorm, a fused Swin block, ...) calls one or a few fused ops.
On its first call of each signature (its class, train/eval, grad mode, autocast, the inputs'
shapes, dtypes, strides and devices) it is run, forward and backward, on each backend the
dispatch rule may run all of its ops on (``dispatch.candidates`` of every op it called: the
verified kernels, or unverified ones under ``FUSEDOPS_UNVERIFIED=1``, and native), leaving no
trace (``fusedops.autotune.trial``). A backend whose outputs or gradients differ from native's
(``trial.mismatch``) is dropped for that signature with one warning naming the module, the
backend, the input shapes and the difference; a backend that fails is dropped. The fastest of
the rest runs that signature's later calls (``use_backend``). These picks are what the region's
own trial of the ``fused`` candidate then measures in place: the region decides.

No trial runs while torch.compile or torch.export traces the module, nor under CUDA graph
capture. Where only one backend may run, nothing is timed.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from fusedops import dispatch
from fusedops.autotune import trial

log = logging.getLogger(__name__.rpartition(".")[0])

#: (module class, signature) -> the backend picked for it (shared by every module of the class);
#: ``AUTOMATIC``: none forced, the dispatch rule picks as it does without ``optimize``.
PICKS: dict[tuple[type, str], str] = {}
AUTOMATIC = "automatic"
#: What each signature's trial measured: (module class, signature) -> {backend: seconds or why
#: it was dropped}.
TRIALS: dict[tuple[type, str], dict[str, Any]] = {}


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
        if chosen is None:
            chosen = PICKS[key] = self._decide(key, args, kwargs)
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
                measured[backend] = trials.time(runner, first)
            except Exception as error:  # noqa: BLE001  (a failing backend is dropped)
                measured[backend] = f"failed: {type(error).__name__}: {error}"[:200]
        TRIALS[key] = measured
        timed = {b: s for b, s in measured.items() if isinstance(s, float)}
        chosen = min(timed, key=timed.get) if timed else "native"
        log.info(
            "fusedops.optimize: %s %s -> %s",
            type(self.module).__qualname__,
            ", ".join(
                f"{b} {1e3 * s:.3g} ms" if isinstance(s, float) else f"{b} dropped ({s})"
                for b, s in measured.items()
            ),
            chosen,
        )
        return chosen


def forget() -> None:
    """Drop every pick (tests; a new process starts without them)."""
    PICKS.clear()
    TRIALS.clear()

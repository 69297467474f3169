"""On the CPU, each region of ``partial_trace`` runs as XLA or as eager torch, whichever its
first call measures faster.

XLA:CPU's matrix products are not always as fast as torch's (oneDNN/MKL): on an Intel Xeon
with AVX-512 and AMX they ran 1.2-2x slower than torch's, and a region made mostly of large
matrix products (a BERT or CLIP layer stack) then ran up to 1.3x slower than eager, however
well XLA fused the rest. So on the CPU each region (one Dynamo graph, its forward and its
backward) is timed on its first call both ways, on the call's own inputs: as its XLA programs
(``JaxProgram``, compiled and tuned first, ``tune``) and as the region's graph run by torch, as
``torch.compile(backend="eager")`` would. Where the region's outputs need gradients, a trial
is a forward and a backward by ``torch.autograd.grad`` from detached aliases of the inputs:
nothing accumulates into ``.grad`` and no graph outside the region runs. The trials leave no
trace: tensors the region writes
in place (batch-norm statistics) get their values back after each trial, and torch's random
state (which XLA's seeds come from too) is restored, so the call itself runs once, as it would
have without the trials. Each later call of the region takes the faster way; both give eager's
numbers (XLA within rounding). ``Stats.picks`` holds each region's pick and its trial times.

Not timed (XLA always): off the CPU; under ``torch.distributed`` with more than one rank (ranks
could pick apart and wait on each other); in a region that writes in place into an input
needing gradients (a trial could not be undone: ``writes_grad_input``); where a trial fails (a
backward XLA cannot compile), so that the error reaches the user where it would have.
``FUSEDOPS_XLA_CPU_PICK=0`` turns the choice off (XLA always).
"""

from __future__ import annotations

import math
import operator
import time
import warnings
from collections.abc import Callable

import torch
import torch.fx

from fusedops.xla import tune
from fusedops.xla._env import switched_on

PICK_ENV = "FUSEDOPS_XLA_CPU_PICK"
XLA, EAGER = "xla", "eager"


def enabled() -> bool:
    """Whether CPU regions pick between XLA and eager (env ``FUSEDOPS_XLA_CPU_PICK``, on)."""
    return switched_on(PICK_ENV)


def _flat_tensors(value) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or nested tuples/lists of them and other things)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


#: Python operators that write into their first argument
_WRITING_OPERATORS = frozenset(
    {
        operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
        operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
        operator.ilshift, operator.irshift, operator.imatmul, operator.setitem,
    }
)  # fmt: skip


def _writes(node: torch.fx.Node) -> list:
    """What ``node`` of a Dynamo graph may write in place: its first argument (an in-place
    method or function, ``x[i] = v``, ``inplace=True``) and its ``out=``; empty for the rest."""
    if node.op not in ("call_method", "call_function"):
        return []
    written = [node.kwargs["out"]] if "out" in node.kwargs else []
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    in_place = (
        node.target in _WRITING_OPERATORS
        or node.kwargs.get("inplace") is True
        or (isinstance(name, str) and name.endswith("_") and not name.endswith("__"))
    )
    if in_place and node.args:
        written.append(node.args[0])
    return written


def _storage_key(tensor: torch.Tensor):
    return torch.multiprocessing.reductions.StorageWeakRef(tensor.untyped_storage())


def writes_grad_input(gm: torch.fx.GraphModule) -> bool:
    """Whether a Dynamo graph may write in place into one of its inputs that needs gradients
    (or a view of one): a trial run of it could not be undone. True where a written value's
    example is unknown."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    needing = {
        _storage_key(value)
        for value in (n.meta.get("example_value") for n in placeholders)
        if isinstance(value, torch.Tensor) and value.requires_grad
    }
    if not needing:
        return False
    for node in gm.graph.nodes:
        for written in _writes(node):
            if not isinstance(written, torch.fx.Node):
                continue
            value = written.meta.get("example_value")
            tensors = _flat_tensors(value)
            if not tensors or any(_storage_key(t) in needing for t in tensors):
                return True
    return False


def _version(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter (bumped by each in-place write); None for an inference
    tensor, which has none."""
    return None if tensor.is_inference() else tensor._version


def _several_ranks() -> bool:
    """Whether this process is one of several ``torch.distributed`` ranks."""
    distributed = torch.distributed
    return (
        distributed.is_available()
        and distributed.is_initialized()
        and (distributed.get_world_size() > 1)
    )


class _Trial:
    """What trial runs of a region need: its arguments, with each tensor needing gradients
    replaced by a detached alias (a trial's backward stops there: it never reaches the graph
    that made the input, nor a parameter's uses elsewhere), and the values to put back into
    the inputs a run writes in place."""

    def __init__(self, args):
        grad = torch.is_grad_enabled()

        def stand_in(value):
            if isinstance(value, torch.Tensor) and grad and value.requires_grad:
                return value.detach().requires_grad_(True)
            return value

        self.args = tuple(stand_in(a) for a in args)
        tensors = _flat_tensors(list(self.args))
        self.wrt = [t for t in tensors if grad and t.requires_grad]
        # (tensor, its version before the trials, its value then): inputs not needing
        # gradients, which a region may write in place (buffers)
        with torch.no_grad():
            self.kept = [(t, _version(t), t.clone()) for t in tensors if not t.requires_grad]
        self.guarded = [(t, t._version) for t in self.wrt]
        self.rng = torch.get_rng_state()

    def run(self, function: Callable) -> float:
        """Seconds of one forward (and backward, where gradients flow) of ``function`` on the
        trial's arguments; the inputs it wrote in place are put back."""
        start = time.perf_counter()
        outputs = [
            t
            for t in _flat_tensors(function(self.args))
            if t.requires_grad and (t.is_floating_point() or t.is_complex())
        ]
        if self.wrt and outputs:
            torch.autograd.grad(
                outputs,
                self.wrt,
                grad_outputs=[torch.ones_like(t) for t in outputs],
                allow_unused=True,
            )
        seconds = time.perf_counter() - start
        del outputs
        self.restore()
        return seconds

    def restore(self, check: bool = True) -> None:
        """Put back the inputs written in place since the trials began, and the random state;
        ``check``: raise ``_Unrestorable`` where an input needing gradients was written."""
        inference = torch.is_inference_mode_enabled()
        with torch.no_grad():
            for tensor, version, value in self.kept:
                if version is None:  # an inference tensor: written only in inference mode
                    if inference:
                        tensor.copy_(value)
                # against the version before the trials, not the one after the last restore:
                # a later write need not move it (an XLA program may write a CPU buffer it
                # shares with the tensor, fusedops/xla/bridge.py), so once written, always put
                # back (tests/xla/test_pick.py fails with the last restore's version here)
                elif tensor._version != version:
                    tensor.copy_(value)
        torch.set_rng_state(self.rng)
        if check and any(t._version != version for t, version in self.guarded):
            raise _Unrestorable


class _Unrestorable(Exception):
    """A trial wrote into an input that needs gradients: it cannot be undone."""


def _timed(candidates: dict[str, Callable], args) -> dict[str, float]:
    """Each candidate's best seconds over rounds of trials (one untimed run each first, which
    compiles), as many rounds as ``tune``'s budget allows; in each round each candidate runs
    twice in a row and the second run is timed."""
    trial = _Trial(args)
    try:
        for function in candidates.values():
            trial.run(function)
        best = dict.fromkeys(candidates, math.inf)
        rounds = tune.MAX_ROUNDS
        for round_index in range(tune.MAX_ROUNDS):
            if round_index == rounds:
                break
            for name, function in candidates.items():
                # a run right after the other candidate's shares the cores with its idle
                # threads (OpenMP's or XLA's, still spinning): that one is not timed
                trial.run(function)
                best[name] = min(best[name], trial.run(function))
            if round_index == 0:
                quickest = min(best.values())
                fit = int(tune.TIMING_BUDGET_S / max(quickest, 1e-9))
                rounds = 1 if quickest > tune.LONG_RUN_S else min(max(fit, tune.MIN_ROUNDS), rounds)
    except _Unrestorable:
        raise
    except Exception:  # a failed run: undone as far as it got
        trial.restore(check=False)
        raise
    return best


class RegionPick:
    """A region's callable for Dynamo: ``compiled`` (its XLA programs, by AOTAutograd) or
    ``gm`` run by torch, picked on the first call (module docstring); the pick and the trial
    times are appended to ``picks`` as ``{"pick": "xla" | "eager", "seconds": {...}}`` (and
    ``"failed"``: the error, where a trial failed and XLA was kept untimed).
    ``constants``: graph inputs (by position) the XLA programs baked in
    (``partial_trace(capture_as_const=True)``), which the eager runs take in place of the
    arguments too."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        compiled: Callable,
        picks: list,
        constants: dict[int, torch.Tensor] | None = None,
    ):
        self.gm, self.compiled, self.picks = gm, compiled, picks
        self.constants = dict(constants or {})
        #: whether a trial can be undone (module docstring); False keeps XLA untimed
        try:
            self.undoable = not writes_grad_input(gm)
        except Exception:  # a value without a plain storage (a tensor subclass): not timed
            self.undoable = False
        self.pick: str | None = None

    def _xla(self, args):
        return self.compiled(*args)  # Dynamo's calling convention: unboxed

    def _eager(self, args):
        if self.constants:
            args = [self.constants.get(i, a) for i, a in enumerate(args)]
        return self.gm(*args)

    def _choose(self, args) -> str:
        tensors = _flat_tensors(list(args))
        if not self.undoable or _several_ranks() or any(t.device.type != "cpu" for t in tensors):
            return XLA
        try:
            seconds = _timed({XLA: self._xla, EAGER: self._eager}, args)
        except _Unrestorable:  # writes_grad_input missed a write: say so rather than hide it
            warnings.warn(
                "partial_trace: a region wrote in place into an input that needs gradients "
                "while it was timed as XLA and as eager; it runs as XLA from now on. Set "
                f"{PICK_ENV}=0 so that no region is timed",
                stacklevel=2,
            )
            self.picks.append({"pick": XLA, "seconds": {}})
            return XLA
        except Exception as error:
            # a trial failed (say, a backward XLA cannot compile): the region runs as XLA,
            # untimed, so the error reaches the user where it would have without the trials
            failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.picks.append({"pick": XLA, "seconds": {}, "failed": failed})
            return XLA
        pick = min(seconds, key=seconds.get)
        self.picks.append({"pick": pick, "seconds": seconds})
        return pick

    @torch._dynamo.disable
    def __call__(self, *args):
        if self.pick is None:
            self.pick = self._choose(args)
        return self._eager(args) if self.pick == EAGER else self._xla(args)

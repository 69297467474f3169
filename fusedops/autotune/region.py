"""A region: a module's forward that ``optimize`` times its candidates for and then runs.

Installed as the module's ``forward`` (an attribute of the instance), so the module keeps its
class, its ``state_dict`` keys, its parameters, buffers, hooks and attributes. Each call is
keyed by its signature (train/eval, grad mode, autocast, the inputs' shapes, dtypes and
devices); the first call of a signature decides (``Region.decide``): from the cache, or by
trials of every candidate (``fusedops.autotune.trial``). The pick is the fastest candidate whose
outputs and gradients match the user's code, where it is faster than that code by the margin;
else the user's code runs. Later calls of the signature run the pick.

A compiling candidate (``torch.compile``, XLA) is left out once the process has spent
``COMPILE_BUDGET_S`` compiling, or where a ``steps`` hint says the calls left cannot repay its
compile (``repays``); its first run logs progress while it compiles. On CUDA a candidate whose
peak memory is over ``MEMORY_FRACTION`` of what the process could use is dropped
(``fusedops.autotune.measure``), and losing candidates' programs and cached blocks are freed.

No trial runs while torch.compile or torch.export traces the module, nor under CUDA graph
capture: those calls run the signature's pick, or the user's code. Under
``torch.distributed`` with several ranks the first decision is shared where every rank's
first call has the same signature: every rank runs the same trials in the same order, a
candidate that failed on any rank is dropped, rank 0's times decide and its decision (cache
hits and the fused modules' backend picks included) is broadcast; a later signature is decided
by each rank alone, with no collective (``fusedops.autotune.ranks``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fusedops.autotune import backends, cache, candidates, measure, ranks, trial

log = logging.getLogger(__name__.rpartition(".")[0])  # "fusedops.autotune"

#: A candidate other than the user's code is picked only when its trial time is at most this
#: fraction of the user's code's.
MARGIN = 0.97
#: Seconds of compiling (first runs of ``torch.compile`` and XLA candidates) one process may
#: spend; once spent, compiling candidates are left out of new trials.
COMPILE_BUDGET_S = 600.0
#: What a compile is expected to take before one was measured in this process (seconds): a
#: CPU compile of a small transformer's forward and backward took 15-20 s on 2 cores.
COMPILE_ESTIMATE_S = 15.0
#: On CUDA, a candidate whose peak memory is over this fraction of what the process could use
#: when the trials began is dropped.
MEMORY_FRACTION = 0.9
#: Signatures a region times; later new signatures run the last decision's pick.
MAX_SIGNATURES = 8

#: Why an FSDP2 model is refused (by optimize, or at the first call where fully_shard came after).
FSDP2_REFUSED = (
    "optimize: this model is sharded by FSDP2 (fully_shard), which optimize does not time, "
    "whether fully_shard comes before or after it; use fusedops.hooks / "
    "fusedops.replace_modules and fusedops.optim's optimizers on it instead"
)

#: Seconds spent compiling in this process (all regions).
_compile_seconds = 0.0
#: The longest compile measured in this process, per candidate name (seconds).
_compile_measured: dict[str, float] = {}


def repays(eager_s: float, calls_left: int, compile_s: float) -> bool:
    """Whether a candidate that compiles for about ``compile_s`` seconds can repay it over
    ``calls_left`` calls of a region whose own code takes ``eager_s`` a call: no candidate
    saves more than the whole call."""
    return eager_s * calls_left > compile_s


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype).removeprefix("torch."),
                value.device.type, bool(value.requires_grad)]  # fmt: skip
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_describe(v) for v in value]]
    if isinstance(value, dict):
        # sorted by key alone: the text of an item would print its tensor, each call
        return ["dict", {str(k): _describe(v) for k, v in sorted(value.items(), key=_key)}]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return type(value).__qualname__


def _key(item: tuple) -> str:
    return str(item[0])


def signature(module: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """What a call's decision depends on, as text: train/eval, grad mode, autocast per device
    type, and each argument (a tensor's shape, dtype, device and requires_grad; a number's
    value; another object's type)."""
    autocast = [
        [device, str(torch.get_autocast_dtype(device)).removeprefix("torch.")]
        for device in ("cpu", "cuda")
        if torch.is_autocast_enabled(device)
    ]
    parts = {
        "train": module.training,
        "grad": torch.is_grad_enabled(),
        "autocast": autocast,
        "args": _describe(list(args)),
        "kwargs": _describe(kwargs),
    }
    return json.dumps(parts, sort_keys=True)


def structure(module: torch.nn.Module) -> str:
    """A hash of the module's structure: each submodule's name and class, each parameter's and
    buffer's name, shape and dtype."""
    digest = hashlib.sha256()
    for name, sub in module.named_modules():
        digest.update(f"{name}:{type(sub).__module__}.{type(sub).__qualname__};".encode())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()[:16]


def _fusedops_version() -> str:
    from fusedops import __version__

    return __version__


def _fsdp2(module: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` (FSDP2) was applied to the module or a submodule."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def _main_device(module: torch.nn.Module, args: tuple, kwargs: dict) -> torch.device:
    for tensor in [*trial.flat_tensors([args, kwargs]), *module.parameters()]:
        return tensor.device
    return torch.device("cpu")


@dataclass
class Decision:
    """One signature's pick: the candidate, each candidate's trial seconds (or why it was left
    out), and where it came from ("timed", "cache", "autotune off", "signature bound")."""

    pick: str
    seconds: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    source: str = "timed"
    signature: str = ""
    #: per candidate: its host and device seconds apart, its peak MiB (CUDA)
    host: dict[str, float] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)
    peak_mib: dict[str, float] = field(default_factory=dict)
    #: "device" or "host": what the user's code is bound by (``measure.bound``)
    bound: str = ""


class Region:
    """The forward installed on a module by ``optimize`` (module docstring)."""

    def __init__(
        self,
        module: torch.nn.Module,
        forward: Callable,
        *,
        names: Sequence[str],
        margin: float = MARGIN,
        use_cache: bool = True,
        max_signatures: int = MAX_SIGNATURES,
        steps: int | None = None,
    ):
        self.module, self.forward, self.names = module, forward, tuple(names)
        self.margin, self.use_cache, self.max_signatures = margin, use_cache, max_signatures
        self.steps = steps
        self.calls = 0
        self.title = type(module).__qualname__
        self.decisions: dict[str, Decision] = {}
        self._built: dict[str, candidates.Candidate] | None = None
        self.unavailable: dict[str, str] = {}
        self._swaps: Any = None
        self._bound_logged = False

    # -- candidates -------------------------------------------------------------------------

    def built(self) -> dict[str, candidates.Candidate]:
        """The candidates, built on first use (those that cannot be built, with their reason,
        in ``unavailable``)."""
        if self._built is None:
            self._built = {}
            for name in self.names:
                try:
                    made = candidates.BUILDERS[name](self.module, self.forward)
                except candidates.Unavailable as why:
                    self.unavailable[name] = str(why)
                    continue
                except Exception as error:  # noqa: BLE001  (a candidate must not break the call)
                    self.unavailable[name] = _short(error)
                    continue
                self._built[name] = made
                self._swaps = self._swaps or made.swaps
            listed = ", ".join(f"{n} ({c.note})" if c.note else n for n, c in self._built.items())
            log.info("fusedops.optimize: region %s: candidates %s", self.title, listed)
            for name, why in self.unavailable.items():
                log.info("fusedops.optimize: region %s: %s left out: %s", self.title, name, why)
        return self._built

    def _run(self, name: str, args: tuple, kwargs: dict) -> Any:
        built = self.built()
        chosen = built.get(name) or built["eager"]
        if self._swaps is not None:
            self._swaps.ensure(chosen.swapped)
        return chosen.run(*args, **kwargs)

    # -- calls ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        ):
            decided = self.decisions.get(signature(self.module, args, kwargs))
            return self._run(decided.pick if decided else "eager", args, kwargs)
        key = signature(self.module, args, kwargs)
        decided = self.decisions.get(key)
        if decided is None:
            decided = self.decide(key, args, kwargs)
        self.calls += 1
        return self._run(decided.pick, args, kwargs)

    def decide(self, key: str, args: tuple, kwargs: dict) -> Decision:
        """The decision for a new signature ``key`` (this call's ``args``/``kwargs``)."""
        if len(self.decisions) >= self.max_signatures:
            last = next(reversed(self.decisions.values()))
            if not self._bound_logged:
                self._bound_logged = True
                log.info(
                    "fusedops.optimize: region %s timed %d signatures, its bound; new ones run "
                    "%s untimed",
                    self.title,
                    len(self.decisions),
                    last.pick,
                )
            decided = Decision(last.pick, source="signature bound", signature=key)
        elif not cache.timing_enabled():
            decided = Decision("eager", source="autotune off", signature=key)
        elif _fsdp2(self.module):
            raise ValueError(FSDP2_REFUSED)
        else:
            shared = False
            if ranks.several():
                shared = not self.decisions and ranks.same(key)  # the first call: every rank
                if not shared:
                    log.info(
                        "fusedops.optimize: region %s: rank %d decides this signature alone (%s)",
                        self.title,
                        torch.distributed.get_rank(),
                        "after the first call"
                        if self.decisions
                        else "the ranks' first calls differ",
                    )
            with ranks.shared(shared):
                decided = self._cached_or_timed(key, args, kwargs)
        self.decisions[key] = decided
        return decided

    def _cache_key(self, key: str, args: tuple, kwargs: dict) -> dict:
        device = _main_device(self.module, args, kwargs)
        return {
            "environment": cache.environment(device),
            "region": self.title,
            "structure": structure(self.module),
            "signature": key,
            "candidates": list(self.built()),
            "fusedops": _fusedops_version(),
            "margin": self.margin,
        }

    def _cached_or_timed(self, key: str, args: tuple, kwargs: dict) -> Decision:
        built = self.built()
        parts = self._cache_key(key, args, kwargs) if self.use_cache else None
        found = cache.load(parts) if parts is not None and ranks.rank0() else None
        found = ranks.from_rank0(found)
        if found is not None and found.get("pick") in built:
            decided = Decision(
                found["pick"],
                dict(found.get("seconds", {})),
                dict(found.get("dropped", {})),
                "cache",
                key,
                dict(found.get("host", {})),
                dict(found.get("device", {})),
                dict(found.get("peak_mib", {})),
                str(found.get("bound", "")),
            )
            self._log(decided)
            self._free_losers(decided.pick)
            return decided
        decided = self._timed(key, args, kwargs)
        if parts is not None and ranks.rank0() and decided.source == "timed":
            cache.store(
                parts,
                {
                    "pick": decided.pick,
                    "seconds": decided.seconds,
                    "dropped": decided.dropped,
                    "host": decided.host,
                    "device": decided.device,
                    "peak_mib": decided.peak_mib,
                    "bound": decided.bound,
                },
            )
        self._log(decided)
        self._free_losers(decided.pick)
        return decided

    def _timed(self, key: str, args: tuple, kwargs: dict) -> Decision:
        """Trials of every candidate for this call: each one's first run (compared with the
        user's code) and warm-up in turn, then the rounds in which they take turns
        (``trial.Trials.time_together``)."""
        built = self.built()
        trials = trial.Trials(self.module, args, kwargs)
        device = _main_device(self.module, args, kwargs)
        memory = measure.Memory(device)
        limit = measure.available(device)
        decided = Decision("eager", signature=key)
        eager = self._runner(built["eager"])  # the model's own classes back on every run
        reference = trials.run(eager)
        settled = {"eager": trials.settle(eager, reference)}
        eager_s = ranks.from_rank0(settled["eager"])
        host, device_s = trials.split(eager, settled["eager"])
        decided.bound = ranks.from_rank0(measure.bound(host, device_s))
        backends.BOUND = decided.bound  # what the fused candidate's per-module picks weigh
        runners: dict[str, Callable] = {"eager": eager}
        for name, candidate in built.items():
            if name == "eager":
                continue
            why = self._left_out(name, candidate, eager_s)
            if why is not None:
                decided.dropped[name] = why
                continue
            try:
                if self._swaps is not None:
                    self._swaps.ensure(candidate.swapped)
                settled[name], peak = self._trial(name, candidate, trials, reference, memory)
            except _Differs as wrong:
                decided.dropped[name] = f"differs from the model's own code: {wrong}"
                continue
            except Exception as error:  # noqa: BLE001  (a failing candidate is dropped)
                decided.dropped[name] = f"failed: {_short(error)}"
                continue
            finally:
                if self._swaps is not None:
                    self._swaps.ensure(False)
            if peak is not None:
                decided.peak_mib[name] = round(peak / 2**20, 1)
                if limit is not None and peak > MEMORY_FRACTION * limit:
                    decided.dropped[name] = (
                        f"peak memory {peak / 2**20:.0f} MiB, over {MEMORY_FRACTION:g} of the "
                        f"{limit / 2**20:.0f} MiB this process could use"
                    )
                    continue
            runners[name] = self._runner(candidate)
        timings = self._time_together(trials, runners, settled, decided)
        failed_anywhere = ranks.union(set(decided.dropped))
        for name in failed_anywhere - set(decided.dropped):
            decided.dropped[name] = "failed or differed on another rank"
            timings.pop(name, None)
        seconds = ranks.from_rank0({name: t.seconds for name, t in timings.items()})
        decided.seconds = seconds
        decided.host = {name: t.host for name, t in timings.items()}
        decided.device = {name: t.device for name, t in timings.items()}
        fastest = min(seconds, key=seconds.get)
        decided.pick = fastest if seconds[fastest] <= self.margin * seconds["eager"] else "eager"
        return decided

    def _runner(self, candidate: candidates.Candidate) -> Callable:
        """``candidate.run`` with the fused classes swapped in or out as it needs."""
        if self._swaps is None:
            return candidate.run

        def run(*args: Any, **kwargs: Any) -> Any:
            self._swaps.ensure(candidate.swapped)
            return candidate.run(*args, **kwargs)

        return run

    def _time_together(
        self,
        trials: trial.Trials,
        runners: dict[str, Callable],
        settled: dict[str, float],
        decided: Decision,
    ) -> dict[str, trial.Timing]:
        """The candidates' times, taking turns; where one fails now (after runs that passed),
        the others are dropped with it and the user's code is timed alone."""
        try:
            return trials.time_together(runners, settled)
        except Exception as error:  # noqa: BLE001  (a failing candidate is dropped)
            for name in runners:
                if name != "eager":
                    decided.dropped[name] = f"failed while timed: {_short(error)}"
            return trials.time_together({"eager": runners["eager"]}, settled)
        finally:
            if self._swaps is not None:
                self._swaps.ensure(False)

    def _left_out(self, name: str, candidate: candidates.Candidate, eager_s: float) -> str | None:
        """Why a compiling candidate is not tried (the budget spent, or the ``steps`` hint
        says it cannot repay its compile), or None."""
        if not candidate.compiles:
            return None
        if _compile_seconds >= COMPILE_BUDGET_S:
            return f"compile budget of {COMPILE_BUDGET_S:g} s spent"
        if self.steps is None:
            return None
        calls_left = max(self.steps - self.calls, 0)
        expected = _compile_measured.get(name, COMPILE_ESTIMATE_S)
        if repays(eager_s, calls_left, expected):
            return None
        why = (
            f"cannot repay its compile: the {calls_left} calls left (steps={self.steps}) take "
            f"{eager_s * calls_left:.3g} s as written, its compile about {expected:.3g} s"
        )
        log.info("fusedops.optimize: region %s: %s left out: %s", self.title, name, why)
        return why

    def _trial(
        self,
        name: str,
        candidate: candidates.Candidate,
        trials: trial.Trials,
        reference: trial.Result,
        memory: measure.Memory,
    ) -> tuple[float, int | None]:
        """``candidate``'s first run (compared with ``reference``; progress lines while it
        compiles) and warm-up: its last warm-up run's seconds, and its peak memory over them
        (None off CUDA)."""
        global _compile_seconds
        memory.begin()
        if candidate.compiles:
            with measure.progress(self.title, name):
                first = trials.run(candidate.run)
        else:
            first = trials.run(candidate.run)
        if candidate.compiles:
            _compile_seconds += first.seconds
        wrong = trial.mismatch(reference, first)
        if wrong is not None:
            raise _Differs(wrong)
        settled = trials.settle(candidate.run, first)
        if candidate.compiles:
            compile_s = max(first.seconds - settled, 0.0)
            _compile_measured[name] = max(_compile_measured.get(name, 0.0), compile_s)
        return settled, memory.peak()

    def _free_losers(self, new_pick: str) -> None:
        """Drop what candidates that no signature picked hold (compiled programs; made again
        if a later signature tries them)."""
        picked = {d.pick for d in self.decisions.values()} | {"eager", new_pick}
        for name, candidate in self.built().items():
            if name not in picked:
                candidate.drop()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            gc.collect()  # programs and their buffers held in reference cycles
            torch.cuda.empty_cache()

    def _log(self, decided: Decision) -> None:
        times = ", ".join(f"{name} {_cell(decided, name)}" for name in decided.seconds)
        log.info(
            "fusedops.optimize: region %s, call %s: %s%s -> %s",
            self.title,
            len(self.decisions) + 1,
            times or "no trials",
            f" ({decided.source})" if decided.source != "timed" else "",
            decided.pick,
        )
        for name, why in decided.dropped.items():
            log.info("fusedops.optimize: region %s: %s dropped: %s", self.title, name, why)

    # -- report -----------------------------------------------------------------------------

    def rows(self) -> list[dict]:
        """One row per decided signature: the signature, each candidate's milliseconds or why
        it was left out, the pick and where the decision came from."""
        found = []
        for index, decided in enumerate(self.decisions.values(), 1):
            cells = {name: _cell(decided, name) for name in decided.seconds}
            cells.update({name: f"dropped ({why})" for name, why in decided.dropped.items()})
            cells.update({name: f"unavailable ({why})" for name, why in self.unavailable.items()})
            found.append(
                {
                    "region": self.title,
                    "call": index,
                    "signature": _summary(decided.signature),
                    "candidates": cells,
                    "pick": decided.pick,
                    "source": decided.source,
                }
            )
        return found

    def restore(self) -> None:
        """Put the module back as it was before ``optimize`` (its own forward, its classes)."""
        if self._swaps is not None:
            self._swaps.ensure(False)
        for candidate in (self._built or {}).values():
            candidate.drop()


class _Differs(Exception):
    """A candidate's outputs or gradients differ from the user's code's (the message: how)."""


def _cell(decided: Decision, name: str) -> str:
    """A candidate's time as the log and the report show it: its milliseconds, and where they
    differ from it (on CUDA) its host and device time, and its peak memory."""
    text = f"{1e3 * decided.seconds[name]:.3g} ms"
    host, device = decided.host.get(name), decided.device.get(name)
    extra = []
    if host is not None and device is not None and (host, device) != (decided.seconds[name],) * 2:
        extra.append(f"host {1e3 * host:.3g} ms, device {1e3 * device:.3g} ms")
    if name in decided.peak_mib:
        extra.append(f"peak {decided.peak_mib[name]:.0f} MiB")
    return text + (f" ({'; '.join(extra)})" if extra else "")


def _summary(key: str) -> str:
    """A short form of a signature: train/eval, grad, autocast and the tensor shapes."""
    try:
        parts = json.loads(key)
    except ValueError:
        return key[:80]
    shapes = []

    def walk(value):
        if isinstance(value, list) and value and value[0] == "tensor":
            shapes.append("x".join(map(str, value[1])) + f" {value[2]}")
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(parts.get("args"))
    walk(parts.get("kwargs"))
    mode = "train" if parts.get("train") else "eval"
    grad = "" if parts.get("grad") else ", no grad"
    autocast = "".join(f", autocast {d}:{t}" for d, t in parts.get("autocast", []))
    return f"{mode}{grad}{autocast}: {'; '.join(shapes) or 'no tensors'}"

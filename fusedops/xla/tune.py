"""Which XLA:CPU library runs a program's dot products (and, in programs holding an XLA
convolution, its convolutions), chosen per program on its first call.

XLA:CPU hands dots to YNNPACK by default. Measured on the 2-core x86 CPU of our CI (jax 0.10.2,
``benchmarks/bench_xla.py`` shapes), neither library wins everywhere:

- a batched dot (attention's ``[32,196,64] x [32,64,196]``) runs on one thread in YNNPACK (2.0 ms
  on one core or two) and on both in oneDNN (1.1-1.3 ms);
- a plain ``[256,1024] x [1024,1024]`` product (an MLP layer) is twice as slow in oneDNN: the MLP
  forward program took 28 ms with oneDNN dots against 14 ms with YNNPACK's.

So on the CPU each program is compiled with each candidate (``CANDIDATES``), every candidate runs
on the call's own inputs (first run compiles, then 1 to 5 timed runs each, fewer for slower
programs, interleaved), and the fastest is kept for the program's later calls. Programs are
pure functions of their inputs (the random seed is an input too), so the extra runs change
nothing but time. A candidate this jaxlib does not know (compile option refused) is skipped.

``FUSEDOPS_XLA_CPU_TUNE=0`` turns the choice off: one compile with XLA's defaults (and whatever
``XLA_FLAGS`` says).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import jax

from fusedops.xla._env import switched_on

DEFAULT = "ynnpack"

#: name -> XLA compile options (``jax.jit(compiler_options=...)``); the first is XLA's default
CANDIDATES: dict[str, dict[str, str]] = {
    DEFAULT: {},
    "onednn": {
        "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE",
    },
}

#: timed runs per candidate (after the compiling run): as many as fit in ``TIMING_BUDGET_S``
#: per candidate, between ``MIN_ROUNDS`` and ``MAX_ROUNDS`` (one only when a run takes longer
#: than ``LONG_RUN_S``), so small programs get enough runs to see past a noisy machine and a
#: large program's first call stays within a few runs
MIN_ROUNDS, MAX_ROUNDS = 2, 5
TIMING_BUDGET_S = 0.25
LONG_RUN_S = 0.5

#: extra candidates for programs holding a convolution (or its backward) that stays an XLA
#: convolution (``lower_nn.xla_convolution_on_cpu``: not depthwise, not 1x1):
#: YNNPACK's dots and reductions as by default, convolutions left to XLA's own (Eigen) kernels.
#: Measured on the CI's 2-core x86 (jax 0.10.2): YNNPACK ran the 7x7 stride-2 stem of a ResNet
#: on 3 channels ([8, 3, 64, 64] -> [8, 32, 32, 32]) in 3.7-4.0 ms, Eigen in 1.2-1.3 ms; the
#: tuner kept this candidate for most ResNet and ConvNeXt programs (0.3-0.5 ms a program).
CONVOLUTION_CANDIDATES: dict[str, dict[str, str]] = {
    "ynnpack-eigen-conv": {
        "xla_cpu_experimental_ynn_fusion_type": (
            "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE"
        ),
    },
}

_REFUSED = (getattr(jax.errors, "JaxRuntimeError", RuntimeError),)


def candidates(convolution: bool) -> dict[str, dict[str, str]]:
    """Name -> compile options of the candidates a CPU program is timed with: ``CANDIDATES``,
    and ``CONVOLUTION_CANDIDATES`` where the program holds an XLA convolution."""
    return {**CANDIDATES, **CONVOLUTION_CANDIDATES} if convolution else dict(CANDIDATES)


def enabled() -> bool:
    """Whether CPU programs choose their dot library (env ``FUSEDOPS_XLA_CPU_TUNE``, on)."""
    return switched_on("FUSEDOPS_XLA_CPU_TUNE")


def _timed(function: Callable, args) -> tuple[float, object]:
    start = time.perf_counter()
    results = jax.block_until_ready(function(*args))
    return time.perf_counter() - start, results


def fastest(functions: dict[str, Callable], args) -> tuple[str, Callable, object, dict]:
    """Run each of ``functions`` (name -> jitted function, ``DEFAULT`` first) on ``args`` and
    return ``(name, function, results, seconds)`` of the fastest: its name, the function, the
    results of one of its runs, and each timed candidate's best time in seconds (empty when
    only one candidate could run, so nothing was timed).

    A candidate other than ``DEFAULT`` that fails with a JAX runtime error (a compile option
    this jaxlib lacks, memory) is left out; ``DEFAULT``'s errors propagate. Only the results of
    the fastest run so far are kept alive."""
    usable: dict[str, Callable] = {}
    first = None  # the first usable candidate's results, returned when it is the only one
    for name, function in functions.items():
        try:
            results = jax.block_until_ready(function(*args))  # compiles
        except _REFUSED:
            if name == DEFAULT:
                raise
            continue
        usable[name] = function
        first = results if first is None else first
        del results
    if len(usable) == 1:
        ((name, function),) = usable.items()
        return name, function, first, {}
    del first
    best = dict.fromkeys(usable, math.inf)
    fastest_run, kept = math.inf, None  # the fastest run so far and its results
    rounds = MAX_ROUNDS
    for round_index in range(MAX_ROUNDS):
        if round_index == rounds:
            break
        for name, function in list(usable.items()):
            try:
                seconds, results = _timed(function, args)
            except _REFUSED:
                if name == DEFAULT:
                    raise
                del usable[name], best[name]
                continue
            best[name] = min(best[name], seconds)
            if seconds < fastest_run:
                fastest_run, kept = seconds, results
            del results
        if round_index == 0:
            quickest = min(best.values())
            fit = int(TIMING_BUDGET_S / max(quickest, 1e-9))
            rounds = 1 if quickest > LONG_RUN_S else min(max(fit, MIN_ROUNDS), MAX_ROUNDS)
    name = min(best, key=best.get)  # the candidate of the fastest run, whose results are kept
    return name, usable[name], kept, best

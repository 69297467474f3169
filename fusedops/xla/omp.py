"""Torch's idle OpenMP threads put to sleep before an XLA program runs on the CPU.

After each parallel torch op, GNU OpenMP (libgomp, which the PyTorch wheels bundle) keeps its
worker threads spinning for ``GOMP_SPINCOUNT`` iterations (300,000 by default: about 9 ms of
CPU per worker on the 2-core AMD EPYC of our CI) so that the next op starts without waking
them. An XLA program called right after a torch op shares the cores with those spinning
workers; its own thread pool gets one core of two (partial_trace ran 1.3-1.7x eager on the
HF models). ``OMP_WAIT_POLICY=PASSIVE`` stops the spinning but must be set before torch loads
libgomp, and it makes every eager op wake its workers from sleep (eager itself slower).

:func:`park` does it at runtime, only for the hand-off to XLA: it runs one empty parallel
region with one thread more than the process may use CPUs. libgomp counts more threads than
CPUs and, for threads that wait while that holds, spins ``100`` times instead of 300,000 (its
"throttled" spin count), so the workers go to sleep at once and XLA gets every core. Torch's
next parallel op runs with its usual team size, which lets the extra thread exit, and from
then on its workers spin as by default: eager ops keep their speed. A hand-off costs one thread
start and exit (tens of microseconds).

Nothing is done when torch has one intra-op thread, runs without OpenMP, when
``FUSEDOPS_XLA_PARK_OMP=0`` (or ``OMP_WAIT_POLICY=PASSIVE``, where workers sleep anyway) or
when torch's OpenMP runtime is not libgomp (Intel's or LLVM's ``libiomp5``/``libomp``, which
spin for ``KMP_BLOCKTIME``): then one warning, on the first CPU program, says to set
``OMP_WAIT_POLICY=PASSIVE`` (or ``KMP_BLOCKTIME=0``) before starting Python.
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings

import torch

from fusedops.xla._env import switched_on

ENV = "FUSEDOPS_XLA_PARK_OMP"


def enabled() -> bool:
    """Whether :func:`park` acts: env ``FUSEDOPS_XLA_PARK_OMP`` (on unless ``0``/``false``/
    ``off``), and ``OMP_WAIT_POLICY`` is not ``PASSIVE`` (workers already sleep)."""
    if not switched_on(ENV):
        return False
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE"


class _Runtime:
    """Torch's OpenMP runtime as found in its own library's dependencies: ``name``
    ("libgomp", "intel-or-llvm" or "none") and, for libgomp, ``GOMP_parallel``."""

    def __init__(self) -> None:
        self.name, self.gomp_parallel, self.noop = "none", None, None
        if not torch._C.has_openmp:
            return
        library = ctypes.CDLL(torch._C.__file__)  # dlsym searches torch's own dependencies
        if hasattr(library, "kmp_set_blocktime"):  # Intel's / LLVM's runtime (GOMP_ ABI too)
            self.name = "intel-or-llvm"
            return
        if not hasattr(library, "GOMP_parallel"):
            return
        self.name = "libgomp"
        self.gomp_parallel = library.GOMP_parallel
        # GOMP_parallel(fn, data, num_threads, flags)
        pointer, count = ctypes.c_void_p, ctypes.c_uint
        self.gomp_parallel.argtypes = [pointer, pointer, count, count]
        self.gomp_parallel.restype = None
        # the region's body: a function of libgomp's own with no effect (its argument ignored)
        self.noop = ctypes.cast(library.omp_get_thread_num, ctypes.c_void_p)


@functools.cache
def runtime() -> _Runtime:
    """Torch's OpenMP runtime (looked up once)."""
    return _Runtime()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS): libgomp counts every CPU
        return os.cpu_count() or 1


_warned = False


def park() -> bool:
    """Put torch's idle OpenMP worker threads to sleep now (no argument; call right before an
    XLA program runs on the CPU). Returns whether it did; where it cannot and workers may spin
    (an OpenMP runtime other than libgomp), warns once what to set instead."""
    global _warned
    if torch.get_num_threads() <= 1 or not enabled():
        return False
    found = runtime()
    if found.gomp_parallel is None:
        if found.name == "intel-or-llvm" and not _warned and "KMP_BLOCKTIME" not in os.environ:
            _warned = True
            warnings.warn(
                "fusedops.xla: torch's OpenMP runtime (Intel's or LLVM's) keeps its threads "
                "spinning after each op, on the cores XLA's CPU programs need (partial_trace "
                "up to 2x slower); start Python with OMP_WAIT_POLICY=PASSIVE or KMP_BLOCKTIME=0",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    found.gomp_parallel(found.noop, None, _cpus() + 1, 0)
    return True

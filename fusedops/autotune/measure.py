"""How a trial is measured beyond its wall time: host and device time apart, peak memory, and
progress lines while a candidate compiles.

Host and device time (``split``):

- host time: the seconds the host takes to launch a run (forward and backward), with the device
  kept busy ahead of it, so that no launch waits for the device;
- device time: the seconds from the device starting the run to the whole device being idle
  again. A timing event on the current stream marks the start, queued behind a spin
  (``torch.cuda._sleep``) long enough to cover the launches; the end is a device-wide
  synchronisation, so every stream the run used is covered (fusedops' side streams, XLA's
  streams and its hand-back to torch). Where the spin did not cover the launches it is made
  longer, three times at most; then the run is host-bound and its device time is given as its
  wall time.
- On the CPU the two are the one wall time.

Which one a step pays follows from the region's own times (``bound``): where the user's code
takes longer on the device than on the host, the host runs ahead and an op's host time is
hidden (its device time counts); else the host's time counts.

Peak memory (``Memory``, CUDA only): torch's caching allocator's peak during a candidate's runs
above what it held before them, plus, where JAX is loaded, its GPU devices' growth in bytes in
use (their own counters). ``available`` is what the process can still use: the device's free
memory and what torch's cache holds unused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator

import torch

log = logging.getLogger(__name__.rpartition(".")[0])  # "fusedops.autotune"

#: Seconds between the progress lines of a compiling candidate.
PROGRESS_S = 30.0
#: The longest spin queued ahead of a run (seconds).
MAX_SPIN_S = 4.0


def bound(host: float, device: float) -> str:
    """``"device"`` where a run's device time is at least its host time (the host runs ahead;
    an op's host time is hidden), else ``"host"``."""
    return "device" if device >= host else "host"


@functools.cache
def _cycles_per_second(index: int) -> float:
    """The rate of ``torch.cuda._sleep``'s cycles on device ``index``, measured once."""
    with torch.cuda.device(index):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 1 << 22
        torch.cuda._sleep(cycles)  # first launch out of the measurement
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / max(start.elapsed_time(end) / 1e3, 1e-9)


def split(
    run: Callable[[], object], wall: float, cuda: bool, clock: Callable[[], float]
) -> tuple[float, float]:
    """``(host seconds, device seconds)`` of ``run`` (one forward and backward, no
    synchronisation inside), whose wall time ``wall`` is known, read from ``clock`` (module
    docstring). On the CPU ``(wall, wall)``, without running it."""
    if not cuda:
        return wall, wall
    index = torch.cuda.current_device()
    spin = min(max(1.5 * wall, 1e-4), MAX_SPIN_S)
    host = device = wall
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(spin * _cycles_per_second(index)))
        start = torch.cuda.Event()
        start.record()
        began = clock()
        run()
        host = clock() - began
        covered = not start.query()
        while not start.query():  # the spin ends: the device starts the run
            pass
        started = clock()
        torch.cuda.synchronize()  # every stream of the device
        device = clock() - started
        if covered:
            return host, device
        spin = min(4 * spin, MAX_SPIN_S)
    return host, max(wall, device)


def _jax_gpu_bytes() -> tuple[int, int]:
    """JAX's GPU devices' (bytes in use, peak bytes in use), summed; (0, 0) where JAX is not
    loaded (it is never imported here) or reports none."""
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 0
    in_use = peak = 0
    try:
        for device in jax.local_devices():
            if device.platform != "gpu":
                continue
            stats = device.memory_stats() or {}
            in_use += int(stats.get("bytes_in_use", 0))
            peak += int(stats.get("peak_bytes_in_use", 0))
    except Exception:  # noqa: BLE001  (a backend without memory statistics)
        return 0, 0
    return in_use, peak


class Memory:
    """The peak memory of a candidate's runs on ``device`` (module docstring): ``begin()``
    before them, ``peak()`` after; ``peak()`` is None off CUDA."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.base = 0
        self.jax_base = (0, 0)

    def begin(self) -> None:
        if not self.cuda:
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        self.jax_base = _jax_gpu_bytes()

    def peak(self) -> int | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize(self.device)
        extra = torch.cuda.max_memory_allocated(self.device) - self.base
        (in_use_before, peak_before), (in_use, peak) = self.jax_base, _jax_gpu_bytes()
        jax_extra = peak - in_use_before if peak > peak_before else max(0, in_use - in_use_before)
        return max(0, extra) + max(0, jax_extra)


def available(device: torch.device) -> int | None:
    """Bytes the process can still use on ``device`` (free, plus what torch's cache holds
    unused); None off CUDA."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


@contextlib.contextmanager
def progress(region: str, name: str) -> Iterator[None]:
    """Log that ``name`` compiles for ``region`` and, every ``PROGRESS_S`` seconds until the
    block ends, how long it has compiled."""
    import time

    began = time.monotonic()
    done = threading.Event()
    log.info("fusedops.optimize: region %s: compiling %s (a first run compiles)", region, name)

    def report() -> None:
        while not done.wait(PROGRESS_S):
            log.info(
                "fusedops.optimize: region %s: still compiling %s (%.0f s so far)",
                region,
                name,
                time.monotonic() - began,
            )

    thread = threading.Thread(target=report, name="fusedops-compile-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()

"""What the kernel launchers ask of the device, in one place: CUDA's grid limits, the number of
multiprocessors (asked once per device, cached) and how many programs fill them.

Importing this imports torch only; CUDA is queried the first time a CUDA device is asked about.
"""

from __future__ import annotations

import functools

import torch

#: CUDA's grid limits: dim 0 (x) takes up to 2^31 - 1 blocks, dims 1 and 2 (y, z) 65535 each.
#: Triton's program ids map onto the same dims, so the same limits hold for its grids.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_index(device: torch.device) -> int | None:
    """``device``'s index, an index of None read as the current device of its type (CUDA's
    ``torch.cuda.current_device()``, 0 while CUDA is not initialised, which is the device it
    would start on, so asking initialises nothing); None for the unindexed types cpu and meta."""
    if device.index is not None or device.type in ("cpu", "meta"):
        return device.index
    backend = getattr(torch, device.type, None)
    initialized = getattr(backend, "is_initialized", None)
    if initialized is not None and initialized():
        return backend.current_device()
    return 0


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name the same device: same type and index, an index of None
    being the current device (``cuda`` is ``cuda:0`` when device 0 is current)."""
    return a.type == b.type and device_index(a) == device_index(b)


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of CUDA ``device`` (no index: the current device); cached."""
    return _multiprocessors(device_index(device))


def programs_to_fill(device: torch.device, per_sm: int, elsewhere: int) -> int:
    """Programs (blocks) a launch wants to fill ``device``: ``per_sm`` per multiprocessor on a
    CUDA device, ``elsewhere`` on any other (a few: Triton's CPU interpreter)."""
    if device.type == "cuda":
        return per_sm * multiprocessors(device)
    return elsewhere


def groups_to_fill(items: int, programs_per_group: int, target: int) -> int:
    """Groups to split ``items`` (>= 1) into so that groups x ``programs_per_group`` reaches
    ``target`` programs: at least 1, at most ``items`` and MAX_GRID_YZ (a group count is a grid
    dim 1 or 2, or bounds one). A function of the shapes and the device only, so reductions
    over the groups add their partial sums in the same order on every run."""
    return min(items, MAX_GRID_YZ, max(1, -(-target // max(programs_per_group, 1))))


def tf32_allowed() -> bool:
    """Whether torch lets fp32 matmuls on CUDA run in TF32 (``torch.backends.cuda.matmul``:
    ``fp32_precision == "tf32"``, or the legacy ``allow_tf32``; off by default): the kernels'
    fp32 products follow the same contract (plain TF32 when allowed, else 3-pass TF32)."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", "none")
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # legacy and new APIs mixed: torch refuses to read allow_tf32
        return False

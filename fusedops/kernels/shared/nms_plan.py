"""NMS plans shared by the NMS family's references and kernels: the soft-NMS method codes, the
64-box block bounds of boxes grouped by class, and the buffers the kernels fill."""

from __future__ import annotations

import torch

from fusedops import _alloc

#: soft-NMS methods, as the kernels and lowerings receive them.
NAIVE, LINEAR, GAUSSIAN = 0, 1, 2


def block_column_end(classes_p: torch.Tensor, n: int) -> torch.Tensor:
    """For the kernels' 64-box blocks of boxes grouped by class: (blocks,) int64, for each row
    block the first column block whose boxes all belong to later classes (the mask words a
    block's boxes need end there)."""
    blocks = -(-n // 64)
    first_class = classes_p[::64].contiguous()
    last = torch.clamp(torch.arange(1, blocks + 1, device=classes_p.device) * 64, max=n) - 1
    return torch.searchsorted(first_class, classes_p[last], right=True)


def nms_walk_buffers(n: int, device) -> tuple[torch.Tensor, ...]:
    """What an nms kernel pair fills: the bitmask (n * ceil(n / 64) 64-bit words, only the
    words the walk reads are written), positions (n,) int64 and count () int64."""
    return (
        _alloc.empty((n * -(-n // 64),), dtype=torch.int64, device=device),
        _alloc.empty((n,), dtype=torch.int64, device=device),
        _alloc.empty((), dtype=torch.int64, device=device),
    )


def soft_nms_outputs(n: int, n_segments: int, device) -> tuple[torch.Tensor, ...]:
    """The outputs a soft-NMS kernel fills: positions (n,) int64, picked scores (n,) fp32 and
    counts (segments,) int64 (poisoned under test)."""
    return (
        _alloc.empty((n,), dtype=torch.int64, device=device),
        _alloc.empty((n,), dtype=torch.float32, device=device),
        _alloc.empty((n_segments,), dtype=torch.int64, device=device),
    )

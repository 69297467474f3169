"""How the Swin attention softmax's bias-gradient reduction splits the batch: shared by the
reference (which reduces in the same chunks, so its fp32 sums match the kernels') and the
kernels."""

from __future__ import annotations

import torch

from fusedops.kernels.device import groups_to_fill, programs_to_fill


def backward_chunks(windows: int, row_groups: int, device: torch.device, per_sm: int = 4) -> int:
    """How many chunks (1..min(windows, 65535)) of windows the bias-gradient reduction splits
    the batch into (windows >= 1): enough programs (row_groups x chunks) to fill the device,
    ``per_sm`` a multiprocessor; a function of the shapes and the device only, so the fp32
    partial sums and their fixed-order reduction are the same on every run."""
    # Triton's interpreter: a few chunks, so the reduction path is exercised
    target = programs_to_fill(device, per_sm, elsewhere=4)
    chunks = groups_to_fill(windows, row_groups, target)
    per_chunk = -(-windows // chunks)
    return -(-windows // per_chunk)  # no empty chunk

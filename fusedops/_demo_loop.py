"""The timed training loop both demo stages run (fusedops/demo.py, fusedops/demo_swin.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def timed_steps(
    compute_loss: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    steps: int,
    device: str,
) -> tuple[list[float], torch.Tensor | None]:
    """Train ``steps`` steps (``compute_loss()``, backward, optimizer step, gradients set to
    None), each timed on the host, synchronised on CUDA: (seconds per step, the last loss, a 0-d
    tensor; None when ``steps`` is 0)."""
    times, loss = [], None
    for _ in range(steps):
        start = time.perf_counter()
        loss = compute_loss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times, loss

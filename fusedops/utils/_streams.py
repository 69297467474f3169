"""The CUDA stream operations ``multi_apply_multi_stream`` and ``Prefetcher`` use, behind one
small object, so their ordering logic runs (and is tested) on CPU with a recording stand-in."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.utils._pytree as pytree


def tensors_in(tree) -> Iterator[torch.Tensor]:
    """Every tensor in a nested tuple/list/dict (any pytree) ``tree``."""
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            yield leaf


def first_cuda_device(tree) -> torch.device | None:
    """The device of the first CUDA tensor in ``tree``, or None when it holds none."""
    for t in tensors_in(tree):
        if t.device.type == "cuda":
            return t.device
    return None


class CudaStreams:
    """Streams, events and ``record_stream`` on one CUDA ``device``; side streams are pooled
    per device, so repeated calls reuse them instead of creating streams each time."""

    _pool: dict[torch.device, list] = {}

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    def current(self):
        """The stream work is queued on now (the consumer's stream)."""
        return torch.cuda.current_stream(self.device)

    def side_streams(self, n: int) -> list:
        """``n`` side streams of this device (created once, then reused)."""
        pool = self._pool.setdefault(self.device, [])
        while len(pool) < n:
            pool.append(torch.cuda.Stream(self.device))
        return pool[:n]

    def use(self, stream):
        """Context manager: queue work on ``stream`` inside it."""
        return torch.cuda.stream(stream)

    def new_event(self):
        """An event to record on one stream and wait for on another."""
        return torch.cuda.Event()

    def record(self, tree, stream) -> None:
        """Mark every CUDA tensor of ``tree`` as used on ``stream``: the caching allocator then
        does not reuse its memory before ``stream``'s queued work is done."""
        for t in tensors_in(tree):
            if t.device.type == "cuda":
                t.record_stream(stream)

"""Small models with repeated blocks for the auto_checkpoint tests (CPU and partial_trace)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm MLP residual block with dropout, (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int, p: float, hidden: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden * d)
        self.fc2 = nn.Linear(hidden * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class Stack(nn.Module):
    """Embedding, ``n`` Blocks in a ModuleList, a head; (B, T, 8) float32 -> (B, T, 1).
    ``uneven``: block i's hidden width is 2 * (i % 3 + 1) * d, so blocks save different amounts."""

    def __init__(self, d: int = 16, n: int = 4, p: float = 0.1, uneven: bool = False):
        super().__init__()
        self.embed = nn.Linear(8, d)
        hidden = [2 * (i % 3 + 1) if uneven else 4 for i in range(n)]
        self.blocks = nn.ModuleList([Block(d, p, h) for h in hidden])
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def saved_bytes(model: nn.Module, *inputs) -> int:
    """Bytes the autograd graph of one forward saves through saved_tensors_hooks, parameters
    excluded and each storage once (checkpointed blocks hide theirs behind their own hooks)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs).sum()
    return sum(seen.values())

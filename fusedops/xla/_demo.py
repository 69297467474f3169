"""Demo stage: a small ViT trained with its backbone under ``partial_trace(backend="xla")``.

``run_demo_stage`` trains the same model (same initial weights, same data) twice, eager and
with the backbone compiled to XLA (loss and optimizer stay eager), and reports step time,
first-call compile time and final losses. Runs on CPU in well under a minute.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, p: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=p, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(p), nn.Linear(4 * dim, dim)
        )
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop(self.mlp(self.norm2(x)))


class TinyViT(nn.Module):
    """Patch embedding (linear on flattened 4x4 patches of a 3x16x16 image), 2 transformer
    blocks, LayerNorm, mean pooling, classifier. Input (B, 3, 16, 16) -> logits (B, classes)."""

    def __init__(self, dim: int = 64, heads: int = 4, depth: int = 2, classes: int = 10):
        super().__init__()
        self.patch = 4
        self.embed = nn.Linear(3 * self.patch * self.patch, dim)
        self.pos = nn.Parameter(torch.zeros(1, (16 // self.patch) ** 2, dim))
        self.blocks = nn.Sequential(*[_Block(dim, heads, 0.1) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def backbone(self, images):
        b, c, h, w = images.shape
        p = self.patch
        patches = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        tokens = self.embed(patches.reshape(b, (h // p) * (w // p), c * p * p)) + self.pos
        return self.norm(self.blocks(tokens)).mean(1)

    def forward(self, images):
        return self.head(self.backbone(images))


def _train(model, forward, data, steps: int, opt_lr: float = 1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=opt_lr)
    times, loss = [], None
    first = None
    for step in range(steps):
        images, labels = data[step % len(data)]
        start = time.perf_counter()
        loss = F.cross_entropy(forward(model, images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        elapsed = time.perf_counter() - start
        if step == 0:
            first = elapsed
        else:
            times.append(elapsed)
    return loss.item(), first, statistics.median(times or [first])


def run_demo_stage(steps: int = 5) -> dict:
    """Train TinyViT for ``steps`` steps (batch 8, synthetic data) eager and with the backbone
    under ``partial_trace(backend="xla")``. Returns name, step_ms (median after the first
    step), peak_mem_mb (None on CPU), final_loss, eager_final_loss, compile_s (first call)."""
    from fusedops.xla import partial_trace

    steps = max(int(steps), 2)
    gen = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(8, 3, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen))
        for _ in range(4)
    ]
    torch.manual_seed(0)
    model = TinyViT()
    eager_model = copy.deepcopy(model)

    @partial_trace(backend="xla")
    def backbone(model, images):
        return model.backbone(images)

    def traced_forward(model, images):
        return model.head(backbone(model, images))

    def eager_forward(model, images):
        return model(images)

    torch.manual_seed(1)
    final, compile_s, step_s = _train(model, traced_forward, data, steps)
    torch.manual_seed(1)
    eager_final, _, _ = _train(eager_model, eager_forward, data, steps)
    return {
        "name": "partial_trace(xla)",
        "step_ms": step_s * 1e3,
        "peak_mem_mb": None,
        "final_loss": final,
        "eager_final_loss": eager_final,
        "compile_s": compile_s,
    }


if __name__ == "__main__":
    print(run_demo_stage())

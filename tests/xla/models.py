"""Tiny models shared by the fusedops.xla model tests (kept small: every shape compiles)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(width: int = 16, depth: int = 3) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(8, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, attention, MLP with GELU, dropout."""

    def __init__(self, dim: int = 16, heads: int = 2, p: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(p), nn.Linear(2 * dim, dim)
        )
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        h = (self.drop(attn.softmax(-1)) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.drop(self.proj(h))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch embedding (linear), ``depth`` blocks, mean pooling, classifier."""

    def __init__(self, dim: int = 16, depth: int = 2, p: float = 0.1, patch: int = 12):
        super().__init__()
        self.embed = nn.Linear(patch, dim)
        self.blocks = nn.Sequential(*[Block(dim, 2, p) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.embed(x))).mean(1))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 6, 3, stride=2, groups=2), nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class EmbedClassifier(nn.Module):
    def __init__(self, vocab: int = 20, dim: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.fc = nn.Linear(dim, 3)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

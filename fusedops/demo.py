"""The main job (``make demo``): train a small vision transformer on synthetic data with plain
PyTorch and with fusedops, and print step time, peak memory, final loss and the backend of
each op.

The third configuration runs the model's forward and backward as XLA programs
(``fusedops.xla.partial_trace``) with the loss and optimizer in eager PyTorch.

Every configuration runs in a fresh child process (same seed, same data), so peak memory is the
configuration's own and hooks never leak between runs. The model is written as ordinary user
code: ``nn.LayerNorm``, ``torch.optim.AdamW`` and a CLIP-style ``QuickGELU`` class; the fusedops
configuration only enables hooks before building it, and builds its blocks' residual branches
(``residual + dropout(x + bias)``) with ``fusedops.nn.BiasDropoutAdd``. Dropout masks differ
between configurations (each draws its own), so final losses differ by more than rounding.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys

import torch
from torch import nn
from torch.nn import functional as F

from fusedops._demo_loop import timed_steps

CONFIGS = ("plain PyTorch", "fusedops hooks", "partial_trace(xla)")
DROPOUT = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's command-line options."""
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--config", choices=CONFIGS, help="run one configuration (child mode)")


class QuickGELU(nn.Module):
    """CLIP's activation, as CLIP's model code writes it (the quick_gelu hook replaces it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class DropoutAdd(nn.Module):
    """``residual + dropout(x + bias)`` as model code writes it (the fusedops configuration
    builds ``fusedops.nn.BiasDropoutAdd`` instead: one kernel, no saved mask)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x, bias, residual):
        return residual + F.dropout(x + bias, self.p, self.training)


class Block(nn.Module):
    """Pre-norm transformer block, as in ViT / CLIP, with dropout on both residual branches."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, fused: bool = False):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.act = QuickGELU()
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)
        if fused:
            from fusedops.nn import BiasDropoutAdd as drop_add
        else:
            drop_add = DropoutAdd
        self.drop_add1, self.drop_add2 = drop_add(DROPOUT), drop_add(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)
        h = F.linear(attn.transpose(1, 2).reshape(batch, tokens, dim), self.proj.weight)
        x = self.drop_add1(h, self.proj.bias, x)
        h = F.linear(self.act(self.fc1(self.norm2(x))), self.fc2.weight)
        return self.drop_add2(h, self.fc2.bias, x)


class TinyViT(nn.Module):
    """32x32 RGB images, 4x4 patches (64 tokens), ``depth`` blocks, mean-pooled classifier.

    Input (B, 3, 32, 32) float; output (B, classes) logits.
    """

    def __init__(self, dim=128, depth=4, heads=4, classes=10, patch=4, fused=False):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.pos = nn.Parameter(torch.randn(1, (32 // patch) ** 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, fused=fused) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)  # B, 3, 8, 8, p, p
        patches = patches.permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)
        x = self.blocks(self.embed(patches) + self.pos)
        return self.head(self.norm(x).mean(dim=1))


def _enable_all_hooks() -> None:
    """Every hook with something to patch here (``FUSEDOPS_HOOKS=all``: none for libraries that
    are not installed), quick_gelu with this module's QuickGELU as well."""
    from fusedops import hooks

    hooks.enable_from_spec(f"all,quick_gelu:{__name__}.QuickGELU")


def run_config(config: str, steps: int, batch: int, device: str) -> dict:
    """Train ``steps`` steps in this process; returns the row of the results table."""
    import resource

    from fusedops import dispatch

    if config == "fusedops hooks":
        _enable_all_hooks()
    torch.manual_seed(0)
    model = TinyViT(fused=config == "fusedops hooks").to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = model
    if config == "partial_trace(xla)":  # the backbone as XLA programs; loss, optimizer eager
        from fusedops.xla import partial_trace

        forward = partial_trace(model)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, 32, 32, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, loss = timed_steps(
        lambda: F.cross_entropy(forward(images), labels), optimizer, steps, device
    )
    if device == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
        memory_kind = "CUDA max allocated"
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        memory_kind = "process peak RSS"
    stats = getattr(forward, "stats", None)
    return {
        "config": config,
        # partial_trace: how each region ran ("xla" or "eager", fusedops.xla.pick)
        "regions": [p["pick"] for p in stats.picks] if stats is not None else [],
        "step_ms": 1e3 * statistics.median(times[1:] or times),
        "first_step_ms": 1e3 * times[0],
        "peak_mb": peak_mb,
        "memory_kind": memory_kind,
        "final_loss": float(loss),
        "backends": dict(dispatch.last_used),
        "optimizer": type(optimizer).__module__ + "." + type(optimizer).__name__,
        "layer_norm_class": type(model.norm).__module__ + "." + type(model.norm).__name__,
    }


def _run_child(config: str, args: argparse.Namespace, device: str) -> dict:
    command = [sys.executable, "-m", "fusedops", "demo", "--config", config]
    command += ["--steps", str(args.steps), "--batch", str(args.batch), "--device", device]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"demo configuration {config!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_table(rows: list[dict]) -> None:
    base = rows[0]["final_loss"]
    header = ("configuration", "step ms", "1st step ms", "peak MB", "final loss", "|diff| vs plain")
    lines = [header]
    for row in rows:
        lines.append(
            (
                row["config"],
                f"{row['step_ms']:.2f}",
                f"{row['first_step_ms']:.0f}",
                f"{row['peak_mb']:.0f}",
                f"{row['final_loss']:.6f}",
                f"{abs(row['final_loss'] - base):.2e}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"(peak memory: {rows[0]['memory_kind']})")
    if any(backend == "native" for row in rows for backend in row["backends"].values()):
        print(
            "(fusedops' fused kernels run on a GPU; here PyTorch's native ops ran in their place, "
            "the 'native' backend)"
        )
    for row in rows[1:]:
        print(
            f"\n{row['config']}: optimizer {row['optimizer']}, LayerNorm {row['layer_norm_class']}"
        )
        for op, backend in sorted(row["backends"].items()):
            print(f"  {op:<20} ran on {backend}")
        eager = row.get("regions", []).count("eager")
        if not row["backends"] and eager:
            print(
                f"  {eager} of its {len(row['regions'])} regions ran as eager torch, which their "
                "first call measured faster than XLA here (FUSEDOPS_XLA_CPU_PICK=0 keeps XLA)"
            )
        elif not row["backends"]:
            print("  no fusedops kernel ops ran: forward and backward were XLA programs (JAX)")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``python -m fusedops demo``."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.config:
        print(json.dumps(run_config(args.config, args.steps, args.batch, device)))
        return 0
    print(f"fusedops demo: TinyViT, {args.steps} steps, batch {args.batch}, device {device}\n")
    configs = list(CONFIGS)
    if importlib.util.find_spec("jax") is None:
        configs.remove("partial_trace(xla)")
        print("(partial_trace(xla) skipped: jax is not installed; pip install -e '.[xla]')\n")
    rows = [_run_child(config, args, device) for config in configs]
    _print_table(rows)
    from fusedops import demo_swin  # the Swin stage: transformers' Swin with the swin hook

    demo_swin.main(args.steps, args.batch, device)
    return 0

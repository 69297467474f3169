"""Data-parallel training with fusedops.xla, launched by torchrun as any DDP script.

    torchrun --nproc_per_node=2 examples/ddp_train.py --mode partial_trace
    torchrun --nproc_per_node=2 examples/ddp_train.py --mode partial_trace --fsdp
    torchrun --nproc_per_node=2 examples/ddp_train.py --mode xla_trace
    torchrun --nproc_per_node=2 examples/ddp_train.py --mode eager      # the reference

Each rank trains an MLP classifier (a backbone of ``--depth`` Linear+GELU layers of width
``--width``, a head) on its own random batches: on CPU with gloo, on ``cuda:LOCAL_RANK`` with
NCCL where CUDA is present. ``partial_trace`` runs the backbone as XLA programs inside
DistributedDataParallel (or FSDP2's ``fully_shard`` with ``--fsdp``); ``xla_trace`` runs the
whole step (forward, backward, DDP's gradient all-reduce, AdamW) as XLA programs with the
all-reduce between them. Rank 0 prints the loss every 10 steps and, at the end, one JSON line:
the mode, the ranks, the median ms/step after the first 3 steps (compiles) and whether every
rank holds the same parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # fusedops from this checkout


class Net(nn.Module):
    """``depth`` Linear+GELU layers of ``width`` (the backbone) and a 10-way head."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(32, width), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.backbone(x))


def train_step(x, y, *, model, opt):
    """One step as eager code: ``x`` [batch, 32] float32, ``y`` [batch] int64 labels."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def build(mode: str, fsdp: bool, width: int, depth: int, device: torch.device):
    """(model wrapped for ``mode``, optimizer, step function)."""
    from fusedops.xla import partial_trace, xla_trace

    torch.manual_seed(0)  # the same initial weights on every rank
    model = Net(width, depth).to(device)
    if mode == "partial_trace":
        model.backbone = partial_trace(model.backbone)
    if fsdp:
        if mode == "xla_trace":
            raise SystemExit("--fsdp: with --mode eager or partial_trace (xla_trace takes DDP)")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        fully_shard(model.backbone, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, xla_trace(train_step) if mode == "xla_trace" else train_step


def ranks_agree(model: nn.Module) -> bool:
    """Whether every rank holds the same parameters (max |difference| to rank 0's is 0)."""
    worst = torch.zeros((), device=next(model.parameters()).device)
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        reference = full.clone()
        dist.broadcast(reference, src=0)
        worst = torch.maximum(worst, (full - reference).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return bool(worst == 0)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("eager", "partial_trace", "xla_trace"), required=True)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4 (3 warm-up steps are not timed)")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        model, opt, step = build(args.mode, args.fsdp, args.width, args.depth, device)
        generator = torch.Generator(device="cpu").manual_seed(1234 + rank)  # data per rank
        times = []
        for i in range(args.steps):
            x = torch.randn(args.batch, 32, generator=generator).to(device)
            y = torch.randint(0, 10, (args.batch,), generator=generator).to(device)
            start = time.perf_counter()
            loss = step(x, y, model=model, opt=opt)
            loss = float(loss.detach())  # waits for the step
            times.append(time.perf_counter() - start)
            if rank == 0 and i % 10 == 0:
                print(f"step {i:3d}  loss {loss:.4f}", flush=True)
        result = {
            "mode": args.mode,
            "wrapper": "fsdp2" if args.fsdp else "ddp",
            "world": world,
            "device": device.type,
            "step_ms_median": round(1e3 * statistics.median(times[3:]), 3),
            "first_step_s": round(times[0], 2),
            "final_loss": round(loss, 6),
            "ranks_agree": ranks_agree(model),
        }
        if rank == 0:
            print(json.dumps(result), flush=True)
        return result
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""FusedAdam / FusedAdamW under DistributedDataParallel and FSDP2 (fully_shard, DTensor params):
two processes on the gloo backend (CPU), each compared with torch.optim.Adam / AdamW under the
same wrapping. Uneven shards: FSDP2 splits the 5-row layer 3 + 2."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fusedops._env import triton_interpreter
from fusedops.testing import assert_close, backends_under_test, run_gloo

WORLD = 2
STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))


def _wrap(model: nn.Module, wrapping: str) -> nn.Module:
    if wrapping == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _compare(rank: int, wrapping: str, kind: str, backend: str) -> None:
    from fusedops.optim import FusedAdam, FusedAdamW

    fused_cls, torch_cls = {
        "adam": (FusedAdam, torch.optim.Adam),
        "adamw": (FusedAdamW, torch.optim.AdamW),
    }[kind]
    ours, theirs = _wrap(_model(), wrapping), _wrap(_model(), wrapping)
    options = dict(lr=0.01, weight_decay=0.01, amsgrad=True)
    opt = fused_cls(ours.parameters(), backend=backend, **options)
    ref_opt = torch_cls(theirs.parameters(), **options)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(STEPS):
        x = torch.randn(4, 8, generator=generator)
        for model, optimizer in ((ours, opt), (theirs, ref_opt)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    where = f"{wrapping}/{kind}/{backend} rank {rank}"
    for p, q in zip(ours.parameters(), theirs.parameters()):
        if wrapping == "fsdp":
            assert hasattr(p, "to_local") and hasattr(opt.state[p]["exp_avg"], "to_local")
        assert_close(_full(p), _full(q), msg=f"{where} param")
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            actual, expected = _full(opt.state[p][key]), _full(ref_opt.state[q][key])
            assert_close(actual, expected, msg=f"{where} {key}")
        assert float(opt.state[p]["step"]) == STEPS


def _worker(rank: int, world: int, backends: list[str]) -> None:
    for backend in backends:
        for wrapping, kind in (("ddp", "adam"), ("fsdp", "adamw")):
            _compare(rank, wrapping, kind, backend)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_ddp_and_fsdp2_match_torch_on_gloo():
    # gloo runs on CPU tensors: the kernels there only through the Triton interpreter.
    backends = [b for b in backends_under_test() if b == "reference" or triton_interpreter()]
    backends = [b for b in backends if b != "cuda"]
    run_gloo(_worker, WORLD, backends, timeout=240)

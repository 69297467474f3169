"""partial_trace and xla_trace under torch.distributed: spawned gloo process groups (2 and 4 ranks,
CPU), each rank comparing the traced model with the eager one under the same wrapper
(DistributedDataParallel, FSDP2's fully_shard) on its own random data."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fusedops.testing import assert_close, run_gloo

pytest.importorskip("jax")
pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="no gloo"
)

#: in each rank: compiled programs cached where the parent's are, no dot-library timing
#: the CPU's choice between XLA and eager (fusedops.xla.pick) switched on: with several ranks
#: it must keep XLA untimed, which the checks of the XLA programs' calls below rely on
ENV = {"FUSEDOPS_XLA_CPU_TUNE": "0", "FUSEDOPS_XLA_CPU_PICK": "1"}
STEPS = 3
WIDTH = 512  # a WIDTH x WIDTH fp32 layer is 1 MiB: DDP's smallest bucket cap, one bucket each


class _Net(nn.Module):
    """A backbone (traced) and a head (eager) on top of it."""

    def __init__(self, width: int):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(8, width), nn.GELU(), nn.Linear(width, width), nn.Tanh(),
            nn.Linear(width, width),
        )  # fmt: skip
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


def _pair(width: int, seed: int) -> tuple[nn.Module, nn.Module]:
    """(eager model, the same model with its backbone under partial_trace), equal weights."""
    from fusedops.xla import partial_trace

    torch.manual_seed(seed)
    eager = _Net(width)
    traced = copy.deepcopy(eager)
    traced.backbone = partial_trace(traced.backbone)
    return eager, traced


def _data(seed: int, rank: int, step: int, rows: int = 4) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank * 100 + step)
    return torch.randn(rows, 8, generator=generator, device="cpu")


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _assert_same(traced: nn.Module, eager: nn.Module, what: str, where: str) -> None:
    """Parameters (``what="param"``) or their gradients of the two models agree within fp32
    roundoff of sums over ``WIDTH`` products."""
    pairs = list(zip(traced.named_parameters(), eager.named_parameters()))
    assert pairs
    for (_, p), (name, q) in pairs:
        a, b = (p, q) if what == "param" else (p.grad, q.grad)
        assert (a is None) == (b is None), f"{where} {name}.{what}"
        if a is None:
            continue
        a, b = _full(a), _full(b)
        scale = float(b.abs().max()) + 1e-30
        assert_close(a, b, dtype=torch.float32, terms=WIDTH, magnitude=scale, msg=f"{where} {name}")


# --------------------------------------------------------------------------------------------
# partial_trace inside DistributedDataParallel


def _record_programs(events: list) -> None:
    """Log each XLA program call (forward or backward) into ``events``, in this process."""
    from fusedops.xla.program import JaxProgram

    original = JaxProgram.__call__

    def call(self, args):
        events.append(("program", self.name))
        return original(self, args)

    JaxProgram.__call__ = call


def _ddp_partial_trace(rank: int, world: int, seed: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    eager, traced = _pair(WIDTH, seed)
    eager = nn.parallel.DistributedDataParallel(eager, bucket_cap_mb=1)
    traced = nn.parallel.DistributedDataParallel(traced, bucket_cap_mb=1)
    events: list = []
    _record_programs(events)

    def hook(state, bucket):
        events.append(("allreduce", bucket.index()))
        return allreduce_hook(state, bucket)

    traced.register_comm_hook(dist.group.WORLD, hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, traced)]
    where = f"ddp rank {rank}/{world} seed {seed}"
    for step in range(STEPS):
        x = _data(seed, rank, step)
        losses = []
        for model, opt in zip((eager, traced), opts):
            opt.zero_grad()
            loss = model(x).square().mean()
            if model is traced:
                events.clear()
            loss.backward()
            losses.append(loss.detach())
        assert_close(losses[1], losses[0], dtype=torch.float32, terms=WIDTH, msg=where)
        _assert_same(traced, eager, "grad", f"{where} step {step}")
        for opt in opts:
            opt.step()
        _assert_same(traced, eager, "param", f"{where} step {step}")
    # the gradients leave the XLA backward bucket by bucket: DDP's all-reduce of the first
    # buckets runs before the last backward programs (DDP's buckets split the traced region)
    # (events: the last step's traced backward)
    backward = [i for i, e in enumerate(events) if e == ("program", "backward")]
    reduces = [i for i, e in enumerate(events) if e[0] == "allreduce"]
    buckets = {e[1] for e in events if e[0] == "allreduce"}
    assert len(backward) >= 2 and len(reduces) == len(buckets) >= 3, events
    assert reduces[0] < backward[-1], events
    assert traced.module.backbone.stats.picks == [], where  # several ranks: XLA, untimed


def _ddp_no_sync_accumulation(rank: int, world: int, seed: int) -> None:
    """Two micro-batches, the first under no_sync(): local gradients, then one all-reduce.
    Buckets under DDP's first (1 MiB), which Dynamo's bucket split refuses: one region."""
    eager, traced = _pair(16, seed)
    eager = nn.parallel.DistributedDataParallel(eager, bucket_cap_mb=0.001)
    traced = nn.parallel.DistributedDataParallel(traced, bucket_cap_mb=0.001)
    where = f"ddp no_sync rank {rank}/{world} seed {seed}"
    reduced = []
    traced.register_comm_hook(None, _counting_hook(reduced))
    for model in (eager, traced):
        with model.no_sync():
            model(_data(seed, rank, 0)).square().mean().backward()
    assert not reduced
    _assert_same(traced, eager, "grad", f"{where} local")
    local = traced.module.head.weight.grad.clone()
    for model in (eager, traced):
        model(_data(seed, rank, 1)).square().mean().backward()
    assert reduced
    _assert_same(traced, eager, "grad", f"{where} accumulated")
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, traced.module.head.weight.grad)
    assert all(torch.equal(g, gathered[0]) for g in gathered), where  # synchronised
    assert not torch.equal(local, traced.module.head.weight.grad)


def _counting_hook(calls: list):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(dist.group.WORLD, bucket)

    return hook


# --------------------------------------------------------------------------------------------
# partial_trace inside FSDP2


def _fsdp_partial_trace(rank: int, world: int, seed: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("cpu", (world,))
    eager, traced = _pair(16, seed)
    for model in (eager, traced):
        fully_shard(model.backbone, mesh=mesh)  # the traced module: its own all-gather
        fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in traced.parameters())
    # SGD: parameters move linearly with the gradients, so the gradients' bound carries over
    # (Adam's m / sqrt(v) turns a rounding difference of a near-zero gradient into up to lr)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, traced)]
    where = f"fsdp rank {rank}/{world} seed {seed}"
    for step in range(STEPS):
        x = _data(seed, rank, step)
        for model, opt in zip((eager, traced), opts):
            opt.zero_grad()
            model(x).square().mean().backward()
        _assert_same(traced, eager, "grad", f"{where} step {step}")
        for opt in opts:
            opt.step()
    _assert_same(traced, eager, "param", where)
    assert all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) for p in traced.parameters())
    assert traced.backbone.stats.programs >= 2  # the backbone did run as XLA programs
    # fully_shard inside the traced module: its hooks break the graph; one warning says so
    from fusedops.xla import partial_trace

    inner = nn.Sequential(nn.Linear(8, 4), nn.GELU())
    fully_shard(inner[0], mesh=mesh)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        partial_trace(inner)(_data(seed, rank, 0))
    assert any("applied inside the traced module (0)" in str(w.message) for w in caught), where


# --------------------------------------------------------------------------------------------
# xla_trace of a step with a DDP model, or with its own all_reduce of the gradients


def _ddp_step(x, y, *, model, opt, scaler=None):
    loss = nn.functional.cross_entropy(model(x), y)
    (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)  # unscale_ checks the gradients DDP has all-reduced
        scaler.update()
    opt.zero_grad()
    return loss


def _ddp_accumulate_step(x, y, *, model, opt, scaler=None):
    """Gradient accumulation in one step: the first half-batch under no_sync() (local
    gradients), the second synchronised (DDP all-reduces the accumulated gradients)."""
    assert scaler is None
    half = x.shape[0] // 2
    with model.no_sync():
        nn.functional.cross_entropy(model(x[:half]), y[:half]).backward()
    loss = nn.functional.cross_entropy(model(x[half:]), y[half:])
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _all_reduce_step(x, y, *, model, opt, scaler=None):
    """The pattern without DDP: all-reduce each gradient, then average."""
    loss = nn.functional.cross_entropy(model(x), y)
    (loss if scaler is None else scaler.scale(loss)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()
    opt.zero_grad()
    return loss


def _optimizer(name: str, params):
    from fusedops.optim import FusedAdam, FusedAdamW

    return {
        "sgd": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=0.01),
        "fused_adam": lambda: FusedAdam(params, lr=0.01, backend="reference"),
        "fused_adamw": lambda: FusedAdamW(params, lr=0.01, weight_decay=0.01, backend="reference"),
    }[name]()


def _xla_trace_case(rank, world, seed, pattern, opt_name, scaled) -> None:
    from fusedops.xla import xla_trace

    torch.manual_seed(seed)
    base = nn.Sequential(
        nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 4)
    )  # BatchNorm: DDP broadcasts rank 0's running stats at each forward
    eager, traced = base, copy.deepcopy(base)
    if pattern.startswith("ddp"):
        eager = nn.parallel.DistributedDataParallel(eager)
        traced = nn.parallel.DistributedDataParallel(traced)
    fn = {"ddp": _ddp_step, "ddp_accumulate": _ddp_accumulate_step}.get(pattern, _all_reduce_step)
    step = xla_trace(fn)
    opts = [_optimizer(opt_name, m.parameters()) for m in (eager, traced)]
    scalers = [
        torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2) if scaled else None
        for _ in range(2)
    ]
    where = f"xla_trace {pattern}/{opt_name}/scaled={scaled} rank {rank}/{world} seed {seed}"
    for i in range(STEPS):
        x = _data(seed, rank, i, rows=8)  # BatchNorm over 4 rows in a half-batch
        y = torch.randint(
            0, 4, (8,), generator=torch.Generator().manual_seed(seed + i), device="cpu"
        )
        if scaled and i == 1 and rank == world - 1:
            x[0, 0] = float("inf")  # one rank overflows: every rank must skip (after reduction)
        expected = fn(x, y, model=eager, opt=opts[0], scaler=scalers[0])
        loss = step(x, y, model=traced, opt=opts[1], scaler=scalers[1])
        assert_close(loss, expected, dtype=torch.float32, terms=16, msg=f"{where} loss {i}")
        if scaled:
            assert torch.equal(scalers[1]._scale, scalers[0]._scale), where
    if scaled:
        assert scalers[1].get_scale() == 2.0**15, where  # backed off once, grown once
    _assert_same(traced, eager, "param", where)
    for a, b in zip(traced.buffers(), eager.buffers()):
        assert_close(a, b, dtype=torch.float32, terms=16, msg=f"{where} buffer")
    gathered = [torch.empty_like(p) for p in (next(traced.parameters()),) for _ in range(world)]
    dist.all_gather(gathered, next(traced.parameters()).detach())
    assert all(torch.equal(g, gathered[0]) for g in gathered), where  # ranks in step
    assert step.programs == 1
    split = next(iter(step._compiled.values())).program.split  # XLA programs between collectives
    assert sum(1 for n, _ in split.named_children() if n.startswith("fused_")) >= 2, where


#: per world size, what its one process group runs (one spawn each: a rank's first trace and
#: compile cost most of its time): partial_trace checks, then xla_trace cases (pattern,
#: optimizer, GradScaler); together both sizes cover every pattern and optimizer, scaled too
PLANS = {
    2: (
        (_ddp_partial_trace, _ddp_no_sync_accumulation, _fsdp_partial_trace),
        (
            ("ddp_accumulate", "fused_adamw", False),
            ("all_reduce", "adam", True),
            ("all_reduce", "fused_adam", False),
        ),
    ),
    4: (
        (_ddp_no_sync_accumulation, _fsdp_partial_trace),
        (("ddp", "sgd", True),),
    ),
}


def _checks(rank: int, world: int, seed: int) -> None:
    partial, cases = PLANS[world]
    for check in partial:
        check(rank, world, seed)
    for case in cases:
        _xla_trace_case(rank, world, seed, *case)


@pytest.mark.parametrize("world", sorted(PLANS))
def test_partial_trace_and_xla_trace_on_gloo(world):
    seed = int(torch.randint(0, 2**20, (), device="cpu").item())
    run_gloo(_checks, world, seed, timeout=300, env=ENV)  # 33-98 s seen (2-core load 1-16)

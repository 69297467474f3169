"""Collectives in an ``xla_trace`` step: run by torch.distributed between the step's XLA programs.

While a step is traced, ``torch.distributed.all_reduce`` (what a step calls on its gradients
itself) and a ``DistributedDataParallel`` module's gradient synchronisation become calls of the
ops below: opaque to XLA (no lowering), so the step's graph is split at each of them
(``split_at_collectives``); the parts before and after run as XLA programs and each collective
runs between them through torch.distributed on the torch tensors (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from fusedops.xla.errors import XLATraceError

#: reduce ops a traced all_reduce takes (gloo has no AVG: it runs as SUM, then a division)
_REDUCE_OPS = ("sum", "avg", "product", "min", "max")


def _reduce_op(op) -> str:
    for name in _REDUCE_OPS:
        if op == getattr(dist.ReduceOp, name.upper()):
            return name
    raise XLATraceError(f"xla_trace: all_reduce with op {op!r} is not supported ({_REDUCE_OPS})")


def _group_name(group) -> str:
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise XLATraceError("xla_trace: a collective in the step needs torch.distributed started")
    return group.group_name


def _group(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


@torch.library.custom_op("fusedops_xla::all_reduce", mutates_args=())
def all_reduce(tensor: torch.Tensor, op: str, group: str) -> torch.Tensor:
    """A reduced copy of ``tensor`` (any shape/dtype the process group reduces) over the
    process group named ``group``; ``op``: sum, avg, product, min or max."""
    out = tensor.clone()
    torch_op = dist.ReduceOp.SUM if op == "avg" else getattr(dist.ReduceOp, op.upper())
    dist.all_reduce(out, op=torch_op, group=_group(group))
    if op == "avg":
        out.div_(dist.get_world_size(_group(group)))
    return out


@all_reduce.register_fake
def _(tensor, op, group):
    return torch.empty_like(tensor)


@torch.library.custom_op("fusedops_xla::broadcast", mutates_args=())
def broadcast(tensor: torch.Tensor, src: int, group: str) -> torch.Tensor:
    """A copy of rank ``src``'s ``tensor`` (same shape/dtype on every rank) in every rank of
    the process group named ``group``."""
    out = tensor.clone()
    dist.broadcast(out, src=src, group=_group(group))
    return out


@broadcast.register_fake
def _(tensor, src, group):
    return torch.empty_like(tensor)


#: the ops a step's graph is split at
OPS = frozenset(
    {torch.ops.fusedops_xla.all_reduce.default, torch.ops.fusedops_xla.broadcast.default}
)


class _Done:
    """The work handle of a traced ``all_reduce(async_op=True)``: already complete."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _traced_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    tensor.copy_(all_reduce(tensor, _reduce_op(op), _group_name(group)))
    return _Done() if async_op else None


def ddp_modules(modules) -> list:
    """The ``DistributedDataParallel`` modules among ``modules``."""
    if not dist.is_available():
        return []
    ddp = torch.nn.parallel.DistributedDataParallel
    return [m for m in modules if isinstance(m, ddp)]


def ddp_key(modules) -> tuple:
    """What of the DDP modules' settings shapes a traced step."""
    return tuple(
        (
            m.require_backward_grad_sync,
            m.require_forward_param_sync,
            m.bucket_bytes_cap,
            _syncs_buffers(m),
        )
        for m in ddp_modules(modules)
    )


def _syncs_buffers(ddp) -> bool:
    """Whether ``ddp`` broadcasts rank 0's buffers before a forward (torch 2.13 names it
    ``forward_sync_buffers``; ``broadcast_buffers`` before)."""
    return bool(getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", False)))


def ddp_buckets(nbytes: list[int], cap: int) -> list[list[int]]:
    """Positions of tensors of sizes ``nbytes`` grouped as DDP's buckets: in reverse order, the
    first bucket up to torch's first-bucket size, the others up to ``cap`` bytes."""
    buckets, size = [[]], 0
    limit = min(dist._DEFAULT_FIRST_BUCKET_BYTES, cap)
    for i in reversed(range(len(nbytes))):
        if buckets[-1] and size + nbytes[i] > limit:
            buckets.append([])
            size, limit = 0, cap
        buckets[-1].append(i)
        size += nbytes[i]
    return [b for b in buckets if b]


def ddp_average(ddp, grads: list) -> list:
    """``grads`` (traced gradients of ``ddp``'s parameters in order; None for a parameter
    without one) averaged over ``ddp``'s process group as DDP does: bucket by bucket, each
    gradient scaled by 1/world, the bucket flattened into one tensor and all-reduced (sum)."""
    group = ddp.process_group
    scale = 1.0 / dist.get_world_size(group)
    present = [i for i, g in enumerate(grads) if g is not None]
    sizes = [grads[i].numel() * grads[i].element_size() for i in present]
    out = list(grads)
    for bucket in ddp_buckets(sizes, ddp.bucket_bytes_cap):
        chosen = [present[k] for k in bucket]
        flat = torch.cat([(grads[i] * scale).reshape(-1) for i in chosen])
        flat = all_reduce(flat, "sum", _group_name(group))
        for i, piece in zip(chosen, flat.split([grads[i].numel() for i in chosen])):
            out[i] = piece.view(grads[i].shape)
    return out


@contextlib.contextmanager
def traced_distributed(on_ddp_forward):
    """During a step's trace: ``torch.distributed.all_reduce`` records a collective, and a DDP
    module's forward runs its module directly, calling ``on_ddp_forward(ddp)`` when its
    backward is to synchronise. As DDP does, a forward first broadcasts rank 0's buffers
    when the previous forward was one that synchronises (not under ``no_sync()``). Yields
    {DDP module: its ``require_forward_param_sync`` after the step}, for the caller to set
    after each call of the compiled step (the trace leaves the modules as they were)."""
    after: dict = {}
    if not dist.is_available():
        yield after
        return
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    original_all_reduce, original_forward = dist.all_reduce, ddp_cls.forward

    def forward(self, *args, **kwargs):
        if _syncs_buffers(self) and after.get(self, self.require_forward_param_sync):
            name = _group_name(self.process_group)
            with torch.no_grad():
                for b in self.module.buffers():
                    b.copy_(broadcast(b, 0, name))
        syncing = torch.is_grad_enabled() and self.require_backward_grad_sync
        after[self] = syncing
        if syncing:
            on_ddp_forward(self)
        return self.module(*args, **kwargs)

    dist.all_reduce = _traced_all_reduce
    ddp_cls.forward = forward
    try:
        yield after
    finally:
        dist.all_reduce = original_all_reduce
        ddp_cls.forward = original_forward

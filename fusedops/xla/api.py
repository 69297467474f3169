"""``partial_trace``: run the static regions of a PyTorch function or module as XLA programs."""

from __future__ import annotations

import functools
import warnings

import torch

from fusedops.utils.wrapping import ModelWrapper
from fusedops.xla.errors import XLATraceError

BACKENDS = ("xla", "eager", "inductor")


def _unwrap(error: BaseException) -> BaseException | None:
    """Our own error inside Dynamo's wrappers (BackendCompilerFailed and the like), if any."""
    seen = error
    while seen is not None:
        if isinstance(seen, XLATraceError):
            return seen
        inner = getattr(seen, "inner_exception", None)
        seen = inner if inner is not None else seen.__cause__
    return None


def partial_trace(
    fn=None,
    *,
    backend: str = "xla",
    capture_as_const: bool = False,
    fullgraph: bool = False,
):
    """Compile ``fn`` (a function or ``nn.Module``) region by region.

    ``backend="xla"``: each static region (between graph breaks such as ``.item()``) becomes one
    XLA program for its forward and one for its backward; autograd, parameters and mutated
    buffers behave as in eager. ``"eager"`` runs ``fn`` as is; ``"inductor"`` is
    ``torch.compile``'s default. Inputs keep any shape/dtype the ops take; each new shape, or a
    train/eval switch, compiles new programs. ``capture_as_const=True`` bakes tensors ``fn``
    closes over (not parameters/buffers) into the program; otherwise they are read each call.
    ``fullgraph=True`` raises (``XLATraceError``) on graph breaks and on ops with no lowering.

    On CPU, torch's idle OpenMP threads are put to sleep before each XLA program
    (``fusedops.xla.omp.park``; they spin after each torch op and would take the cores XLA's
    own threads need): no ``OMP_WAIT_POLICY`` needed, eager ops keep OpenMP's defaults. On CPU
    each program's first call also picks its dot library (``fusedops.xla.tune``;
    ``FUSEDOPS_XLA_CPU_TUNE=0`` turns that off), and each region's first call times it as XLA
    and as eager torch, forward and backward, and keeps the faster for its later calls
    (``fusedops.xla.pick``: XLA:CPU's matrix products lose to torch's on some CPUs; the trials
    leave buffers and the random state as they were; ``stats.picks`` says what each region
    runs as; ``FUSEDOPS_XLA_CPU_PICK=0`` keeps XLA everywhere).
    Usable as ``@partial_trace`` or ``@partial_trace(backend=..., ...)``.

    Returns, for a function, the compiled function (``.stats``: ``programs``, ``regions``,
    ``picks``...); for a module, a module running it so (``"xla"`` and ``"inductor"``;
    ``"eager"`` returns the module itself): a ``fusedops.utils.wrapping.ModelWrapper``, whose
    ``state_dict()`` / ``load_state_dict()`` keys, ``parameters()``, buffers and
    ``train()``/``eval()`` are the module's own (no ``module.`` or ``_orig_mod.`` prefix: a
    checkpoint saved from it loads into the plain module and back), whose other attributes read
    the module's, and whose ``.module`` is the module (``.stats``: what XLA compiled).

    Under ``torch.distributed``: wrap the traced module in ``DistributedDataParallel`` or
    ``fully_shard`` (FSDP2) as any module. Inside DDP each region is split at DDP's bucket
    boundaries, so DDP all-reduces a bucket as soon as its backward program hands its
    gradients back, while the next programs run; FSDP2's all-gather runs before the traced
    module's forward (the programs see whole parameters) and its reduce-scatter after the
    gradients are handed back.
    """
    if backend not in BACKENDS:
        raise ValueError(f"partial_trace: unknown backend {backend!r}; choose one of {BACKENDS}")
    if fn is None:
        return functools.partial(
            partial_trace, backend=backend, capture_as_const=capture_as_const, fullgraph=fullgraph
        )
    if backend == "eager":
        return fn
    if backend == "inductor":
        compiled = torch.compile(fn, dynamic=False, fullgraph=fullgraph)
        return _CompiledModule(fn, compiled) if isinstance(fn, torch.nn.Module) else compiled
    from fusedops.xla.backend import Stats, make_backend

    stats = Stats()
    code = getattr(fn.forward if isinstance(fn, torch.nn.Module) else fn, "__code__", None)
    freevars = tuple(code.co_freevars) if code is not None else ()
    backend_fn = make_backend(
        stats, fullgraph=fullgraph, capture_as_const=capture_as_const, freevars=freevars
    )
    compiled = torch.compile(
        fn,
        backend=backend_fn,
        dynamic=False,
        fullgraph=fullgraph,
    )

    @functools.wraps(fn if not isinstance(fn, torch.nn.Module) else fn.forward)
    def run(*args, **kwargs):
        try:
            if _ddp_buckets_too_small():
                with torch._dynamo.config.patch(optimize_ddp=False):
                    return compiled(*args, **kwargs)
            return compiled(*args, **kwargs)
        except XLATraceError:
            raise
        except Exception as error:  # Dynamo wraps backend errors; surface ours plainly
            ours = _unwrap(error)
            if ours is not None:
                raise ours.with_traceback(None) from error
            if fullgraph and isinstance(error, torch._dynamo.exc.Unsupported):
                raise XLATraceError(
                    f"partial_trace(fullgraph=True) cannot capture this function as one "
                    f"region: {str(error).splitlines()[0]}"
                ) from error
            raise

    run.stats = stats
    run.compiled = compiled
    if isinstance(fn, torch.nn.Module):
        return _TracedModule(fn, run)
    return run


def _ddp_buckets_too_small() -> bool:
    """Whether this call runs inside the forward of a ``DistributedDataParallel`` whose buckets
    are smaller than its first one (``bucket_cap_mb`` under 1 MiB). Inside DDP's forward Dynamo
    splits each region at DDP's bucket boundaries (its DDPOptimizer), so each bucket's
    gradients leave their own backward program and DDP all-reduces them while the next
    programs run; that split refuses such buckets (an AssertionError), so the region stays
    whole: DDP then all-reduces every bucket after its one backward program."""
    if not torch.distributed.is_available():
        return False
    ddp = torch.nn.parallel.DistributedDataParallel._get_active_ddp_module()
    return ddp is not None and ddp.bucket_bytes_cap < torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


class _TracedModule(ModelWrapper):
    """A module whose calls go through ``partial_trace``: a ``ModelWrapper``, so its
    ``state_dict`` keys, parameters, buffers and train/eval are the wrapped module's own (no
    ``module.`` prefix); ``module`` is the wrapped module, ``stats`` what was compiled."""

    def __init__(self, module: torch.nn.Module, run):
        super().__init__(module)
        self._run = run
        self.stats = run.stats
        self._checked_sharding = False

    def forward(self, *args, **kwargs):
        if not self._checked_sharding:
            self._checked_sharding = True
            _warn_inner_fsdp(self.module)
        return self._run(*args, **kwargs)


class _CompiledModule(ModelWrapper):
    """``partial_trace(module, backend="inductor")``: calls go through ``torch.compile``'s
    module, whose own state_dict would prefix the keys with ``_orig_mod.``; this one keeps the
    module's keys (``ModelWrapper``)."""

    def __init__(self, module: torch.nn.Module, compiled: torch.nn.Module):
        super().__init__(module)
        # not a submodule: the submodule table is the wrapped module's
        object.__setattr__(self, "_compiled", compiled)

    def forward(self, *args, **kwargs):
        return self.__dict__["_compiled"](*args, **kwargs)


def _warn_inner_fsdp(module: torch.nn.Module) -> None:
    """Warn when FSDP2 (``fully_shard``) shards ``module`` or modules inside it: its hooks run
    inside the traced region, where Dynamo breaks the graph at each of them, so those layers
    run eagerly."""
    if not torch.distributed.is_available():
        return
    from torch.distributed.fsdp import FSDPModule

    sharded = [
        name or "(the module)" for name, m in module.named_modules() if isinstance(m, FSDPModule)
    ]
    if sharded:
        warnings.warn(
            f"partial_trace: fully_shard (FSDP2) was applied inside the traced module "
            f"({', '.join(sharded[:4])}{', ...' if len(sharded) > 4 else ''}); its hooks break "
            "the graph, so those layers run eagerly. Apply fully_shard to the module "
            "partial_trace returns, or to its parents, instead",
            stacklevel=5,  # the caller of the module
        )

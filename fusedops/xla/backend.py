"""The ``torch.compile`` backend behind ``partial_trace(backend="xla")``.

Dynamo hands each static region (guards, graph breaks) to AOTAutograd, which decomposes it to
core ATen, splits forward from backward and handles saved activations and mutated buffers. Each
forward and each backward graph becomes one ``JaxProgram``. Graphs with ops outside the lowering
table are split (``CapabilityBasedPartitioner``) into XLA islands and eager ops, with one warning
naming the ops; under ``fullgraph=True`` they raise ``UnsupportedOpsError`` instead. On the
CPU each region then runs as its XLA programs or as eager torch, whichever its first call
measured faster (``pick``).
"""

from __future__ import annotations

import functools
import operator
import os
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx
from functorch.compile import make_boxed_func
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from fusedops.xla import lower, pick
from fusedops.xla.errors import UnsupportedOpsError, XLATraceError
from fusedops.xla.program import JaxProgram, unsupported_ops

#: Ops lowered whole (fused) rather than decomposed: the decomposition and the backward kernel
#: would otherwise disagree on what the forward saved.
_KEEP = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


@functools.cache
def decompositions() -> dict:
    """core ATen decompositions, minus ops the lowering table takes whole (``_KEEP``)."""
    table = dict(core_aten_decompositions())
    for op in _KEEP:
        table.pop(op, None)
    return table


def recompile_limit() -> int:
    """Programs per traced function before a warning (env FUSEDOPS_XLA_RECOMPILE_LIMIT, 8)."""
    return int(os.environ.get("FUSEDOPS_XLA_RECOMPILE_LIMIT", "8"))


@dataclass
class Stats:
    """What one traced function compiled: ``programs`` (XLA programs, forward and backward
    counted apart), ``regions`` (Dynamo graphs), ``eager_ops`` (ops left to eager torch),
    ``picks`` (on the CPU, one per region timed so far: XLA or eager, ``pick.RegionPick``)."""

    programs: int = 0
    regions: int = 0
    eager_ops: set[str] = field(default_factory=set)
    picks: list[dict] = field(default_factory=list)
    warned_recompiles: bool = False
    compiled: list = field(default_factory=list, repr=False)

    @property
    def compile_s(self) -> list[float]:
        """First-call time (trace + XLA compile + run) of each program called so far."""
        return [p.compile_s for p in self.compiled if p.compile_s is not None]


class _Supported(OperatorSupport):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and lower.node_supported(source)
        return lower.node_supported(node)


class _JaxModule(torch.nn.Module):
    def __init__(self, program: JaxProgram):
        super().__init__()
        self.program = program

    def forward(self, *args):
        outs = self.program(list(args))
        return outs[0] if self.program.single else tuple(outs)


def _count(stats: Stats, program: JaxProgram) -> JaxProgram:
    stats.programs += 1
    stats.compiled.append(program)
    if stats.programs > recompile_limit() and not stats.warned_recompiles:
        stats.warned_recompiles = True
        warnings.warn(
            f"partial_trace: {stats.programs} XLA programs compiled for one function (limit "
            f"{recompile_limit()}); new input shapes or modes recompile each time",
            stacklevel=2,
        )
    return program


_DATA_DEPENDENT = ("nonzero", "_local_scalar_dense", "masked_select", "unique", "item")


def _unbacked_shape(value) -> bool:
    """Whether a node's value has a size only known at run time (an unbacked SymInt)."""
    return isinstance(value, torch.Tensor) and not all(isinstance(s, int) for s in value.shape)


def data_dependent_ops(gm: torch.fx.GraphModule) -> list[str]:
    """Ops in ``gm`` whose output shape or value is only known at run time (e.g. nonzero, or
    indexing with a boolean mask)."""
    found = set()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            name = getattr(n.target, "__name__", str(n.target))
            if (
                any(name.startswith(d) for d in _DATA_DEPENDENT)
                or "_assert_scalar" in name
                or _unbacked_shape(n.meta.get("val"))
            ):
                found.add(str(n.target))
    return sorted(found)


def compile_aten(
    gm: torch.fx.GraphModule,
    example_inputs,
    *,
    stats: Stats,
    fullgraph: bool,
    kind: str,
    constants: dict | None = None,
):
    """AOTAutograd's forward/backward compiler: ``gm`` (core ATen) -> boxed callable.
    ``constants``: forward inputs (by position) to bake in rather than read each call."""
    if constants:
        keep = _bake_constants(gm, constants)
        inner = compile_aten(gm, None, stats=stats, fullgraph=fullgraph, kind=kind)

        def run(args):
            kept = [args[i] for i in keep]
            args.clear()
            return inner(kept)

        run._boxed_call = True
        return run
    dynamic = data_dependent_ops(gm)
    if dynamic:
        raise XLATraceError(
            "partial_trace: data-dependent shapes or values cannot be one static XLA program "
            f"({', '.join(dynamic)}); use fullgraph=False so they run eagerly between regions"
        )
    missing = unsupported_ops(gm)
    if not missing:
        program = _count(stats, JaxProgram(gm, kind))
        return _boxed(program)
    if fullgraph:
        raise UnsupportedOpsError(missing)
    new = set(missing) - stats.eager_ops
    stats.eager_ops.update(missing)
    if new:  # once per traced function and op
        warnings.warn(
            f"partial_trace: no XLA lowering for {', '.join(sorted(new))}; these ops run eagerly "
            "between XLA programs",
            stacklevel=2,
        )
    split = split_programs(gm, lambda sub, name: _count(stats, JaxProgram(sub, f"{kind}:{name}")))
    return make_boxed_func(split.forward)


def split_programs(gm: torch.fx.GraphModule, make_program) -> torch.fx.GraphModule:
    """``gm`` split into XLA islands, each run by ``make_program(subgraph, name)`` (a
    ``JaxProgram``), and the ops without a lowering between them, which torch runs."""
    partitioner = CapabilityBasedPartitioner(gm, _Supported(), allows_single_node_partition=True)
    split = partitioner.partition_and_fuse()
    for name, sub in list(split.named_children()):
        if isinstance(sub, torch.fx.GraphModule) and name.startswith("fused_"):
            setattr(split, name, _JaxModule(make_program(sub, name)))
    split.recompile()
    return split


def _boxed(program: JaxProgram):
    def run(args):
        outs = program(args)
        args.clear()
        return outs

    run._boxed_call = True
    run.program = program
    return run


def closed_over_inputs(
    gm: torch.fx.GraphModule, example_inputs, freevars: tuple[str, ...] = ()
) -> dict[int, torch.Tensor]:
    """Positions (and values) of Dynamo graph inputs that are tensors the function closes over
    (``freevars``) or reads from globals: not arguments, parameters, buffers, nor requiring
    grad."""
    closure_prefixes = tuple(f"L[{v!r}]" for v in freevars)
    found = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", "")
        name = name() if callable(name) else str(name)
        if (
            isinstance(value, torch.Tensor)
            and not isinstance(value, torch.nn.Parameter)
            and not value.requires_grad
            and (name.startswith(closure_prefixes) or "closure" in name or name.startswith("G["))
            and "_buffers" not in name
            and "_parameters" not in name
        ):
            with unset_fake_temporarily():
                found[i] = value.detach().clone()
    return found


def _bake_constants(gm: torch.fx.GraphModule, constants: dict[int, torch.Tensor]) -> list[int]:
    """Replace placeholders at ``constants``' positions by get_attr nodes holding the values;
    return the positions of the placeholders kept."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    keep = []
    for i, node in enumerate(placeholders):
        if i not in constants:
            keep.append(i)
            continue
        attr = f"_fusedops_const_{i}"
        gm.register_buffer(attr, constants[i])
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(attr)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
    gm.recompile()
    return keep


def _on_cpu(example_inputs) -> bool:
    """Whether every tensor among a region's example inputs is a CPU tensor."""
    return all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))


def make_backend(
    stats: Stats,
    *,
    fullgraph: bool = False,
    capture_as_const: bool = False,
    freevars: tuple[str, ...] = (),
):
    """A ``torch.compile`` backend lowering every static region to XLA programs.
    ``freevars``: the traced function's closure variable names (for ``capture_as_const``)."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        stats.regions += 1
        constants = closed_over_inputs(gm, example_inputs, freevars) if capture_as_const else {}
        options = {"stats": stats, "fullgraph": fullgraph}
        fw = functools.partial(compile_aten, **options, kind="forward", constants=constants)
        bw = functools.partial(compile_aten, **options, kind="backward")
        aot = aot_autograd(
            fw_compiler=fw, bw_compiler=bw, inference_compiler=fw, decompositions=decompositions()
        )
        compiled = aot(gm, example_inputs)
        if not pick.enabled() or not _on_cpu(example_inputs):
            return compiled
        return pick.RegionPick(gm, compiled, stats.picks, constants)

    return backend

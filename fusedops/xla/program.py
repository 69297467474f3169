"""One ATen FX graph -> one jitted XLA program, called with torch tensors.

``JaxProgram(gm)`` interprets the graph with the lowering table (``lower.LOWERINGS``) inside
``jax.jit``; shapes are static, so each program compiles once on its first call. Every node's
result is checked against the FX node's FakeTensor (shape) and cast to its dtype, so torch's
type promotion holds. Calls run with 64-bit types enabled, so int64/float64 stay exact.

Each call runs on the JAX device of its torch tensors (``bridge.call_device``: the CPU for CPU
tensors whatever JAX's default backend is, the matching GPU for ``cuda:i``), with its seed and
baked-in constants there too; the program compiles once per device. On the CPU its first call
compiles it once per dot library and keeps the fastest (``tune``); before each CPU call,
torch's idle OpenMP threads are put to sleep (``omp.park``). Results are ready
(``block_until_ready``) and on the inputs' device when they return to torch.

On the CPU, small inputs and results (``PACK_MAX_ELEMENTS``: a batch norm's parameters,
statistics and their updates, biases) cross packed: per dtype, the inputs are copied into one
flat tensor by torch (one C++ call) and cut apart inside the program, and the results are
concatenated in the program and cut into tensors of their own (NumPy views of the flat
buffer) after it. Each crossing costs 5-10 us inside a training step (the NumPy view, the
jitted call's argument or result, the torch tensor, the remembered result), so a ResNet
program with a hundred such tensors saved about 0.3 ms a call; a packed result is not handed
back to a later program as its JAX array (copying it again costs less than its own crossing).

An output that is a chain of view ops of an input (AOTAutograd saving ``weight.t()`` for the
backward, a reshaped activation) is made by torch on the input tensor, as eager would, instead
of being copied out of the program: a free view, where XLA would materialise it (a BERT
masked-LM head's transposed [4096, 256] embedding: 3 ms a step on the 2-core CPU).
"""

from __future__ import annotations

import functools
import operator
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx
from jax import lax
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fusedops.xla import bridge, cache, lower, lower_nn, omp, rng, tune
from fusedops.xla._env import switched_on
from fusedops.xla.errors import XLATraceError

flatten_dense_tensors = torch._C._nn.flatten_dense_tensors

aten = torch.ops.aten

#: ops an output may be made of by torch on an input tensor (``JaxProgram(views_in_torch=)``):
#: views, which allocate nothing
VIEW_OPS = frozenset(
    {
        aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default,
        aten._unsafe_view.default, aten.expand.default, aten.unsqueeze.default,
        aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.alias.default,
        aten.slice.Tensor, aten.select.int, aten.detach.default,
    }
)  # fmt: skip

_RESHAPE = dict.fromkeys((aten.view.default, aten._unsafe_view.default), aten.reshape.default)


def _view_chain(node) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """(the placeholder, the view nodes from it to ``node`` in order) when ``node`` is views
    of a graph input only, else None."""
    chain = []
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target in VIEW_OPS
        and node.args
        and not any(isinstance(a, torch.fx.Node) for a in (*node.args[1:], *node.kwargs.values()))
    ):
        chain.append(node)
        node = node.args[0]
    if chain and isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return node, chain[::-1]
    return None


def _fix(value, meta, node):
    """Cast ``value`` to the dtype torch gives ``node``; raise if the shape disagrees."""
    if isinstance(meta, torch.Tensor):
        if value is None:
            return None
        value = jnp.asarray(value)
        if tuple(value.shape) != tuple(meta.shape):
            raise XLATraceError(
                f"lowering of {node.target} gave shape {tuple(value.shape)}, "
                f"torch gives {tuple(meta.shape)} (node {node.name})"
            )
        dtype = lower.jax_dtype(meta.dtype)
        return value if value.dtype == dtype else value.astype(dtype)
    if isinstance(meta, (tuple, list)) and isinstance(value, (tuple, list)):
        return tuple(_fix(v, m, node) for v, m in zip(value, meta))
    return value


_CONSTANT, _INPUT, _RESULT, _VIEW = "constant", "input", "result", "view"


def _result_fix(node: torch.fx.Node) -> tuple[bool, bool]:
    """What a result of ``node`` needs after crossing to torch: (a complex32 result, which
    JAX computed in complex64; a CPU scalar, e.g. an optimizer's step count, that must go
    back to the CPU when the program ran on an accelerator)."""
    meta = node.meta.get("val")
    if not isinstance(meta, torch.Tensor):
        return False, False
    return meta.dtype == torch.complex32, meta.device.type == "cpu" and meta.dim() == 0


#: convolution nodes -> the positions of (x, weight, padding, transposed, groups) among their
#: arguments
_CONVOLUTIONS = {
    aten.convolution.default: (0, 1, 4, 6, 8),
    aten.convolution_backward.default: (1, 2, 5, 7, 9),
}


def _is_xla_convolution(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a convolution (or its backward) that stays an XLA convolution on the
    CPU (``lower_nn.xla_convolution_on_cpu``; True where the shapes are unknown)."""
    where = _CONVOLUTIONS.get(node.target) if node.op == "call_function" else None
    if where is None:
        return False
    x, w, padding, transposed, groups = (node.args[i] for i in where)
    x, w = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (x, w))
    if x is None or w is None:
        return True
    return lower_nn.xla_convolution_on_cpu(
        tuple(x.shape), tuple(w.shape), transposed, groups, padding
    )


#: CPU inputs and results of at most this many elements cross packed: one flat buffer per dtype
#: each way instead of one crossing each. A crossing costs 5-10 us inside a step (the NumPy
#: view, the jitted call's argument or result, the torch tensor), a copy of 16 KB about 1 us,
#: and a ResNet program has a hundred such tensors (batch-norm parameters, statistics and
#: their updates).
PACK_MAX_ELEMENTS = 4096
#: ``FUSEDOPS_XLA_PACK=0`` turns packing off (every tensor crosses apart)
PACK_ENV = "FUSEDOPS_XLA_PACK"
#: dtypes that cross packed (NumPy views both ways; bfloat16 and bool cross by DLPack)
_PACK_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.int64, torch.int32})


class _Pack(NamedTuple):
    """Tensors of one dtype crossing as one flat buffer: their positions (among a program's
    inputs or computed results), shapes, and offsets and sizes in the buffer."""

    dtype: torch.dtype
    positions: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


def _packs(nodes: list, exclude=frozenset()) -> tuple[_Pack, ...]:
    """The packs of ``nodes`` (placeholders or computed results): per dtype of
    ``_PACK_DTYPES``, the CPU tensors of static shape with 1 to ``PACK_MAX_ELEMENTS`` elements,
    where a dtype has at least two; positions in ``exclude`` stay apart. Empty where
    ``FUSEDOPS_XLA_PACK=0``."""
    if not switched_on(PACK_ENV):
        return ()
    found: dict[torch.dtype, list[tuple[int, tuple[int, ...], int]]] = {}
    for position, node in enumerate(nodes):
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if position in exclude or not isinstance(meta, torch.Tensor):
            continue
        shape = tuple(meta.shape)
        if not all(type(d) is int for d in shape):
            continue
        size = int(np.prod(shape))
        if (
            meta.device.type == "cpu"
            and meta.dtype in _PACK_DTYPES
            and 0 < size <= PACK_MAX_ELEMENTS
        ):
            found.setdefault(meta.dtype, []).append((position, shape, size))
    packs = []
    for dtype, members in found.items():
        if len(members) < 2:
            continue
        positions, shapes, sizes = map(tuple, zip(*members))
        offsets = tuple(int(o) for o in np.cumsum((0,) + sizes[:-1]))
        packs.append(_Pack(dtype, positions, shapes, offsets, sizes))
    return tuple(packs)


def _unpack(flat, pack: _Pack) -> list:
    """The arrays of ``pack`` cut out of its flat JAX buffer (in the program)."""
    return [
        lax.slice(flat, (offset,), (offset + size,)).reshape(shape)
        for shape, offset, size in zip(pack.shapes, pack.offsets, pack.sizes)
    ]


def _from_base(value, permutation):
    """In the program: an input that crossed as ``input.permute(permutation)`` (None: as it
    is) back in the input's own dim order."""
    return value if permutation is None else jnp.transpose(value, np.argsort(permutation))


def _apart(count: int, packs: tuple[_Pack, ...]) -> tuple[int, ...]:
    """The positions among ``count`` that no pack holds, in order."""
    packed = {p for pack in packs for p in pack.positions}
    return tuple(i for i in range(count) if i not in packed)


def _packed_inputs(args, layout, packs: tuple[_Pack, ...], apart: tuple[int, ...]) -> list:
    """What a packed CPU call hands over: the inputs apart (``layout``: for each of them its
    permutation to a dense base, or None), then each pack's inputs copied into one flat
    tensor."""
    crossing = [args[i].permute(p) if p else args[i] for i, p in zip(apart, layout)]
    with torch.no_grad():
        for pack in packs:
            crossing.append(flatten_dense_tensors([args[i] for i in pack.positions]))
    return crossing


class JaxProgram:
    """A callable running ``gm`` (ATen ops only, static shapes) as one XLA program.

    Called with a list of torch tensors (the graph's placeholders, in order); returns a list of
    torch tensors (the graph's outputs; None stays None). ``compile_s`` holds the first call's
    time (trace + XLA compile + run).
    """

    def __init__(
        self, gm: torch.fx.GraphModule, name: str = "region", *, views_in_torch: bool = True
    ):
        """``views_in_torch``: outputs that are views of inputs are made by torch (see the
        module's docstring); off where the caller writes new values into the inputs after
        the call (``xla_trace``), which would show through such views."""
        cache.configure()
        self.gm, self.name = gm, name
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        output = next(n for n in self.nodes if n.op == "output")
        outs = output.args[0]
        self.single = not isinstance(outs, (tuple, list))
        self.outputs = [outs] if self.single else list(outs)
        self.random_ops = [
            n for n in self.nodes if n.op == "call_function" and n.target in lower.NEEDS_KEY
        ]
        self._xla_convolution = any(map(_is_xla_convolution, self.nodes))
        # unique computed outputs; outputs that are inputs return the input tensor itself, and
        # (views_in_torch) views of inputs are made by torch on it
        self._views: dict[torch.fx.Node, tuple] = {}
        self._computed = []
        for o in self.outputs:
            if not isinstance(o, torch.fx.Node) or o.op == "placeholder" or o in self._computed:
                continue
            found = _view_chain(o) if views_in_torch else None
            if found is not None:
                source, chain = found
                # reshape where the graph says view: the same values, and a copy instead of an
                # error should an input come with other strides than the traced ones
                self._views[o] = (
                    source,
                    [(_RESHAPE.get(v.target, v.target), v.args[1:], v.kwargs) for v in chain],
                )
            else:
                self._computed.append(o)
        # where each output comes from, worked out once: (_CONSTANT, value), (_INPUT, index
        # of the placeholder), (_RESULT, index in _computed) or (_VIEW, (the output node, index
        # of the placeholder viewed, the view chain))
        inputs = {n: i for i, n in enumerate(self.placeholders)}
        results = {n: i for i, n in enumerate(self._computed)}
        self._plan = []
        for o in self.outputs:
            if not isinstance(o, torch.fx.Node):
                self._plan.append((_CONSTANT, o))
            elif o.op == "placeholder":
                self._plan.append((_INPUT, inputs[o]))
            elif o in self._views:
                source, chain = self._views[o]
                self._plan.append((_VIEW, (o, inputs[source], chain)))
            else:
                self._plan.append((_RESULT, results[o]))
        # results needing more than the crossing (``_result_fix``): index -> (complex32, to
        # the CPU when the call ran on an accelerator)
        self._fixes = {i: fix for i, fix in enumerate(map(_result_fix, self._computed)) if any(fix)}
        # small CPU inputs and results crossing packed (``PACK_MAX_ELEMENTS``), and the positions
        # of the others, in the order they cross
        self._in_packs = _packs(self.placeholders)
        self._out_packs = _packs(self._computed, exclude=frozenset(self._fixes))
        self._in_apart = _apart(len(self.placeholders), self._in_packs)
        self._out_apart = _apart(len(self._computed), self._out_packs)
        # tensor constants are kept on the host (device-neutral, exact dtype) and become
        # constants of the traced program, so they live on whichever device runs the call
        self._constants = {}
        self._const_device = None
        for n in self.nodes:
            if n.op == "get_attr":
                value = getattr(gm, n.target)
                if isinstance(value, torch.Tensor):
                    self._const_device = self._const_device or value.device
                    with unset_fake_temporarily():
                        value = bridge.to_numpy(value)
                self._constants[n.target] = value
        #: (JAX device, inputs' layout) -> the jitted function its calls use
        self._functions: dict = {}
        #: str(JAX device) -> {"library": the CPU dot library chosen (``tune``; None off the
        #: CPU), "seconds": each timed candidate's best time (empty when none was timed)}
        self.tuning: dict[str, dict] = {}
        self.compile_s: float | None = None

    def _run(self, seed, *args):
        env: dict[torch.fx.Node, object] = dict(zip(self.placeholders, args))
        random_index = {n: i for i, n in enumerate(self.random_ops)}
        for node in self.nodes:
            if node.op == "get_attr":
                value = self._constants[node.target]
                env[node] = jnp.asarray(value) if isinstance(value, np.ndarray) else value
            elif node.op == "call_function":
                a, kw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
                if node.target is operator.getitem:
                    env[node] = a[0][a[1]]
                    continue
                if node.target in lower.FUNCTIONALIZED:
                    env[node] = lower.call_functionalized(node.target, a, kw)
                    continue
                if node.target is lower.WITH_EFFECTS:  # a skipped check: the token goes on
                    env[node] = (a[0],)
                    continue
                fn = lower.LOWERINGS[node.target]
                if node.target in lower.NEEDS_META:
                    kw = {**kw, "meta": node.meta["val"]}
                if node.target in lower.NEEDS_KEY:
                    kw = {**kw, "key": rng.key_for(seed, random_index[node])}
                env[node] = _fix(fn(*a, **kw), node.meta.get("val"), node)
            elif node.op not in ("placeholder", "output"):
                raise XLATraceError(f"cannot lower FX node {node.op} {node.target}")
        return tuple(env[o] for o in self._computed)

    def __call__(self, args) -> list:
        start = time.perf_counter() if self.compile_s is None else None
        device = bridge.call_device(args, self._const_device)
        on_cpu = device.platform == "cpu"
        seed = rng.next_seed() if self.random_ops else None
        if seed is not None and not on_cpu:
            seed = jax.device_put(seed, device)
        packed = on_cpu and bool(self._in_packs or self._out_packs)
        # permuted inputs (a saved weight.t()) cross as their dense base, transposed back in
        # the program, where XLA folds the transpose into its users: no copy
        if packed:  # the packed inputs are copied: their layout does not matter
            layout = tuple(bridge.contiguous_order(args[i]) for i in self._in_apart)
            crossing = _packed_inputs(args, layout, self._in_packs, self._in_apart)
        else:
            layout = tuple(bridge.contiguous_order(a) for a in args)
            crossing = [a.permute(p) if p else a for a, p in zip(args, layout)]
        key = (device, layout if any(layout) else None, packed)
        # default_device places the uncommitted inputs (NumPy views, seed, constants) and so the
        # whole program on ``device``, not on JAX's default backend
        with jax.enable_x64(True), jax.default_device(device):
            jax_args = (seed, *[bridge.to_jax(a, device) for a in crossing])
            if on_cpu:  # torch's idle OpenMP threads would spin on the cores XLA runs on
                omp.park()
            function = self._functions.get(key)
            if function is None:
                function, results = self._choose(key, on_cpu, jax_args)
            else:
                results = function(*jax_args)
            jax.block_until_ready(results)
        to_torch = bridge.to_torch
        with bridge.quiet_crossings():
            if packed:
                converted = self._unpacked_results(results, on_cpu)
            else:
                converted = [None if r is None else to_torch(r, on_cpu) for r in results]
        for index, (complex32, to_cpu) in self._fixes.items():
            out = converted[index]
            if out is not None and complex32:
                converted[index] = out = out.to(torch.complex32)
            if out is not None and to_cpu and not on_cpu:
                converted[index] = out.cpu()
        outs, views = [], {}  # views: one tensor per view node, however often it is returned
        for kind, where in self._plan:
            if kind is _RESULT:
                outs.append(converted[where])
            elif kind is _INPUT:
                outs.append(args[where])
            elif kind is _VIEW:
                node, source, chain = where
                if node not in views:
                    value = args[source]
                    for op, args_after, kwargs in chain:
                        value = op(value, *args_after, **kwargs)
                    views[node] = value
                outs.append(views[node])
            else:
                outs.append(where)
        if start is not None:
            self.compile_s = time.perf_counter() - start
        return outs

    def _run_permuted(self, layout, seed, *args):
        """``_run`` on inputs that crossed as ``input.permute(p)`` (``layout``: p or None per
        input): each is transposed back first."""
        return self._run(seed, *map(_from_base, args, layout))

    def _run_packed(self, layout, seed, *args):
        """``_run`` for a packed CPU call: ``args`` are the inputs crossing apart (in
        ``_in_apart``'s order, each ``input.permute(p)`` where ``layout`` gives p) and then one
        flat buffer per input pack; returns the results computed apart (``_out_apart``'s
        order), then one flat buffer per result pack."""
        apart = len(self._in_apart)
        inputs = [None] * len(self.placeholders)
        for position, value, p in zip(self._in_apart, args[:apart], layout or (None,) * apart):
            inputs[position] = _from_base(value, p)
        for pack, flat in zip(self._in_packs, args[apart:]):
            for position, value in zip(pack.positions, _unpack(flat, pack)):
                inputs[position] = value
        results = self._run(seed, *inputs)
        flats = tuple(
            jnp.concatenate([results[i].reshape(-1) for i in pack.positions])
            for pack in self._out_packs
        )
        return tuple(results[i] for i in self._out_apart) + flats

    def _unpacked_results(self, results, on_cpu: bool) -> list:
        """The torch tensors of every computed result of a packed call (``_run_packed``'s
        ``results``): the ones apart crossed one by one, each packed one a tensor of its own
        over its part of the flat buffer (no view of another tensor: autograd lets it be
        written in place, as any other result)."""
        converted = [None] * len(self._computed)
        apart = len(self._out_apart)
        for position, result in zip(self._out_apart, results[:apart]):
            converted[position] = None if result is None else bridge.to_torch(result, on_cpu)
        for pack, flat in zip(self._out_packs, results[apart:]):
            host = np.asarray(flat)
            for position, shape, offset, size in zip(
                pack.positions, pack.shapes, pack.offsets, pack.sizes
            ):
                converted[position] = torch.from_numpy(host[offset : offset + size].reshape(shape))
        return converted

    def _choose(self, key, on_cpu: bool, jax_args) -> tuple:
        """The jitted function for ``key`` (the device and the inputs' layout; on the CPU the
        fastest ``tune`` candidate) and the results of running it on ``jax_args`` (called
        inside ``__call__``'s x64 and device contexts)."""
        device, layout, packed = key
        if packed:
            run = functools.partial(self._run_packed, layout)
        elif layout is None:
            run = self._run
        else:
            run = functools.partial(self._run_permuted, layout)
        if on_cpu and tune.enabled():
            candidates = {
                name: jax.jit(run, compiler_options=options or None)
                for name, options in tune.candidates(self._xla_convolution).items()
            }
            name, function, results, seconds = tune.fastest(candidates, jax_args)
        else:  # XLA's defaults (no dot library to choose off the CPU)
            name = tune.DEFAULT if on_cpu else None
            function, seconds = jax.jit(run), {}
            results = function(*jax_args)
        self._functions[key] = function
        self.tuning[str(device)] = {"library": name, "seconds": seconds}
        return function, results


def unsupported_ops(gm: torch.fx.GraphModule) -> list[str]:
    """Names of the ATen ops in ``gm`` with no lowering (sorted, unique)."""
    return lower.op_names(
        lower.node_target(n)
        for n in gm.graph.nodes
        if n.op == "call_function" and not lower.node_supported(n)
    )

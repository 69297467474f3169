"""One ATen FX graph -> one jitted XLA program, called with torch tensors.

``JaxProgram(gm)`` interprets the graph with the lowering table (``lower.LOWERINGS``) inside
``jax.jit``; shapes are static, so each program compiles once on its first call. Every node's
result is checked against the FX node's FakeTensor (shape) and cast to its dtype, so torch's
type promotion holds. Calls run with 64-bit types enabled, so int64/float64 stay exact.

Each call runs on the JAX device of its torch tensors (``bridge.call_device``: the CPU for CPU
tensors whatever JAX's default backend is, the matching GPU for ``cuda:i``), with its seed and
baked-in constants there too; the program compiles once per device. On the CPU its first call
compiles it once per dot library and keeps the fastest (``tune``). Results are ready
(``block_until_ready``) and on the inputs' device when they return to torch.
"""

from __future__ import annotations

import operator
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fusedops.xla import bridge, cache, lower, rng, tune
from fusedops.xla.errors import XLATraceError


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


class JaxProgram:
    """A callable running ``gm`` (ATen ops only, static shapes) as one XLA program.

    Called with a list of torch tensors (the graph's placeholders, in order); returns a list of
    torch tensors (the graph's outputs; None stays None). ``compile_s`` holds the first call's
    time (trace + XLA compile + run).
    """

    def __init__(self, gm: torch.fx.GraphModule, name: str = "region"):
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
        # unique computed outputs; outputs that are inputs return the input tensor itself
        self._computed = []
        for o in self.outputs:
            if isinstance(o, torch.fx.Node) and o.op != "placeholder" and o not in self._computed:
                self._computed.append(o)
        self._returns_inputs = any(
            isinstance(o, torch.fx.Node) and o.op == "placeholder" for o in self.outputs
        )
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
        self._functions: dict = {}  # JAX device -> the jitted function its calls use
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
        # default_device places the uncommitted inputs (NumPy views, seed, constants) and so the
        # whole program on ``device``, not on JAX's default backend
        with jax.enable_x64(True), jax.default_device(device):
            jax_args = (seed, *[bridge.to_jax(a, device) for a in args])
            function = self._functions.get(device)
            if function is None:
                function, results = self._choose(device, on_cpu, jax_args)
            else:
                results = function(*jax_args)
            jax.block_until_ready(results)
        with bridge.quiet_crossings():
            converted = {
                node: (None if r is None else self._to_torch(r, node, on_cpu))
                for node, r in zip(self._computed, results)
            }
        inputs = dict(zip(self.placeholders, args)) if self._returns_inputs else {}
        outs = []
        for o in self.outputs:
            if isinstance(o, torch.fx.Node):
                outs.append(inputs[o] if o.op == "placeholder" else converted[o])
            else:
                outs.append(o)
        if start is not None:
            self.compile_s = time.perf_counter() - start
        return outs

    def _choose(self, device, on_cpu: bool, jax_args) -> tuple:
        """The jitted function for ``device`` (on the CPU the fastest ``tune`` candidate) and
        the results of running it on ``jax_args`` (called inside ``__call__``'s x64 and device
        contexts)."""
        if on_cpu and tune.enabled():
            candidates = {
                name: jax.jit(self._run, compiler_options=options or None)
                for name, options in tune.CANDIDATES.items()
            }
            name, function, results, seconds = tune.fastest(candidates, jax_args)
        else:  # XLA's defaults (no dot library to choose off the CPU)
            name = tune.DEFAULT if on_cpu else None
            function, seconds = jax.jit(self._run), {}
            results = function(*jax_args)
        self._functions[device] = function
        self.tuning[str(device)] = {"library": name, "seconds": seconds}
        return function, results

    @staticmethod
    def _to_torch(array, node, on_cpu: bool) -> torch.Tensor:
        out = bridge.to_torch(array)
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor) and meta.dtype == torch.complex32:
            out = out.to(torch.complex32)
        # a CPU scalar of a CUDA program (e.g. an optimizer's step count) goes back to the CPU
        cpu_meta = isinstance(meta, torch.Tensor) and meta.device.type == "cpu"
        if cpu_meta and meta.dim() == 0 and not on_cpu:
            out = out.cpu()
        return out


def unsupported_ops(gm: torch.fx.GraphModule) -> list[str]:
    """Names of the ATen ops in ``gm`` with no lowering (sorted, unique)."""
    return lower.op_names(
        lower.node_target(n)
        for n in gm.graph.nodes
        if n.op == "call_function" and not lower.node_supported(n)
    )

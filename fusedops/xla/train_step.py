"""``xla_trace``: a whole training step (forward, backward, optimizer update) as one XLA program.

The step function is traced once per input signature with ``make_fx`` (fake tensors, core ATen,
functionalized). During the trace the modules' parameters and buffers are graph inputs,
``loss.backward()`` becomes ``torch.autograd.grad`` on them, ``opt.step()`` becomes
``optim_math.update`` (torch.optim's math), ``opt.zero_grad()`` clears the traced gradients and
``torch.nn.utils.clip_grad_norm_`` clips them.
A step with collectives (a DDP model, ``torch.distributed.all_reduce``) is split into XLA
programs at each of them (``collectives``); a GradScaler's scale and growth tracker are inputs
written back like buffers.
Each call runs the program and writes new parameters, buffers and optimizer state back in place,
in torch.optim's state layout, so ``state_dict()`` and LR schedulers keep working; each param
group's ``lr`` is an input, so changing it never recompiles.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.utils._pytree as pytree

from fusedops.xla import collectives, optim_math
from fusedops.xla.errors import UnsupportedOpsError, XLATraceError

aten = torch.ops.aten


@dataclass
class _Recorder:
    """What the traced step did to gradients and parameters."""

    params: list  # current (traced) value of each parameter
    leaves: list = field(default_factory=list)  # the stand-ins the step sees (and their .grad)
    grads: dict = field(default_factory=dict)  # parameter index -> traced gradient
    states: dict = field(default_factory=dict)  # (opt index, param index) -> {name: traced}
    stepped: bool = False
    ddp_forward_sync: dict = field(default_factory=dict)  # DDP module index -> flag after the step


@dataclass
class _Signature:
    """Everything about one call that the compiled program depends on."""

    params: list
    buffers: list
    buffer_names: list
    opt_slots: list  # (opt index, group index, param index, state names)
    groups: list  # (opt index, group index)
    module_params: list  # per module: [(name, param index)]
    grad_inputs: list  # parameter indices whose .grad enters the step
    scalers: list = field(default_factory=list)  # enabled torch.amp.GradScalers passed in


def _unique(items):
    seen, out = set(), []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out


@functools.cache
def _decompositions() -> dict:
    """The partial_trace table plus batch-norm ops that write running stats in place (so that
    functionalization sees those writes)."""
    from torch._decomp import get_decompositions

    from fusedops.xla.backend import decompositions

    extra = get_decompositions(
        [aten.native_batch_norm, aten._native_batch_norm_legit, aten.native_batch_norm_backward]
    )
    return {**decompositions(), **extra}


class _Compiled:
    def __init__(self, program, layout, constants, out_spec, const_leaves):
        self.program, self.layout = program, layout
        self.constants, self.out_spec, self.const_leaves = constants, out_spec, const_leaves


class XlaTrainStep:
    """A training step function compiled to one XLA program per input signature.

    Call it as the function itself. ``programs`` counts the steps compiled so far (one per
    input signature).
    """

    def __init__(self, fn, *, capture_as_const: bool = False):
        functools.update_wrapper(self, fn)
        self.fn, self.capture_as_const = fn, capture_as_const
        self._compiled: dict = {}
        self.programs = 0

    # ------------------------------------------------------------------------------ signature
    def _collect(self, leaves):
        modules = _unique(x for x in leaves if isinstance(x, torch.nn.Module))
        opts = _unique(x for x in leaves if isinstance(x, torch.optim.Optimizer))
        params, module_params = [], []
        for m in modules:
            entries = []
            for name, p in m.named_parameters(remove_duplicate=False):
                if not any(p is q for q in params):
                    params.append(p)
                entries.append((name, next(i for i, q in enumerate(params) if q is p)))
            module_params.append(entries)
        buffers, buffer_names = [], []
        for mi, m in enumerate(modules):
            for name, b in m.named_buffers(remove_duplicate=False):
                if not any(b is q for q in buffers):
                    buffers.append(b)
                buffer_names.append((mi, name, next(i for i, q in enumerate(buffers) if q is b)))
        index = {id(p): i for i, p in enumerate(params)}
        slots, groups = [], []
        for oi, opt in enumerate(opts):
            name = optim_math.kind(opt)
            for gi, group in enumerate(opt.param_groups):
                groups.append((oi, gi))
                for p in group["params"]:
                    if id(p) not in index:
                        raise XLATraceError(
                            "xla_trace: an optimizer parameter belongs to no nn.Module passed "
                            "to the step; pass the module (e.g. net=model) as an argument"
                        )
                    if not p.requires_grad:
                        continue
                    stateless = optim_math.stateless(name, group, p)  # keeps none
                    state = {} if stateless else opt.state[p]
                    optim_math.init_state(name, group, p, state, opt)
                    slots.append((oi, gi, index[id(p)], optim_math.state_names(name, group, state)))
        grad_inputs = [i for i, p in enumerate(params) if p.grad is not None]
        sig = _Signature(params, buffers, buffer_names, slots, groups, module_params, grad_inputs)
        sig.scalers = _unique(
            x for x in leaves if isinstance(x, torch.amp.GradScaler) and x.is_enabled()
        )
        for scaler in sig.scalers:
            if scaler._scale is None:  # what its first scale() does
                scaler._lazy_init_scale_growth_tracker(params[0].device if params else "cpu")
        return modules, opts, sig

    def _key(self, leaves, modules, opts, sig):
        def leaf_key(x):
            if isinstance(x, torch.Tensor):
                return ("T", tuple(x.shape), x.dtype, x.requires_grad)
            if isinstance(x, (torch.nn.Module, torch.optim.Optimizer)):
                return ("O", id(x))
            try:
                hash(x)
                return ("V", x)
            except TypeError:
                return ("I", id(x))

        opt_key = []
        for opt in opts:
            name = optim_math.kind(opt)
            for g in opt.param_groups:
                opt_key.append((name, tuple((k, g.get(k)) for k in optim_math.STATIC_KEYS[name])))
            if name in optim_math.FUSED:  # clipping changes the program
                opt_key.append(
                    tuple(getattr(opt, k, None) for k in optim_math.FUSED_STATIC_ATTRIBUTES)
                )
        return (
            tuple(leaf_key(x) for x in leaves),
            tuple(m.training for m in modules for m in m.modules()),
            tuple((tuple(p.shape), p.dtype, p.requires_grad) for p in sig.params),
            tuple((tuple(b.shape), b.dtype) for b in sig.buffers),
            tuple(opt_key),
            tuple((s[2], s[3]) for s in sig.opt_slots),
            tuple(sig.grad_inputs),
            collectives.ddp_key(modules),
            tuple(
                (s._growth_factor, s._backoff_factor, s._growth_interval, s._scale.device)
                for s in sig.scalers
            ),
        )

    # ---------------------------------------------------------------------------------- call
    def __call__(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        modules, opts, sig = self._collect(leaves)
        key = self._key(leaves, modules, opts, sig)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._trace(leaves, spec, modules, opts, sig)
            self._compiled[key] = compiled
            self.programs += 1
            from fusedops.xla.backend import recompile_limit

            if self.programs == recompile_limit() + 1:
                warnings.warn(
                    f"xla_trace: {self.programs} XLA programs compiled for "
                    f"{getattr(self.fn, '__name__', 'the step')} (limit {recompile_limit()}); "
                    "each new input shape, dtype or mode recompiles",
                    stacklevel=2,
                )
        return self._run(compiled, leaves, modules, opts, sig)

    def _inputs(self, leaves, opts, sig, constants):
        states = [
            opts[oi].state[sig.params[pi]][n] for oi, _, pi, names in sig.opt_slots for n in names
        ]
        lrs = [
            torch.as_tensor(opts[oi].param_groups[gi]["lr"], dtype=torch.float64).detach()
            for oi, gi in sig.groups
        ]
        grads = [sig.params[i].grad for i in sig.grad_inputs]
        scalers = [t for s in sig.scalers for t in (s._scale, s._growth_tracker)]
        user = [x for x in leaves if isinstance(x, torch.Tensor)]
        return [*sig.params, *sig.buffers, *states, *lrs, *grads, *scalers, *user, *constants]

    def _run(self, compiled, leaves, modules, opts, sig):
        inputs = self._inputs(leaves, opts, sig, compiled.constants)
        outs = compiled.program(inputs)
        layout = compiled.layout
        user = outs[: layout["user"]]
        pos = layout["user"]
        with torch.no_grad():
            for i in layout["new_params"]:
                sig.params[i].copy_(outs[pos])
                pos += 1
            for oi, _, pi, _names in sig.opt_slots:
                written = layout["state_names"][(oi, pi)]
                state = opts[oi].state[sig.params[pi]] if written else {}
                for n in written:
                    if n in state and state[n].shape == outs[pos].shape:
                        state[n].copy_(outs[pos])
                    else:
                        state[n] = outs[pos].clone()
                    pos += 1
            grads_mode = layout["grads"]
            for i, p in enumerate(sig.params):
                if grads_mode == "none":
                    p.grad = None
                elif i in layout["grad_params"]:
                    p.grad = outs[pos].clone()
                    pos += 1
                else:
                    p.grad = None
            for index in layout["mutated"]:
                inputs[index].copy_(outs[pos])
                pos += 1
        for mi, value in layout["ddp_forward_sync"].items():  # as DDP's forwards leave it
            modules[mi].require_forward_param_sync = value
        if layout["stepped"]:
            for opt in opts:
                opt._opt_called = True  # what an LR scheduler's wrapper of opt.step records
        leaves_out = list(compiled.const_leaves)
        it = iter(user)
        leaves_out = [next(it) if x is _TENSOR else x for x in leaves_out]
        return pytree.tree_unflatten(leaves_out, compiled.out_spec)

    # --------------------------------------------------------------------------------- trace
    def _trace(self, leaves, spec, modules, opts, sig):
        from torch._subclasses.fake_tensor import DataDependentOutputException
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.nn.utils.stateless import _reparametrize_module

        from fusedops.xla import lower
        from fusedops.xla.backend import data_dependent_ops
        from fusedops.xla.program import JaxProgram, unsupported_ops

        n_params, n_buffers = len(sig.params), len(sig.buffers)
        n_states = sum(len(s[3]) for s in sig.opt_slots)
        n_lrs, n_grads = len(sig.groups), len(sig.grad_inputs)
        n_scalers = 2 * len(sig.scalers)
        tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        layout: dict = {}
        out_info: dict = {}

        def step(*flat):
            params = list(flat[:n_params])
            buffers = flat[n_params : n_params + n_buffers]
            pos = n_params + n_buffers
            state_vals = flat[pos : pos + n_states]
            pos += n_states
            lrs = flat[pos : pos + n_lrs]
            pos += n_lrs
            grads_in = flat[pos : pos + n_grads]
            pos += n_grads
            scaler_vals = flat[pos : pos + n_scalers]
            user = flat[pos + n_scalers :]
            rec = _Recorder(params=list(params), leaves=list(params))
            rec.grads = dict(zip(sig.grad_inputs, grads_in))
            _push_grads(rec)
            it = iter(state_vals)
            for oi, _, pi, names in sig.opt_slots:
                rec.states[(oi, pi)] = {n: next(it) for n in names}
            call_leaves = list(leaves)
            for i, v in zip(tensor_pos, user):
                call_leaves[i] = v
            call_args, call_kwargs = pytree.tree_unflatten(call_leaves, spec)
            with contextlib.ExitStack() as stack:
                for mi, m in enumerate(modules):
                    mapping = {name: params[i] for name, i in sig.module_params[mi]}
                    mapping.update(
                        {name: buffers[bi] for (mj, name, bi) in sig.buffer_names if mj == mi}
                    )
                    stack.enter_context(_reparametrize_module(m, mapping, strict=False))
                stack.enter_context(_intercept(rec, modules, opts, sig, lrs, scaler_vals))
                stack.enter_context(torch.enable_grad())
                result = self.fn(*call_args, **call_kwargs)
                _pull_grads(rec)
            res_leaves, out_spec = pytree.tree_flatten(result)
            out_info["spec"] = out_spec
            out_info["leaves"] = [_TENSOR if isinstance(x, torch.Tensor) else x for x in res_leaves]
            user_out = [x.detach() for x in res_leaves if isinstance(x, torch.Tensor)]
            changed = [i for i, p in enumerate(rec.params) if p is not params[i]]
            layout["user"] = len(user_out)
            layout["stepped"] = rec.stepped
            layout["ddp_forward_sync"] = rec.ddp_forward_sync
            layout["new_params"] = changed
            layout["state_names"] = {}
            new_states = []
            for oi, _, pi, _names in sig.opt_slots:
                st = rec.states[(oi, pi)]
                layout["state_names"][(oi, pi)] = tuple(st)
                new_states.extend(st[n] for n in st)
            grad_params = sorted(i for i, g in rec.grads.items() if g is not None)
            layout["grads"] = "none" if not rec.grads else "some"
            layout["grad_params"] = set(grad_params)
            return [
                *user_out,
                *[rec.params[i].detach() for i in changed],
                *[s.detach() for s in new_states],
                *[rec.grads[i].detach() for i in grad_params],
            ]

        example = [p.detach().requires_grad_(p.requires_grad) for p in sig.params] + self._inputs(
            leaves, opts, sig, []
        )[n_params:]
        try:
            # 1) autograd traced through (backward ops explicit); 2) functionalized, so in-place
            # writes (BatchNorm running stats, relu_) become values and copy_ into inputs
            joint = make_fx(
                step,
                tracing_mode="fake",
                decomposition_table=_decompositions(),
                _allow_non_fake_inputs=True,
            )(*example)
            dynamic = data_dependent_ops(joint)
            if dynamic:
                raise XLATraceError(
                    "xla_trace cannot capture a Python side effect that reads tensor values "
                    "(.item(), float(t), .tolist(), print(t)) nor data-dependent shapes: "
                    f"{', '.join(dynamic)}"
                )
            plain = [x.detach() for x in example]
            gm = make_fx(
                torch.func.functionalize(joint, remove="mutations_and_views"),
                tracing_mode="fake",
                decomposition_table=_decompositions(),
                _allow_non_fake_inputs=True,
            )(*plain)
        except XLATraceError:
            raise
        except DataDependentOutputException as error:
            raise XLATraceError(
                "xla_trace cannot capture a Python side effect that reads tensor values "
                f"(e.g. .item(), float(t), print(t), data-dependent shapes): {error}"
            ) from error
        except Exception as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            if "data-dependent" in message or "item" in message or "nonzero" in message:
                raise XLATraceError(
                    "xla_trace cannot capture a Python side effect that reads tensor values "
                    f"(e.g. .item(), float(t), print(t), data-dependent shapes): {message}"
                ) from error
            raise
        constants = self._lift(gm)
        layout["mutated"] = _lift_input_mutations(gm, len(example) + len(constants))
        missing = unsupported_ops(gm)
        collective_names = lower.op_names(collectives.OPS)
        if set(missing) - set(collective_names):
            raise UnsupportedOpsError(missing, where="xla_trace")
        if missing:  # XLA programs between the collectives, which torch.distributed runs
            from fusedops.xla.backend import split_programs

            split = split_programs(
                gm, lambda sub, name: JaxProgram(sub, f"train_step:{name}", views_in_torch=False)
            )
            program = _SplitProgram(split)
        else:
            program = JaxProgram(gm, "train_step", views_in_torch=False)
        return _Compiled(program, layout, constants, out_info["spec"], out_info["leaves"])

    def _lift(self, gm: torch.fx.GraphModule) -> list:
        """Tensor constants the trace captured (tensors the step closes over): kept baked in
        with capture_as_const, else turned into inputs read at each call."""
        constants = []
        if self.capture_as_const:
            return constants
        last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
        for node in list(gm.graph.nodes):
            if node.op != "get_attr":
                continue
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                continue
            with gm.graph.inserting_after(last):
                ph = gm.graph.placeholder(f"const_{len(constants)}")
            ph.meta = dict(node.meta)
            node.replace_all_uses_with(ph)
            gm.graph.erase_node(node)
            last = ph
            constants.append(value)
        gm.recompile()
        return constants


_TENSOR = object()


class _SplitProgram:
    """A step graph split at its collectives: called as a ``JaxProgram`` (a list of input
    tensors -> a list of output tensors)."""

    def __init__(self, split: torch.fx.GraphModule):
        self.split = split

    def __call__(self, inputs: list) -> list:
        return list(self.split(*inputs))


def _push_grads(rec: _Recorder) -> None:
    """Show the traced gradients as the ``.grad`` of the parameters the step sees."""
    for i, leaf in enumerate(rec.leaves):
        leaf.grad = rec.grads.get(i)


def _pull_grads(rec: _Recorder) -> None:
    """Take back the ``.grad`` of the parameters the step sees, which it may have changed in
    place (``dist.all_reduce(p.grad)``, ``p.grad /= n``) or set (``p.grad = ...``)."""
    for i, leaf in enumerate(rec.leaves):
        if leaf.grad is None:
            rec.grads.pop(i, None)
        else:
            rec.grads[i] = leaf.grad


def _syncing(rec: _Recorder, fn):
    """``fn`` run on the gradients the step last saw, showing it the ones it leaves."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        _pull_grads(rec)
        try:
            return fn(*args, **kwargs)
        finally:
            _push_grads(rec)

    return run


def _lift_input_mutations(gm: torch.fx.GraphModule, n_inputs: int) -> list[int]:
    """Turn ``copy_(input, value)`` nodes (functionalized in-place writes to inputs, e.g.
    BatchNorm running stats) into extra outputs; return the inputs' positions, in order."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    mutated, values = [], []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default:
            dst = node.args[0]
            if dst.op == "get_attr":
                raise XLATraceError(
                    f"xla_trace: the step writes in place to a tensor it closes over "
                    f"({dst.target}); pass that tensor as an argument instead"
                )
            if dst.op != "placeholder":
                raise XLATraceError("xla_trace: unsupported in-place write in the step")
            mutated.append(placeholders.index(dst))
            values.append(node.args[1])
            node.replace_all_uses_with(dst)
            gm.graph.erase_node(node)
    outs = list(output.args[0])
    output.args = (outs + values,)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return mutated


@contextlib.contextmanager
def _intercept(rec: _Recorder, modules, opts, sig, lrs, scaler_vals):
    """Patch Tensor.backward, opt.step, zero_grad and the GradScalers' methods to act on
    ``rec`` during the trace (``scaler_vals``: each scaler's traced scale and growth tracker)."""
    original_backward = torch.Tensor.backward
    syncing = []  # DDP modules whose forward ran since the last backward, wanting it synced
    index = {id(p): i for i, p in enumerate(sig.params)}
    traced = {id(p): i for i, p in enumerate(rec.params)}

    def backward(loss, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if inputs is not None or create_graph:
            raise XLATraceError("xla_trace: backward(inputs=..., create_graph=True) is unsupported")
        wanted = [i for i, p in enumerate(rec.params) if sig.params[i].requires_grad]
        grads = torch.autograd.grad(
            loss,
            [rec.params[i] for i in wanted],
            grad_outputs=gradient,
            retain_graph=retain_graph,
            allow_unused=True,
        )
        for i, g in zip(wanted, grads):
            if g is None:
                continue
            rec.grads[i] = g if rec.grads.get(i) is None else rec.grads[i] + g
        for ddp in _unique(syncing):  # what DDP's hooks would all-reduce during this backward
            positions = list(dict.fromkeys(i for _, i in sig.module_params[modules.index(ddp)]))
            averaged = collectives.ddp_average(ddp, [rec.grads.get(i) for i in positions])
            rec.grads.update((i, g) for i, g in zip(positions, averaged) if g is not None)
        syncing.clear()

    def make_step(oi, opt):
        name = optim_math.kind(opt)

        def step(closure=None):
            if closure is not None:
                raise XLATraceError("xla_trace: optimizer.step(closure) is unsupported")
            lr_index = {g: k for k, g in enumerate(sig.groups)}
            stepped = [
                index[id(p)]
                for group in opt.param_groups
                for p in group["params"]
                if p.requires_grad and rec.grads.get(index[id(p)]) is not None
            ]
            norm, clip_coef = optim_math.clip_step(opt, [rec.grads[pi].detach() for pi in stepped])
            for gi, group in enumerate(opt.param_groups):
                lr = lrs[lr_index[(oi, gi)]]
                for p in group["params"]:
                    pi = index[id(p)]
                    grad = rec.grads.get(pi)
                    if grad is None or not p.requires_grad:
                        continue
                    state = rec.states[(oi, pi)]
                    new_p, new_state = optim_math.update(
                        name, rec.params[pi].detach(), grad.detach(), state, group, lr, clip_coef
                    )
                    rec.params[pi] = new_p
                    rec.states[(oi, pi)] = {**state, **new_state}
            rec.stepped = True
            return norm  # a fused optimizer's total gradient norm when it clips, as in eager

        return step

    steppers = {oi: make_step(oi, opt) for oi, opt in enumerate(opts)}

    def opt_index(optimizer) -> int:
        for oi, opt in enumerate(opts):
            if opt is optimizer:
                return oi
        raise XLATraceError(
            "xla_trace: the GradScaler steps an optimizer not passed to the step; pass it as an "
            "argument"
        )

    def make_scaler(scaler, scale, tracker):
        """GradScaler's scale / unscale_ / step / update on the traced scale and tracker, as
        torch's (its CPU kernels' math): a step with an inf/NaN gradient keeps the old
        parameters and optimizer state (a select instead of torch's skip)."""
        found = {}  # optimizer index -> traced found_inf (0 or 1)

        def scale_(outputs):
            if not isinstance(outputs, torch.Tensor):
                raise XLATraceError("xla_trace: GradScaler.scale() of non-tensors is unsupported")
            return outputs * scale.to(outputs.device)

        def unscale_(optimizer):
            oi = opt_index(optimizer)
            if oi in found:
                raise XLATraceError(
                    "xla_trace: unscale_() has already been called on this optimizer since the "
                    "last update()"
                )
            # g / scale where torch multiplies by 1/scale: the same for the power-of-two
            # scales GradScaler keeps, and XLA:CPU flushes 1/scale to zero once it is
            # subnormal (scales above 2**126)
            flag = torch.zeros((), dtype=torch.float32, device=scale.device)
            for group in optimizer.param_groups:
                for p in group["params"]:
                    pi = index[id(p)]
                    g = rec.grads.get(pi)
                    if g is None:
                        continue
                    bad = torch.logical_not(torch.isfinite(g)).any().to(flag.dtype)
                    flag = torch.maximum(flag, bad.to(flag.device))
                    rec.grads[pi] = g / scale.to(g.device)
            found[oi] = flag

        def step(optimizer, *args, **kwargs):
            oi = opt_index(optimizer)
            if oi not in found:
                unscale_(optimizer)
            skip = found[oi] > 0
            slots = [(o, pi) for o, _, pi, _ in sig.opt_slots if o == oi]
            old_params = {pi: rec.params[pi] for _, pi in slots}
            old_states = {k: dict(rec.states[k]) for k in slots}
            result = steppers[oi](*args, **kwargs)
            for key in slots:
                pi = key[1]
                if rec.params[pi] is not old_params[pi]:
                    keep = old_params[pi].detach()
                    rec.params[pi] = torch.where(skip.to(keep.device), keep, rec.params[pi])
                rec.states[key] = {
                    n: v
                    if old_states[key].get(n) is None
                    else torch.where(skip.to(v.device), old_states[key][n], v)
                    for n, v in rec.states[key].items()
                }
            return result

        def update(new_scale=None):
            if new_scale is not None:
                raise XLATraceError("xla_trace: GradScaler.update(new_scale) is unsupported")
            if not found:
                raise XLATraceError("xla_trace: no inf checks were recorded prior to update()")
            inf = torch.stack(list(found.values())).sum() > 0
            grown = tracker + 1
            grow = grown == scaler._growth_interval
            larger = scale * scaler._growth_factor
            bigger = torch.where(grow & torch.isfinite(larger), larger, scale)
            scale.copy_(torch.where(inf, scale * scaler._backoff_factor, bigger))
            tracker.copy_(torch.where(inf | grow, torch.zeros_like(grown), grown))
            found.clear()

        return {"scale": scale_, "unscale_": unscale_, "step": step, "update": update}

    def zero_grad(set_to_none: bool = True):
        if set_to_none:
            rec.grads.clear()
        else:
            for i in list(rec.grads):
                rec.grads[i] = torch.zeros_like(rec.grads[i])

    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, **_):
        """torch.nn.utils.clip_grad_norm_ on the traced gradients (same math as torch)."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        # inside the step, module.parameters() yields the traced stand-ins of the parameters
        chosen = [index.get(id(p), traced.get(id(p))) for p in parameters]
        chosen = [i for i in chosen if i is not None]
        chosen = [i for i in chosen if rec.grads.get(i) is not None]
        if not chosen:
            return torch.tensor(0.0)
        norms = [torch.linalg.vector_norm(rec.grads[i], norm_type) for i in chosen]
        total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for i in chosen:
            rec.grads[i] = rec.grads[i] * coef
        return total

    patched = []  # (object, attribute, previous instance attribute or _MISSING)
    original_clip = torch.nn.utils.clip_grad_norm_
    try:
        torch.nn.utils.clip_grad_norm_ = _syncing(rec, clip_grad_norm_)
        torch.Tensor.backward = _syncing(rec, backward)
        for oi, opt in enumerate(opts):
            for attr, value in (("step", steppers[oi]), ("zero_grad", zero_grad)):
                patched.append((opt, attr, opt.__dict__.get(attr, _MISSING)))
                setattr(opt, attr, _syncing(rec, value))
        for m in modules:
            patched.append((m, "zero_grad", m.__dict__.get("zero_grad", _MISSING)))
            m.zero_grad = _syncing(rec, zero_grad)
        for si, scaler in enumerate(sig.scalers):
            methods = make_scaler(scaler, scaler_vals[2 * si], scaler_vals[2 * si + 1])
            for attr, value in methods.items():
                patched.append((scaler, attr, scaler.__dict__.get(attr, _MISSING)))
                setattr(scaler, attr, _syncing(rec, value))
        with collectives.traced_distributed(syncing.append) as forward_sync:
            yield
            rec.ddp_forward_sync = {modules.index(m): v for m, v in forward_sync.items()}
    finally:
        torch.Tensor.backward = original_backward
        torch.nn.utils.clip_grad_norm_ = original_clip
        for obj, attr, previous in reversed(patched):
            if previous is _MISSING:
                obj.__dict__.pop(attr, None)
            else:  # e.g. an LR scheduler's wrapper around opt.step
                obj.__dict__[attr] = previous


_MISSING = object()


def xla_trace(step_fn=None, *, capture_as_const: bool = False):
    """Compile a whole training step into one XLA program.

    ``step_fn(*args, **kwargs)`` is written as in eager (forward, ``loss.backward()``,
    ``opt.step()``, ``opt.zero_grad()``) with its ``nn.Module``s and optimizers (torch.optim's
    SGD, Adam, AdamW; fusedops.optim.FusedAdam, FusedAdamW, FusedSGD) passed as arguments. Tensor
    arguments may have any shape/dtype; each new signature compiles a new program. Returns
    what ``step_fn`` returns. Parameters, buffers, gradients and optimizer state are updated in
    place as eager would. ``capture_as_const=True``
    bakes closed-over tensors in as constants (else they are read each call).
    Usable as ``@xla_trace`` or ``@xla_trace(capture_as_const=True)``.

    ``xla_trace(step_fn)`` is an ``XlaTrainStep``, called as ``step_fn``; its ``programs``
    attribute counts the steps compiled so far, one per input signature (``step.programs``;
    partial_trace's count is ``.stats.programs``).

    A ``torch.amp.GradScaler`` passed as an argument (``scaler.scale(loss).backward()``,
    ``scaler.unscale_(opt)``, ``scaler.step(opt)``, ``scaler.update()``) runs inside the
    program: a step with inf/NaN gradients keeps the old parameters and state. The step may
    read and change ``p.grad``. Data-parallel (``fusedops.xla.collectives``): a
    ``DistributedDataParallel`` model averages its gradients in ``backward()`` as DDP does, and
    ``torch.distributed.all_reduce`` calls in the step run through torch.distributed between
    the XLA programs the step is split into at each collective.
    """
    if step_fn is None:
        return functools.partial(xla_trace, capture_as_const=capture_as_const)
    return XlaTrainStep(step_fn, capture_as_const=capture_as_const)

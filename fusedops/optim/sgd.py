"""FusedSGD: torch.optim.SGD updated by one multi-tensor kernel launch per (device, dtype) group.

Same constructor and state_dict layout as torch.optim.SGD (``momentum_buffer``, absent until a
param's first momentum step), so checkpoints move freely between torch's optimizer and this one,
plus:

- ``master_weights=True``: fp16/bf16 params get an fp32 copy (state ``master_param``) that the
  update is computed on, and an fp32 momentum buffer; the params receive the result rounded.
- ``backend=``: force "cuda" | "triton" | "native" | "reference" (default: the dispatch rule,
  which also honours ``fusedops.use_backend`` and ``FUSEDOPS_BACKEND``).

``lr`` may be a tensor (read on the device): a step never synchronises with the host while its
params, gradients and scaler share a device. Under ``torch.amp.GradScaler``
(``_step_supports_amp_scaling``) the scaler hands over ``grad_scale`` and ``found_inf``: the
kernel unscales the gradients and, when ``found_inf`` is set, skips the update on the device.
``foreach`` and ``fused`` are accepted for compatibility and ignored.

torch starts a momentum buffer as a copy of the first step's gradient. FusedSGD starts it as
zeros, which the general rule turns into the gradient exactly when ``dampening`` is 0; with
dampening the first step carries a flag on the device (``firsts`` of ``fusedops.ops.sgd``).
Under a GradScaler a first step may be skipped without the host knowing: the buffer then stays
zeros and its flag (the scaler's ``found_inf``) stays set until a step goes through, and
``state_dict()`` leaves such a buffer out, as torch, which never started it (reading the flags:
one host synchronisation, only while a flag is pending).

Parameters with a sparse gradient are updated by torch's own sparse path (the functional
``torch.optim.sgd.sgd``, single-tensor); under a GradScaler that path reads ``found_inf`` on
the host (one synchronisation in the steps that have sparse gradients), as torch's GradScaler
does for optimizers without amp support, and unscales the sparse gradients first.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain
from typing import Any

import torch

from fusedops.ops._eager import PLAIN_TENSOR_TYPES
from fusedops.ops._transfer import to_host
from fusedops.ops.sgd import sgd_step
from fusedops.optim.adam import (
    _LOW_PRECISION,
    _MASTER,
    _dense_like,
    _local,
    _StepScalars,
    _unpatched,
)

_BUFFER = "momentum_buffer"


def _state_tensors(state: dict) -> tuple:
    """The state's momentum buffer and master copy (None where absent)."""
    return state.get(_BUFFER), state.get(_MASTER)


def _same_state(known: tuple) -> bool:
    """Whether a state the last step checked (``known``: state, buffer, master, options) still
    holds the same buffer and master tensors."""
    state = known[0]
    return state is None or (state.get(_BUFFER) is known[1] and state.get(_MASTER) is known[2])


_SGD = _unpatched(torch.optim.SGD)


class FusedSGD(_SGD):
    """torch.optim.SGD computed by fusedops' multi-tensor kernels (see the module docstring).

    params: iterable of tensors or param-group dicts; fp32/fp16/bf16 (also fp64 and complex on
    the native and reference backends). Other arguments as torch.optim.SGD (``foreach``/
    ``fused`` accepted and ignored), plus ``master_weights`` (fp32 master copies for fp16/bf16
    params) and ``backend``.
    """

    _fusedops_fused = True  # read by the hooks: this class is already a fused replacement
    _step_supports_amp_scaling = True

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float | torch.Tensor = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        master_weights: bool = False,
        backend: str | None = None,
    ) -> None:
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, maximize=maximize)
        self._setup(master_weights, backend, differentiable)

    def _setup(self, master_weights: bool, backend: str | None, differentiable: bool) -> None:
        if differentiable:
            raise ValueError(f"{type(self).__name__} does not support differentiable=True")
        if backend is not None:
            from fusedops import dispatch

            dispatch.requested(backend)  # validates the name
        self.backend = backend
        # id(param) -> (param, its momentum buffer, flags, flag): buffers started by a step that
        # a GradScaler may have skipped; flag (nonzero: still to start) is a 0-d float32 view
        # into flags, one 1-D tensor on the device for the buffers started in the same step
        self._fusedops_first: dict[int, tuple] = {}
        self._fusedops_constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        # id(param) -> (state, buffer, master, options) of the params whose state the last step
        # checked: their next step skips the checks (_collect_group's fast path)
        self._fusedops_ready: dict[int, tuple] = {}
        self._fusedops_seen: dict[int, tuple] = {}
        for group in self.param_groups:
            group.setdefault("master_weights", master_weights)
        self.defaults["master_weights"] = master_weights

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._fusedops_first = {}  # (load_state_dict lands here too)
        self._fusedops_constants = {}
        self._fusedops_ready, self._fusedops_seen = {}, {}
        for group in self.param_groups:
            group.setdefault("master_weights", self.defaults.get("master_weights", False))

    @torch.no_grad()
    def step(self, closure=None):
        """One SGD step of every param with a gradient. Returns ``closure()``'s loss when a
        closure is given, else None. Honours ``self.grad_scale`` / ``self.found_inf`` (set by
        torch.amp.GradScaler)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        scalars = _StepScalars(grad_scale=grad_scale, found_inf=found_inf)
        # this step's checked states; params not stepped drop out (no stale state kept alive)
        self._fusedops_seen = {}
        for group in self.param_groups:
            groups, copies, sparse = self._collect_group(group, grad_scale is not None)
            self._apply_group(group, groups, copies, scalars)
            if sparse:
                self._sparse_step(group, sparse, grad_scale, found_inf)
        self._fusedops_ready, self._fusedops_seen = self._fusedops_seen, {}
        return loss

    def _state_for(self, param: torch.Tensor, group: dict, start_buffer: bool = True):
        """The param's state (None where it needs none: no momentum, no master copy) and
        whether its momentum buffer was started now (as zeros; only with ``start_buffer``):
        master copy and buffer in float32 with master weights, else the buffer in the param's
        dtype, on the param's device."""
        master = group["master_weights"] and param.dtype in _LOW_PRECISION
        momentum = group["momentum"] != 0
        if not (master or momentum):
            return None, False
        state = self.state[param]
        if master and _MASTER not in state:  # first step, or loaded without masters
            state[_MASTER] = param.detach().to(torch.float32, copy=True)
        started = False
        if momentum:
            buffer = state.get(_BUFFER)
            dtype = torch.float32 if master else param.dtype
            if buffer is None:
                if start_buffer:
                    state[_BUFFER] = torch.zeros_like(
                        param, dtype=dtype, memory_format=torch.preserve_format
                    )
                    started = True
            elif buffer.dtype != dtype or buffer.device != param.device:
                state[_BUFFER] = buffer.to(device=param.device, dtype=dtype)
        return state, started

    def _pending_flag(self, param: torch.Tensor, state: dict) -> torch.Tensor | None:
        """The first-step flag of a buffer a skipped step may have left unstarted (None: the
        buffer is started)."""
        pending = self._fusedops_first.get(id(param))
        if pending is None:
            return None
        if pending[0] is not param or state.get(_BUFFER) is not pending[1]:
            del self._fusedops_first[id(param)]  # the state was replaced since
            return None
        return pending[3]

    def _collect_group(self, group: dict, scaled: bool) -> tuple:
        """The group's kernel lists per (device, dtype) (params, grads, momentum buffers,
        masters, and per param its first-step flag: None, ``"new"`` for a buffer started now, or
        a pending flag tensor), the (original, contiguous temporary) pairs to copy back after
        the step, and the params with sparse gradients."""
        groups: dict[tuple, list[list]] = defaultdict(lambda: [[] for _ in range(6)])
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        sparse: list[torch.Tensor] = []
        ready, seen, pending = self._fusedops_ready, self._fusedops_seen, self._fusedops_first
        options = (group["momentum"] != 0, group["master_weights"])
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            # Fast path (the usual step): plain contiguous tensors whose state the last step
            # checked, still the same objects, no first-step flag pending.
            known = ready.get(id(param))
            if (
                known is not None
                and type(grad) is torch.Tensor
                and grad.dtype == param.dtype
                and param.is_contiguous()
                and grad.is_contiguous()
                and known[3] == (*options, param.dtype, param.device, param.shape)
                and self.state.get(param) is known[0]
                and _same_state(known)
                and id(param) not in pending
            ):
                lists = groups[(param.device, param.dtype)]
                lists[0].append(param)
                lists[1].append(grad)
                if known[1] is not None:
                    lists[2].append(known[1])
                if known[2] is not None:
                    lists[3].append(known[2])
                lists[4].append(None)
                lists[5].append((param, None))
                seen[id(param)] = known
                continue
            if grad.is_sparse:
                sparse.append(param)
                continue
            state, started = self._state_for(param, group)
            flag = None
            if state is not None and _BUFFER in state:
                flag = "new" if started else self._pending_flag(param, state)
            p, g = _local(param), _local(grad)
            b = _local(state[_BUFFER]) if state is not None and _BUFFER in state else None
            master = _local(state[_MASTER]) if state is not None and _MASTER in state else None
            if torch.is_complex(p):  # as torch: the real and imaginary parts are independent
                p, g = torch.view_as_real(p), torch.view_as_real(g)
                b = torch.view_as_real(b) if b is not None else None
            if g.dtype != p.dtype:
                converted = g.to(p.dtype)
                if scaled:  # the step writes the unscaled gradient back
                    copies.append((g, converted))
                g = converted
            tensors = [p, g, b, master]
            if not all(t is None or _dense_like(t, p) for t in tensors):
                for i, t in enumerate(tensors):
                    if t is not None and not t.is_contiguous():
                        tensors[i] = t.contiguous()
                        copies.append((t, tensors[i]))
            lists = groups[(p.device, p.dtype)]
            for values, t in zip(lists, tensors):
                if t is not None:
                    values.append(t)
            lists[4].append(flag)
            lists[5].append((param, state[_BUFFER] if flag is not None else None))
            if (
                flag is None
                and type(param) in PLAIN_TENSOR_TYPES
                and tensors[0] is param
                and all(t is None or t.is_contiguous() for t in tensors[2:])
            ):  # the next step may take the fast path
                tensors = _state_tensors(state) if state is not None else (None, None)
                key = (*options, param.dtype, param.device, param.shape)
                seen[id(param)] = (state, *tensors, key)
        return groups, copies, sparse

    def _apply_group(self, group, groups, copies, scalars: _StepScalars) -> None:
        """One ``sgd_step`` per (device, dtype) list of ``_collect_group`` (grad_scale and
        found_inf from ``scalars``), the first-step flags kept for the next step, then the
        copies."""
        dampening = group["dampening"]
        for (device, _), (params, grads, buffers, masters, flags, owners) in groups.items():
            found_inf = scalars.on("found_inf", device)
            firsts = []
            # dampening 0: a zero buffer's general step is the first step exactly (no flags)
            if dampening != 0 and any(flag is not None for flag in flags):
                ones, zeros = self._constant_flags(device)
                firsts = [ones if isinstance(f, str) else zeros if f is None else f for f in flags]
            sgd_step(
                params,
                grads,
                buffers,
                masters,
                firsts,
                lr=group["lr"],
                momentum=group["momentum"],
                dampening=dampening,
                weight_decay=group["weight_decay"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                grad_scale=scalars.on("grad_scale", device),
                found_inf=found_inf,
                backend=self.backend,
            )
            self._keep_flags(flags, owners, found_inf)
        for original, temporary in copies:
            original.copy_(temporary)

    def _constant_flags(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The flags 1.0 and 0.0 on ``device``, made once (the same tensors every step, so
        Triton's launch tables built for them stay cached)."""
        flags = self._fusedops_constants.get(device)
        if flags is None:
            flags = tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (1.0, 0.0))
            self._fusedops_constants[device] = flags
        return flags

    def _keep_flags(self, flags: list, owners: list, found_inf: torch.Tensor | None) -> None:
        """After a step: the buffers it started, and those still pending, stay pending under a
        GradScaler while its found_inf says the step was skipped (on the device); a step without
        found_inf went through, so they are started. The flags of the buffers a step started
        are one tensor, updated in place while they step together (the same addresses each
        step, so Triton's launch tables stay cached)."""
        if found_inf is None:
            for (param, _), flag in zip(owners, flags):
                if flag is not None:
                    self._fusedops_first.pop(id(param), None)
            return
        skipped = found_inf.ne(0)  # (a scaler's found_inf may sum several devices)
        started = [owner for owner, f in zip(owners, flags) if isinstance(f, str)]
        if started:  # one flag each, 1.0 where this step was skipped
            batch = skipped.to(torch.float32).expand(len(started)).clone()
            for i, (param, buffer) in enumerate(started):
                self._fusedops_first[id(param)] = (param, buffer, batch, batch[i])
        stepped: dict[int, list] = {}  # batch -> the pending flags of it this step updates
        for (param, _), flag in zip(owners, flags):
            if isinstance(flag, torch.Tensor):
                batch = self._fusedops_first[id(param)][2]
                stepped.setdefault(id(batch), [batch]).append(flag)
        for batch, *views in stepped.values():  # still to start only if skipped once more
            if len(views) == batch.numel():
                batch.mul_(skipped)
            else:  # only some of the batch stepped: the others keep their flags
                for view in views:
                    view.mul_(skipped)

    def _sparse_step(self, group: dict, params: list[torch.Tensor], grad_scale, found_inf) -> None:
        """torch's own sparse SGD (the functional ``torch.optim.sgd.sgd``, single-tensor) on the
        params whose gradients are sparse; under a GradScaler it reads found_inf on the host
        (skipping the step as torch's GradScaler does) and unscales the gradients first."""
        scalars = {"grad_scale": grad_scale, "found_inf": found_inf}
        scalars = {k: v for k, v in scalars.items() if v is not None}
        if scalars:
            host = to_host(scalars)  # a host synchronisation
            if "found_inf" in host and float(host["found_inf"]) != 0:
                return
            if "grad_scale" in host:  # as GradScaler.unscale_: times the fp32 reciprocal
                inverse = host["grad_scale"].double().reciprocal().float()
                for p in params:
                    p.grad = p.grad.coalesce() * inverse.to(p.grad.device)
        from torch.optim.sgd import sgd  # torch's functional SGD (no hook replaces it)

        momentum = group["momentum"]
        buffers = [self.state[p].get(_BUFFER) if momentum != 0 else None for p in params]
        sgd(
            params,
            [p.grad for p in params],
            buffers,
            has_sparse_grad=True,
            foreach=False,
            fused=False,
            weight_decay=group["weight_decay"],
            momentum=momentum,
            lr=group["lr"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
        )
        if momentum != 0:
            for p, buffer in zip(params, buffers):
                self.state[p][_BUFFER] = buffer

    def _unstarted(self) -> list[torch.Tensor]:
        """The params whose momentum buffer no step has started yet (every step since it was
        created was skipped by a GradScaler): reads the pending flags on the host, one
        synchronisation, only when there are any."""
        pending = {}
        for key, (param, buffer, _, flag) in list(self._fusedops_first.items()):
            if self.state.get(param, {}).get(_BUFFER) is buffer:
                pending[str(key)] = flag
            else:
                del self._fusedops_first[key]
        if not pending:
            return []
        values = to_host(pending)
        unstarted = []
        for key, value in values.items():
            if float(value) != 0:
                unstarted.append(self._fusedops_first[int(key)][0])
            else:  # known started: no longer pending
                del self._fusedops_first[int(key)]
        return unstarted

    def state_dict(self) -> dict[str, Any]:
        """torch's state_dict, without the momentum buffers no step has started yet (torch,
        whose GradScaler skips the whole step, would not have them)."""
        saved = super().state_dict()
        unstarted = self._unstarted()
        if not unstarted:
            return saved
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        index = {id(p): i for i, p in enumerate(params)}
        for param in unstarted:
            i = index[id(param)]
            entry = {k: v for k, v in saved["state"].get(i, {}).items() if k != _BUFFER}
            if entry:
                saved["state"][i] = entry
            else:
                saved["state"].pop(i, None)
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, then with master weights the fp32 state (momentum buffers, master
        copies) restored at full precision (torch casts every floating state tensor to its
        param's dtype)."""
        super().load_state_dict(state_dict)
        self._fusedops_first = {}
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for saved_id, param in zip(saved_ids, params):
            state = self.state.get(param)
            saved = state_dict["state"].get(saved_id)
            if not state or saved is None:
                continue
            if group_of[id(param)]["master_weights"] and param.dtype in _LOW_PRECISION:
                for key in (_BUFFER, _MASTER):
                    value = saved.get(key)
                    if isinstance(value, torch.Tensor) and not value.is_sparse:
                        state[key] = value.detach().to(
                            device=param.device, dtype=torch.float32, copy=True
                        )


def is_fused_sgd(optimizer: object) -> bool:
    """Whether ``optimizer`` is a FusedSGD (or an instance of a subclass), so its ``step()``
    runs fusedops' ``sgd_step`` with this module's state layout (with ``master_weights``,
    float32 ``momentum_buffer`` and ``master_param``). False for anything else,
    torch.optim.SGD included."""
    return isinstance(optimizer, FusedSGD)

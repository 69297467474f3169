"""FusedAdam and FusedAdamW: torch.optim.Adam / AdamW updated by one multi-tensor kernel launch
per (device, dtype) group.

Same constructor and state_dict layout as torch (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``), so checkpoints move freely between torch's optimizers and these, plus:

- ``master_weights=True``: fp16/bf16 params get an fp32 copy (state ``master_param``) that the
  update is computed on, and fp32 moments; the params receive the result rounded.
- ``backend=``: force "cuda" | "triton" | "reference" (default: the dispatch rule, which also
  honours ``fusedops.use_backend`` and ``FUSEDOPS_BACKEND``).

``step`` lives on the params' device (float32, as torch's fused/capturable Adam keeps it), and
``lr`` may be a tensor: a step never synchronises with the host while its params, gradients
and scaler share a device. (Params on the host with gradients or the scaler on an accelerator:
one blocking copy per step brings the values the host needs, see ``_StepScalars``; a tensor
``lr`` on an accelerator for host params is one more.) Under
``torch.amp.GradScaler`` (``_step_supports_amp_scaling``) the scaler hands over ``grad_scale``
and ``found_inf``: the kernel unscales the gradients and, when ``found_inf`` is set, skips
the update and the step increment on the device. DTensor params (FSDP2) are updated through
their local shards. ``foreach`` and ``fused`` are accepted for compatibility and ignored.

Gradient clipping: with ``max_grad_norm`` set, ``step()`` does what
``torch.nn.utils.clip_grad_norm_(all params, max_grad_norm, norm_type)`` followed by the step
would, in the step's passes: one read pass over the gradients for the global norm (per device
and dtype, float32 accumulation; the total over every param group and device, as
``clip_grad_norm_`` takes it), then the update multiplies each gradient by
``min(1, max_grad_norm / (norm + 1e-6))`` on the device. The gradients in ``.grad`` are never
clipped (unlike ``clip_grad_norm_``): they keep their values, or under a GradScaler their
unscaled values. The norm is that of the unscaled gradients; ``step()`` returns it (a 0-d
float32 tensor on the first gradient's device, as ``clip_grad_norm_`` returns it; ``closure()``'s
loss instead when a closure is given) and keeps it as ``last_grad_norm``. A non-finite gradient
gives a non-finite norm: under a GradScaler the step is skipped (``found_inf``), without one the
update follows ``clip_grad_norm_(error_if_nonfinite=False)`` (NaN coefficient). Nothing waits for
the device (but for the mixed host/accelerator case above: the norm is combined on the
accelerator, and the host's params and the returned norm get it in that one blocking copy).
``max_grad_norm`` and ``norm_type`` are attributes (not saved in ``state_dict``).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from itertools import chain
from typing import Any

import torch

from fusedops.ops import grad_norm
from fusedops.ops._eager import PLAIN_TENSOR_TYPES
from fusedops.ops._transfer import to_device, to_host
from fusedops.ops.adam import adam_step

_MASTER = "master_param"
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _unpatched(cls: type) -> type:
    """The torch class itself even when a fusedops hook has replaced it by our subclass (so a
    re-import of this module never subclasses its own classes)."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("torch."))


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view of its storage); other tensors unchanged."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _dense_like(t: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether ``t`` covers one gap-free memory block laid out like ``param`` (so the kernels
    may treat both as flat arrays)."""
    if t.is_contiguous() and param.is_contiguous():
        return True
    if t.stride() != param.stride() or t.shape != param.shape:
        return False
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _state_tensors(state: dict) -> tuple:
    """The state's tensors the kernels read, in a fixed order (None where absent)."""
    get = state.get
    return (get("step"), get("exp_avg"), get("exp_avg_sq"), get("max_exp_avg_sq"), get(_MASTER))


def _append(lists: list[list[torch.Tensor]], tensors: tuple) -> None:
    """Append one param's tensors (param, grad, m, v, v_max, master, step) to the group's
    lists, skipping the absent ones."""
    for values, t in zip(lists, tensors):
        if t is not None:
            values.append(t)


def _state_options(param: torch.Tensor, group: dict) -> tuple:
    """What a checked state depends on besides its tensors."""
    return (group["amsgrad"], group["master_weights"], param.dtype, param.device, param.shape)


class _FusedAdamMixin:
    """The step shared by FusedAdam and FusedAdamW (mixed in before the torch class)."""

    _fusedops_fused = True  # read by the hooks: this class is already a fused replacement
    _step_supports_amp_scaling = True

    def _setup(
        self,
        master_weights: bool,
        backend: str | None,
        differentiable: bool,
        max_grad_norm: float | None,
        norm_type: float,
    ) -> None:
        if differentiable:
            raise ValueError(f"{type(self).__name__} does not support differentiable=True")
        self.max_grad_norm = grad_norm.check_max_norm(max_grad_norm)
        self.norm_type = grad_norm.check_norm_type(norm_type)
        self.last_grad_norm: torch.Tensor | None = None
        if backend is not None:
            from fusedops import dispatch

            dispatch.requested(backend)  # validates the name
        self.backend = backend
        # id(param) -> (state, its tensors, options) of the params whose state _state_for
        # checked in the last step: their next step skips the checks (_ready_state).
        self._fusedops_ready: dict[int, tuple] = {}
        self._fusedops_seen: dict[int, tuple] = {}
        for group in self.param_groups:
            group.setdefault("master_weights", master_weights)
        self.defaults["master_weights"] = master_weights

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._fusedops_ready, self._fusedops_seen = {}, {}  # (load_state_dict lands here too)
        for group in self.param_groups:
            group.setdefault("master_weights", self.defaults.get("master_weights", False))

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam/AdamW step of every param with a gradient.

        Returns ``closure()``'s loss when a closure is given; otherwise, with ``max_grad_norm``
        set, the total norm of the unscaled gradients before clipping (0-d float32 tensor, also
        kept as ``last_grad_norm``), else None. Honours ``self.grad_scale`` /
        ``self.found_inf`` (set by torch.amp.GradScaler).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        # this step's checked states; params not stepped drop out (no stale state kept alive)
        self._fusedops_seen = {}
        collected = [self._collect_group(group) for group in self.param_groups]
        scalars = _StepScalars(grad_scale=grad_scale, found_inf=found_inf)
        norm = None
        if self.max_grad_norm is not None:
            grads = [g for _, _, norm_grads in collected for g in norm_grads]
            # combined where no copy has to wait; returned on the first gradient's device
            where = grad_norm.combine_device(grads)
            norm = grad_norm.total_norm(grads, self.norm_type, grad_scale, device=where)
            scalars.add(norm=norm, clip_coef=grad_norm.clip_coefficient(norm, self.max_grad_norm))
            norm = scalars.on("norm", grads[0].device if grads else where)
            self.last_grad_norm = norm
        for group, (groups, copies, _) in zip(self.param_groups, collected):
            self._apply_group(group, groups, copies, scalars)
        self._fusedops_ready, self._fusedops_seen = self._fusedops_seen, {}
        return loss if closure is not None else norm

    def _state_for(self, param: torch.Tensor, group: dict) -> dict:
        """The param's state, created on first use: float32 step on the param's device, moments
        (float32 with master weights), master copy."""
        state = self.state[param]
        master = group["master_weights"] and param.dtype in _LOW_PRECISION
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32, device=_local(param).device)
            moment_dtype = torch.float32 if master else param.dtype
            state["exp_avg"] = torch.zeros_like(param, dtype=moment_dtype)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=moment_dtype)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(param, dtype=moment_dtype)
            if master:
                state[_MASTER] = param.detach().to(torch.float32, copy=True)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:  # amsgrad switched on later
            state["max_exp_avg_sq"] = torch.zeros_like(state["exp_avg_sq"])
        moment_dtype = torch.float32 if master else param.dtype
        for key in _MOMENTS:  # the kernels read moments in exactly this dtype
            if key in state and state[key].dtype != moment_dtype:
                state[key] = state[key].to(moment_dtype)
        if master and _MASTER not in state:  # loaded from a checkpoint without masters
            state[_MASTER] = param.detach().to(torch.float32, copy=True)
        step = state["step"]
        device = _local(param).device
        if step.device != device or step.dtype != torch.float32:
            state["step"] = step.to(device=device, dtype=torch.float32)
        return state

    def _ready_state(self, param: torch.Tensor, group: dict) -> tuple | None:
        """``_state_tensors`` of a plain, contiguous, real param whose state ``_state_for``
        checked in the last step under the group's current options, if they are still the same
        tensors (then contiguous, in the right dtype, step on the param's device); None where
        the full path is needed. A hit is carried into this step's cache."""
        state = self.state.get(param)
        known = self._fusedops_ready.get(id(param))
        if (
            state is None
            or known is None
            or known[0] is not state
            or known[2] != _state_options(param, group)
            or not all(map(operator.is_, known[1], _state_tensors(state)))
        ):
            return None
        self._fusedops_seen[id(param)] = known
        return known[1]

    def _remember_checked(self, param: torch.Tensor, group: dict, state: dict) -> None:
        """Let the next step take the fast path for this param (plain, real, contiguous state)."""
        tensors = _state_tensors(state)
        if (
            type(param) in PLAIN_TENSOR_TYPES
            and not torch.is_complex(param)
            and all(t is None or t.is_contiguous() for t in tensors)
        ):
            self._fusedops_seen[id(param)] = (state, tensors, _state_options(param, group))

    def _collect_group(self, group: dict) -> tuple:
        """The group's kernel lists per (device, dtype), the (original, contiguous temporary)
        pairs to copy back after the step, and the gradients as they are (for the norm)."""
        groups: dict[tuple, list[list[torch.Tensor]]] = defaultdict(lambda: [[] for _ in range(7)])
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original, contiguous temporary)
        norm_grads: list[torch.Tensor] = []
        amsgrad = group["amsgrad"]
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            norm_grads.append(grad)
            # Fast path (the usual step): plain contiguous tensors whose state is known good.
            if (
                type(param) in PLAIN_TENSOR_TYPES
                and type(grad) is torch.Tensor
                and grad.dtype == param.dtype
                and param.is_contiguous()
                and grad.is_contiguous()
            ):
                ready = self._ready_state(param, group)
                if ready is not None:  # appended inline: this runs per param every step
                    step, m, v, v_max, master = ready
                    lists = groups[(param.device, param.dtype)]
                    lists[0].append(param)
                    lists[1].append(grad)
                    lists[2].append(m)
                    lists[3].append(v)
                    if amsgrad:
                        lists[4].append(v_max)
                    if master is not None:
                        lists[5].append(master)
                    lists[6].append(step)
                    continue
            if grad.is_sparse:
                raise RuntimeError(
                    "Adam does not support sparse gradients, please consider SparseAdam instead"
                )
            state = self._state_for(param, group)
            self._remember_checked(param, group, state)
            p, g = _local(param), _local(grad)
            m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
            v_max = _local(state["max_exp_avg_sq"]) if amsgrad else None
            master = _local(state[_MASTER]) if _MASTER in state else None
            if torch.is_complex(p):  # as torch: the real and imaginary parts are independent
                p, g, m, v = (torch.view_as_real(t) for t in (p, g, m, v))
                v_max = torch.view_as_real(v_max) if v_max is not None else None
            if g.dtype != p.dtype:
                converted = g.to(p.dtype)
                copies.append((g, converted))
                g = converted
            tensors = [p, g, m, v, v_max, master]
            if not all(t is None or _dense_like(t, p) for t in tensors):
                for i, t in enumerate(tensors):
                    if t is not None and not t.is_contiguous():
                        tensors[i] = t.contiguous()
                        copies.append((t, tensors[i]))
            _append(groups[(p.device, p.dtype)], (*tensors, state["step"]))
        return groups, copies, norm_grads

    def _apply_group(self, group, groups, copies, scalars: _StepScalars) -> None:
        """One ``adam_step`` per (device, dtype) list of ``_collect_group`` (grad_scale,
        found_inf and clip_coef from ``scalars``), then the copies."""
        beta1, beta2 = (float(b) for b in group["betas"])
        for (device, _), lists in groups.items():
            adam_step(
                *lists,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                amsgrad=group["amsgrad"],
                maximize=group["maximize"],
                decoupled=group["decoupled_weight_decay"],
                grad_scale=scalars.on("grad_scale", device),
                found_inf=scalars.on("found_inf", device),
                clip_coef=scalars.on("clip_coef", device),
                backend=self.backend,
            )
        for original, temporary in copies:
            original.copy_(temporary)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, then: steps back on the params' devices as float32, and with master
        weights the fp32 state (moments, master copies) restored at full precision (torch casts
        every floating state tensor to its param's dtype)."""
        super().load_state_dict(state_dict)
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for saved_id, param in zip(saved_ids, params):
            state = self.state.get(param)
            saved = state_dict["state"].get(saved_id)
            if not state or saved is None:
                continue
            if "step" in state:
                device = _local(param).device
                step = state["step"].detach()  # torch keeps the saved tensor itself: copy it
                state["step"] = step.to(device=device, dtype=torch.float32, copy=True)
            if group_of[id(param)]["master_weights"] and param.dtype in _LOW_PRECISION:
                for key in (*_MOMENTS, _MASTER):
                    if key in saved:
                        value = saved[key].detach()
                        state[key] = value.to(device=param.device, dtype=torch.float32, copy=True)


class _StepScalars:
    """A step's 0-d tensors (grad_scale and found_inf from a GradScaler, the norm and clip_coef
    of clipping) as float32 on each device that needs them. Copies onto an accelerator are
    asynchronous; the values the host needs from an accelerator (params on the host, or the
    norm returned there, while the gradients or the scaler live on an accelerator) come over
    together in one blocking copy, the step's only host synchronisation (a non-blocking copy
    onto the host may be read before it lands: fusedops/ops/_transfer.py)."""

    def __init__(self, **values: torch.Tensor | None) -> None:
        self._values: dict[str, torch.Tensor] = {}
        self._moved: dict[tuple[str, torch.device], torch.Tensor] = {}
        self.add(**values)

    def add(self, **values: torch.Tensor | None) -> None:
        """Add the named values (None: absent); before the first ``on`` onto the host."""
        self._values.update((k, v) for k, v in values.items() if v is not None)

    def on(self, name: str, device: torch.device) -> torch.Tensor | None:
        """The value ``name`` as a 0-d float32 tensor on ``device`` (None when absent)."""
        value = self._values.get(name)
        if value is None:
            return None
        if (name, device) not in self._moved:
            if device.type == "cpu" and value.device.type != "cpu":
                on_host = to_host(self._values)  # every value the host may need, at once
                self._moved.update(((k, device), v) for k, v in on_host.items())
            else:
                self._moved[(name, device)] = to_device(value, device, torch.float32)
        return self._moved[(name, device)]


_Adam = _unpatched(torch.optim.Adam)
_AdamW = _unpatched(torch.optim.AdamW)


class FusedAdam(_FusedAdamMixin, _Adam):
    """torch.optim.Adam computed by fusedops' multi-tensor kernels (see the module docstring).

    params: iterable of tensors or param-group dicts; fp32/fp16/bf16 (any dtype, also complex,
    on the reference backend). Other arguments as torch.optim.Adam, plus ``master_weights``
    (fp32 master copies for fp16/bf16 params), ``backend``, and ``max_grad_norm`` /
    ``norm_type`` (gradient clipping inside the step, see the module docstring; None: off).
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
        master_weights: bool = False,
        backend: str | None = None,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
    ) -> None:
        _check_lr(lr)
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            maximize=maximize,
            capturable=capturable,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        self._setup(master_weights, backend, differentiable, max_grad_norm, norm_type)


class FusedAdamW(_FusedAdamMixin, _AdamW):
    """torch.optim.AdamW (decoupled weight decay) computed by fusedops' multi-tensor kernels.

    Arguments as torch.optim.AdamW, plus ``master_weights``, ``backend``, ``max_grad_norm``
    and ``norm_type`` (see FusedAdam).
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        master_weights: bool = False,
        backend: str | None = None,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
    ) -> None:
        _check_lr(lr)
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            maximize=maximize,
            capturable=capturable,
        )
        self._setup(master_weights, backend, differentiable, max_grad_norm, norm_type)


def is_fused_adam(optimizer: object) -> bool:
    """Whether ``optimizer`` is one of this module's optimizers: a FusedAdam or FusedAdamW
    (or an instance of a subclass of either), so its ``step()`` runs fusedops' ``adam_step``
    with this module's state layout (float32 ``step`` tensors on the params' device; with
    ``master_weights``, float32 moments and ``master_param``) and its attributes
    ``max_grad_norm`` / ``norm_type`` / ``grad_scale`` / ``found_inf``. False for anything
    else, torch.optim.Adam / AdamW included. Reads no state and synchronises nothing."""
    return isinstance(optimizer, _FusedAdamMixin)


def _check_lr(lr) -> None:
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")

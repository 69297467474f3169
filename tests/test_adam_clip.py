"""FusedAdam / FusedAdamW with ``max_grad_norm``: equal to ``clip_grad_norm_`` followed by
torch.optim.Adam / AdamW, alone and in torch.amp.GradScaler's sequence, on every backend here."""

import contextlib
import copy
import math

import pytest
import torch

from fusedops import dispatch, hooks
from fusedops.ops import grad_norm
from fusedops.optim import FusedAdam, FusedAdamW
from fusedops.testing import assert_close
from tests.op_testing import BACKENDS, DEVICE
from tests.test_adam import _restore_hooks  # noqa: F401 (the fixture restoring torch's classes)

PAIRS = {"adam": (FusedAdam, torch.optim.Adam), "adamw": (FusedAdamW, torch.optim.AdamW)}
#: (shape, gradient): random, all zeros, never one (None), and a zero-size param.
PARAMS = [
    ((7,), "random"),
    ((12, 30), "random"),
    ((3, 4), "zero"),
    ((5,), None),
    ((2, 0), "random"),
]
#: Gradient magnitude per step: clipping is active on some steps (coefficient < 1), not others.
GRAD_SCALES = [3.0, 0.01, 1.0, 10.0]
MAX_NORM = 2.0
#: Terms the global norm sums (the element count of the gradients): its tolerance scale.
NORM_TERMS = sum(math.prod(shape) for shape, grad in PARAMS if grad is not None)


def _groups(params):
    """Two param groups with their own hyperparameters (the norm is taken over both)."""
    return [
        {"params": params[:2], "lr": 0.01, "weight_decay": 0.1},
        {"params": params[2:], "lr": 0.02, "weight_decay": 0.0},
    ]


def _make(dtype, generator):
    return [
        torch.randn(shape, generator=generator).to(DEVICE, dtype).requires_grad_()
        for shape, _ in PARAMS
    ]


def _grads(step, generator, dtype):
    """This step's gradients (None where a param gets none), fresh random values."""
    grads = []
    for shape, kind in PARAMS:
        if kind is None:
            grads.append(None)
            continue
        g = torch.randn(shape, generator=generator) * GRAD_SCALES[step]
        grads.append(torch.zeros(shape) if kind == "zero" else g)
    return [None if g is None else g.to(DEVICE, dtype) for g in grads]


def _precision(precision):
    """(our param dtype, torch's param dtype, master weights, torch's options)."""
    if precision == "fp32":
        return torch.float32, torch.float32, False, dict(foreach=False)
    if precision == "bf16-master":  # master weights track an fp32 run
        return torch.bfloat16, torch.float32, True, dict(foreach=False)
    # bf16 params: torch's fused Adam does the same per-element fp32 math, one rounding a store
    return torch.bfloat16, torch.bfloat16, False, dict(fused=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize(
    ("kind", "precision"),
    [("adam", "fp32"), ("adamw", "fp32"), ("adamw", "bf16-master"), ("adam", "bf16")],
)
def test_clipping_matches_clip_grad_norm_then_torch(backend, norm_type, kind, precision):
    fused_cls, torch_cls = PAIRS[kind]
    dtype, ref_dtype, master, ref_options = _precision(precision)
    generator = torch.Generator().manual_seed(torch.seed())  # fresh values each run
    ours = _make(dtype, generator)
    theirs = [p.detach().to(ref_dtype, copy=True).requires_grad_() for p in ours]
    opt = fused_cls(
        _groups(ours), master_weights=master, backend=backend, max_grad_norm=MAX_NORM,
        norm_type=norm_type,
    )  # fmt: skip
    ref_opt = torch_cls(_groups(theirs), **ref_options)
    coefficients = []
    for step in range(len(GRAD_SCALES)):
        grads = _grads(step, generator, dtype)
        for p, q, g in zip(ours, theirs, grads):
            p.grad = None if g is None else g.clone()
            q.grad = None if g is None else g.to(ref_dtype, copy=True)
        norm = opt.step()
        # (torch's inf norm refuses an empty gradient; ours skips it: it adds nothing)
        nonempty = [q for q in theirs if q.numel()]
        ref_norm = torch.nn.utils.clip_grad_norm_(nonempty, MAX_NORM, norm_type)
        ref_opt.step()
        assert norm.dtype == torch.float32 and norm.shape == () and opt.last_grad_norm is norm
        norm_dtype = torch.float32 if ref_dtype == torch.float32 else torch.bfloat16
        assert_close(norm, ref_norm, dtype=norm_dtype, scale=NORM_TERMS, msg=f"norm {step}")
        coefficients.append(float(grad_norm.clip_coefficient(norm, MAX_NORM)))
        for p, g in zip(ours, grads):  # .grad keeps the unclipped values
            assert (p.grad is None) if g is None else torch.equal(p.grad, g)
    assert min(coefficients) < 0.5 and max(coefficients) == 1.0  # clipping on and off
    assert dispatch.last_used["adam"] == backend
    param_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    for p, q in zip(ours, theirs):
        assert p.dtype == dtype
        assert_close(p, q, dtype=param_dtype, scale=2.0, msg="param")
        state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert set(ref_state) <= set(state)
        if ref_state:
            assert float(state["step"]) == float(ref_state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            if key in ref_state:
                assert_close(state[key], ref_state[key], dtype=param_dtype, scale=2.0, msg=key)
        if master and ref_state:
            assert_close(state["master_param"], q, dtype=torch.float32, scale=2.0, msg="master")
    assert ours[3] not in opt.state  # never had a gradient


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_without_clipping_returns_none_and_with_closure_the_loss(backend):
    params = _make(torch.float32, torch.Generator().manual_seed(torch.seed()))
    for p in params:
        p.grad = torch.randn_like(p)
    assert FusedAdam(params, backend=backend).step() is None
    opt = FusedAdamW(params, backend=backend, max_grad_norm=1.0)
    assert opt.step(lambda: torch.tensor(3.0, device=DEVICE)) == 3.0
    expected = torch.nn.utils.get_total_norm([p.grad for p in params])
    assert_close(opt.last_grad_norm, expected, scale=NORM_TERMS)


class _HostSync(AssertionError):
    pass


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "grad-scaler"])
def test_step_with_clipping_never_waits_for_the_device(backend, scaled, monkeypatch):
    """No .item(), bool(tensor), float(tensor)... in a step (on a GPU also: no synchronising
    CUDA call, torch.cuda.set_sync_debug_mode). The first step (state and Triton's launch
    tables built on the host from host tensors, which on CPU the patch cannot tell apart) is
    not checked."""
    params = _make(torch.float32, torch.Generator().manual_seed(torch.seed()))
    opt = FusedAdamW(_groups(params), backend=backend, max_grad_norm=0.5)
    if scaled:
        opt.grad_scale = torch.tensor(4.0, device=DEVICE)
        opt.found_inf = torch.tensor(0.0, device=DEVICE)
    for p in params[:3]:
        p.grad = torch.randn_like(p)
    opt.step()

    def refuse(name):
        def method(*args, **kwargs):
            raise _HostSync(f"Tensor.{name} during step")

        return method

    for p in params[:3]:  # new values in the same tensors (Triton's launch tables stay cached)
        p.grad.copy_(torch.randn_like(p))
    with monkeypatch.context() as patched:
        for name in ("item", "__bool__", "__float__", "__int__", "__index__", "tolist"):
            patched.setattr(torch.Tensor, name, refuse(name))
        if DEVICE.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            if DEVICE.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    with monkeypatch.context() as patched:  # the check itself works
        patched.setattr(torch.Tensor, "item", refuse("item"))
        with pytest.raises(_HostSync):
            opt.last_grad_norm.item()


# ---------------------------------------------------------------------------------------------
# GradScaler: torch's unscale_ / clip_grad_norm_ / step / update sequence


def _scaled_grads(params, scaler, generator, poison):
    for i, p in enumerate(params):
        if PARAMS[i][1] is None:
            continue
        g = torch.randn(p.shape, generator=generator).to(DEVICE)
        p.grad = scaler.scale(g).clone()
    if poison:
        params[1].grad[2, 3] = float("inf")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("user_unscales", [False, True], ids=["step", "unscale_-then-step"])
def test_grad_scaler_sequence_matches_torch(backend, user_unscales):
    seed = torch.seed()
    ours = _make(torch.float32, torch.Generator().manual_seed(seed))
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedAdamW(_groups(ours), backend=backend, max_grad_norm=MAX_NORM)
    ref_opt = torch.optim.AdamW(_groups(theirs), foreach=False)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**12, growth_interval=2)
    ref_scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**12, growth_interval=2)
    for step, poison in enumerate([False, True, False, False, False]):
        _scaled_grads(ours, scaler, torch.Generator().manual_seed(seed + step), poison)
        _scaled_grads(theirs, ref_scaler, torch.Generator().manual_seed(seed + step), poison)
        scale = scaler.get_scale()
        scaled = [None if p.grad is None else p.grad.clone() for p in ours]
        if user_unscales:
            scaler.unscale_(opt)
        norm = scaler.step(opt)
        scaler.update()
        ref_scaler.unscale_(ref_opt)
        ref_norm = torch.nn.utils.clip_grad_norm_(theirs, MAX_NORM)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        assert opt.last_grad_norm is norm
        assert_close(norm, ref_norm, scale=NORM_TERMS, msg=f"norm {step}")
        assert poison == (not math.isfinite(float(norm)))
        assert scaler.get_scale() == ref_scaler.get_scale()
        for p, g in zip(ours, scaled):  # unscaled, never clipped
            if g is not None and not poison:
                assert_close(p.grad, g / scale, msg="unscaled grad")
        for p, q in zip(ours, theirs):
            assert_close(p, q, msg=f"param {step}")
            state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
            if ref_state:
                stepped = step + 1 - (step >= 1)  # step 1 was skipped
                assert float(state["step"]) == float(ref_state["step"]) == stepped
                assert_close(state["exp_avg"], ref_state["exp_avg"])
                assert_close(state["exp_avg_sq"], ref_state["exp_avg_sq"])
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")


# ---------------------------------------------------------------------------------------------
# State dicts, arguments, hooks


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("direction", ["torch->fused", "fused->torch"])
def test_state_dict_interchangeable_with_torch(kind, direction):
    """Two steps on one side, the state moved to the other, two more steps: equal to four
    steps of clip_grad_norm_ + torch."""
    fused_cls, torch_cls = PAIRS[kind]
    seed = torch.seed()
    start = _make(torch.float32, torch.Generator().manual_seed(seed))
    runs = {}
    for name in ("fused", "torch", "mixed"):
        params = [p.detach().clone().requires_grad_() for p in start]
        first_fused = name == "fused" or (name == "mixed" and direction == "fused->torch")
        make = {
            True: lambda ps: fused_cls(_groups(ps), max_grad_norm=MAX_NORM, backend="reference"),
            False: lambda ps: torch_cls(_groups(ps), foreach=False),
        }
        opt = make[first_fused](params)
        generator = torch.Generator().manual_seed(seed + 1)
        for step in range(4):
            if step == 2 and name == "mixed":
                saved = copy.deepcopy(opt.state_dict())
                opt = make[not first_fused](params)
                opt.load_state_dict(saved)
            for p, g in zip(params, _grads(step, generator, torch.float32)):
                p.grad = g
            if not isinstance(opt, (FusedAdam, FusedAdamW)):
                torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
            opt.step()
        runs[name] = (params, opt)
    for p, q, r in zip(runs["mixed"][0], runs["torch"][0], runs["fused"][0]):
        assert_close(p, q, msg="mixed vs torch")
        assert_close(r, q, msg="fused vs torch")


@pytest.mark.parametrize("cls", [FusedAdam, FusedAdamW])
@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(max_grad_norm=-1.0), ValueError, "max_grad_norm must be a positive finite"),
        (dict(max_grad_norm=0.0), ValueError, "max_grad_norm must be a positive finite"),
        (dict(max_grad_norm=math.inf), ValueError, "max_grad_norm must be a positive finite"),
        (dict(max_grad_norm="1"), TypeError, "max_grad_norm must be a positive number"),
        (dict(max_grad_norm=1.0, norm_type=0), ValueError, "norm_type must be a positive"),
        (dict(max_grad_norm=1.0, norm_type=math.nan), ValueError, "norm_type must be a positive"),
        (dict(max_grad_norm=1.0, norm_type="inf"), TypeError, "norm_type must be a positive"),
    ],
)
def test_bad_clipping_arguments(cls, options, error, match):
    with pytest.raises(error, match=match):
        cls([torch.zeros(3, device=DEVICE, requires_grad=True)], **options)


def test_no_gradients_give_a_zero_norm():
    params = _make(torch.float32, torch.Generator().manual_seed(torch.seed()))
    norm = FusedAdam(params, max_grad_norm=1.0).step()
    assert norm.dtype == torch.float32 and float(norm) == 0.0


@pytest.mark.usefixtures("_restore_hooks")
def test_hooked_torch_adamw_takes_max_grad_norm():
    """enable_fused_adamw() users clip by passing max_grad_norm to torch.optim.AdamW (and drop
    their clip_grad_norm_ line)."""
    hooks.enable_fused_adamw()
    seed = torch.seed()
    ours = _make(torch.float32, torch.Generator().manual_seed(seed))
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = torch.optim.AdamW(ours, lr=0.01, max_grad_norm=MAX_NORM)
    assert type(opt) is FusedAdamW
    hooks.disable_fused_adamw()
    ref_opt = torch.optim.AdamW(theirs, lr=0.01, foreach=False)
    generator = torch.Generator().manual_seed(seed + 1)
    for step in range(2):
        for p, q, g in zip(ours, theirs, _grads(step, generator, torch.float32)):
            p.grad, q.grad = g, None if g is None else g.clone()
        opt.step()
        torch.nn.utils.clip_grad_norm_(theirs, MAX_NORM)
        ref_opt.step()
    for p, q in zip(ours, theirs):
        assert_close(p, q)


# ---------------------------------------------------------------------------------------------
# Params on two devices


def _copy_destination(tensor: torch.Tensor, args: tuple, kwargs: dict) -> torch.device:
    """The device a ``tensor.to(*args, **kwargs)`` call copies onto."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
        if isinstance(arg, (torch.device, str)):
            return torch.device(arg)
    return tensor.device


class _UnlandedHostCopies:
    """Inside ``active()``, every non-blocking copy onto the host reads NaN, as a host read may
    before a copy from a GPU has landed (torch returns from it at once; the pinned buffer then
    still holds an older value: the 2026-11-26 H200 run's norm 15.30 for 0.076 was the step
    before's). On the CPU the copy cannot tell where its data would come from on a GPU machine,
    so every such request is treated as one; ``calls`` lists them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.on = False

    @contextlib.contextmanager
    def active(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False


@pytest.fixture
def unlanded_host_copies(monkeypatch):
    """Patches Tensor.to / Tensor.copy_ for ``_UnlandedHostCopies`` (returned)."""
    emulation = _UnlandedHostCopies()
    original_to, original_copy = torch.Tensor.to, torch.Tensor.copy_

    def poison(t: torch.Tensor, what: str) -> None:
        emulation.calls.append(what)
        t.fill_(float("nan") if t.is_floating_point() or t.is_complex() else 1)

    def to(self, *args, **kwargs):
        out = original_to(self, *args, **kwargs)
        blocking = not (kwargs.get("non_blocking") or any(a is True for a in args))
        if not emulation.on or blocking or _copy_destination(self, args, kwargs).type != "cpu":
            return out
        out = out.clone() if out is self else out  # (on the CPU: the source itself)
        poison(out, f"Tensor.to({args}, {kwargs})")
        return out

    def copy_(self, src, non_blocking=False):
        original_copy(self, src)
        if emulation.on and non_blocking and self.device.type == "cpu":
            poison(self, "Tensor.copy_(non_blocking=True) onto the host")
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    return emulation


def _steps_on_two_devices(norm_type: float, scaled: bool, unlanded: _UnlandedHostCopies) -> None:
    """Params alternately on the CPU and on the device under test (two devices on a GPU
    machine; here both on the CPU, so the grouping logic still runs), three steps of one global
    norm over both: each device's update clipped by it, as clip_grad_norm_ then AdamW. With
    ``scaled`` the GradScaler's grad_scale and found_inf and a tensor lr live on the device
    under test (the host's params need them on the host). ``opt.step()`` runs with
    ``unlanded``'s emulation active."""
    devices = (torch.device("cpu"), DEVICE)
    shapes = ((6, 5), (11,), (4, 4), (9,))
    params = [
        torch.randn(shape, device="cpu").to(devices[i % 2]).requires_grad_()
        for i, shape in enumerate(shapes)
    ]
    ref = [p.detach().clone().requires_grad_() for p in params]
    lr = torch.tensor(0.01, device=DEVICE) if scaled else 0.01
    opt = FusedAdamW(params, lr=lr, weight_decay=0.1, max_grad_norm=0.5, norm_type=norm_type)
    ref_opt = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.1, foreach=False)
    scale = 4.0 if scaled else 1.0
    if scaled:
        opt.grad_scale = torch.tensor(scale, device=DEVICE)
        opt.found_inf = torch.tensor(0.0, device=DEVICE)
    for step in range(3):
        for p, r in zip(params, ref):
            g = torch.randn(p.shape, device="cpu") * GRAD_SCALES[step]
            p.grad, r.grad = (g * scale).to(p.device), g.to(p.device)
        with unlanded.active():
            norm = opt.step()
        assert unlanded.calls == [], f"a non-blocking copy onto the host in step {step}"
        want = torch.nn.utils.clip_grad_norm_(ref, 0.5, norm_type=norm_type)
        ref_opt.step()
        assert norm.device == params[0].device  # the first gradient's, as clip_grad_norm_
        assert_close(norm.cpu(), want.cpu(), scale=NORM_TERMS, msg=f"norm, step {step}")
        for p, r in zip(params, ref):
            assert p.device == r.device
            assert_close(p, r, msg=f"params, step {step}")


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_param_groups_on_two_devices_share_one_global_norm(norm_type, unlanded_host_copies):
    """One global norm over params on two devices (``_steps_on_two_devices``)."""
    _steps_on_two_devices(norm_type, False, unlanded_host_copies)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_scaler_values_and_lr_on_the_device_reach_the_host_params(norm_type, unlanded_host_copies):
    """grad_scale, found_inf and a tensor lr on the device under test, half the params on the
    host (``_steps_on_two_devices``)."""
    _steps_on_two_devices(norm_type, True, unlanded_host_copies)


def test_norms_are_combined_where_no_copy_waits():
    """combine_device: the first gradient's device unless that is the host and another
    gradient lives on an accelerator (meta stands for one here); the host with none."""
    host, other = torch.zeros(3, device="cpu"), torch.zeros(3, device="meta")
    assert grad_norm.combine_device([host, other, host]) == other.device
    assert grad_norm.combine_device([other, host]) == other.device
    assert grad_norm.combine_device([host, host]) == host.device
    assert grad_norm.combine_device([]) == torch.device("cpu")

"""FusedSGD against torch.optim.SGD, every backend available here: every option combination,
torch's own optim_db cases, state_dict round trips, GradScaler (the inf step skipped on the
device, a skipped first momentum step included), master weights, empty / zero-size / sparse /
complex / non-contiguous params, the kernels' tables, hooks and the syncfree names."""

import copy
import itertools
import math
import re
import sys

import pytest
import torch

import fusedops
from fusedops import dispatch, hooks
from fusedops.optim import FusedAdam, FusedAdamW, FusedSGD
from fusedops.testing import assert_close, random_tensor
from tests.op_testing import BACKENDS, DEVICE, KERNEL_BACKENDS

#: Params of every rank, odd sizes and zero-size ones; one never gets a gradient, one only on
#: odd steps (its momentum buffer starts a step after the others').
SHAPES = [(1,), (7,), (10, 33), (2, 3, 1, 5), (3, 0), (0,)]
NO_GRAD = (5,)
LATE = (4, 4)
STEPS = 4
LR = 0.05

#: Every valid option combination: Nesterov needs momentum and no dampening; dampening only
#: matters with momentum.
OPTIONS = [
    dict(momentum=m, dampening=d, nesterov=n, weight_decay=wd, maximize=mx)
    for m, d, n, wd, mx in itertools.product(
        [0.0, 0.9], [0.0, 0.3], [False, True], [0.0, 0.1], [False, True]
    )
    if not (n and (m == 0 or d != 0)) and not (m == 0 and d != 0)
]


def _option_id(options):
    on = [f"{k}={v}" for k, v in options.items() if v]
    return "-".join(on) or "plain"


def _params(dtype, device=DEVICE):
    return [random_tensor(s, dtype, device).requires_grad_() for s in [*SHAPES, NO_GRAD, LATE]]


def _has_grad(i, step):
    return i < len(SHAPES) or (i == len(SHAPES) + 1 and step % 2 == 1)


class _Bounds:
    """The magnitude of the terms accumulated into each param and momentum buffer of the
    oracle's run (fusedops.testing's rule: ``magnitude`` is ``sum |term|``): a param sums its
    start and, each step, lr times the gradient, the weight decay term and the buffers (twice
    the first two: Nesterov adds them again); a buffer sums, each step, the gradient, the
    weight decay term and its previous value."""

    #: terms summed into one element over the run (a param: its start and 4 a step)
    PARAM_TERMS = 1 + 4 * STEPS
    BUFFER_TERMS = 3 * STEPS

    def __init__(self, params):
        self.param = [p.detach().double().abs() for p in params]
        self.buffer = [torch.zeros_like(m) for m in self.param]

    def add(self, i, grad, before, buffer_before, buffer_after, lr, weight_decay):
        g = grad.double().abs() + weight_decay * before.double().abs()
        old = buffer_before.double().abs()
        new = buffer_after.double().abs()
        self.param[i] = self.param[i] + lr * (2 * g + old + new)
        self.buffer[i] = self.buffer[i] + g + old


def _term_sums(steps, lr, momentum=0.0, weight_decay=0.0, nesterov=False, value=3.0):
    """(param, buffer): bounds on the sums of |terms| accumulated into a param and its momentum
    buffer over ``steps`` steps, from params and gradients bounded by ``value`` (random_tensor's
    range): the update's terms added up in absolute value, step by step."""
    param, buffer = value, 0.0
    for _ in range(steps):
        grad = value + weight_decay * param
        buffer = momentum * buffer + grad if momentum else 0.0
        update = (grad + momentum * buffer if nesterov else buffer) if momentum else grad
        param = param + lr * update
    return param, max(buffer, value)


def _buffer(optimizer, p):
    return optimizer.state.get(p, {}).get("momentum_buffer")


def _groups(params, lr_tensor_device):
    """Two param groups over alternate params: one with a float lr, one with a tensor lr (on
    ``lr_tensor_device``; a copy for each optimizer)."""
    return [
        {"params": params[0::2], "lr": LR},
        {"params": params[1::2], "lr": torch.tensor(LR, device=lr_tensor_device)},
    ]


def _run_against_torch(backend, precision, options, steps=STEPS):
    """``steps`` steps of FusedSGD and of torch.optim.SGD (fp32, single-tensor: the oracle) on
    the same random gradients, lr a float in one param group and a tensor in the other;
    compares params and state with tolerances from the rule."""
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    master = precision == "bf16-master"
    ours = _params(dtype)
    theirs = [p.detach().to(torch.float32, copy=True).requires_grad_() for p in ours]
    opt = FusedSGD(_groups(ours, DEVICE), master_weights=master, backend=backend, **options)
    ref_opt = torch.optim.SGD(_groups(theirs, DEVICE), foreach=False, **options)
    assert isinstance(opt.param_groups[1]["lr"], torch.Tensor)
    bounds = _Bounds(theirs)
    for step in range(steps):
        before = [(q.detach().clone(), _buffer(ref_opt, q)) for q in theirs]
        for i, (p, q) in enumerate(zip(ours, theirs)):
            grad = random_tensor(p.shape, dtype, DEVICE) if _has_grad(i, step) else None
            p.grad = grad
            q.grad = None if grad is None else grad.to(torch.float32)
        opt.step()
        ref_opt.step()
        for i, q in enumerate(theirs):
            if q.grad is None:
                continue
            old, old_buffer = before[i]
            old_buffer = torch.zeros_like(q) if old_buffer is None else old_buffer.clone()
            new_buffer = _buffer(ref_opt, q)
            new_buffer = torch.zeros_like(q) if new_buffer is None else new_buffer
            bounds.add(i, q.grad, old, old_buffer, new_buffer, LR, options["weight_decay"])
    if any(p.numel() for p in ours):
        assert dispatch.last_used["sgd"] == backend
    # a bf16 param without master weights accumulates its updates in bf16 (a rounding a step)
    accumulated = torch.float32 if precision != "bf16" else torch.bfloat16
    for i, (p, q) in enumerate(zip(ours, theirs)):
        assert p.dtype == dtype
        param_terms = 1 if master else _Bounds.PARAM_TERMS  # the master copy rounded once
        assert_close(
            p, q, dtype=dtype, terms=param_terms, compute=None if master else accumulated,
            magnitude=bounds.param[i], msg=f"param {i}",
        )  # fmt: skip
        state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert set(state) - {"master_param"} == set(ref_state), (i, set(state), set(ref_state))
        if master and q.grad is not None:
            assert_close(
                state["master_param"], q, terms=_Bounds.PARAM_TERMS, magnitude=bounds.param[i],
                msg=f"master {i}",
            )  # fmt: skip
        if "momentum_buffer" in ref_state:
            buffer = state["momentum_buffer"]
            assert buffer.dtype == (torch.float32 if master else dtype)
            assert_close(
                buffer, ref_state["momentum_buffer"], dtype=buffer.dtype,
                terms=_Bounds.BUFFER_TERMS, compute=None if master else accumulated,
                magnitude=bounds.buffer[i], msg=f"buffer {i}",
            )  # fmt: skip
    assert ours[len(SHAPES)] not in opt.state  # never had a gradient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("options", OPTIONS, ids=_option_id)
def test_matches_torch_sgd(backend, precision, options):
    _run_against_torch(backend, precision, options)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options", [o for o in OPTIONS if o["maximize"] == (o["weight_decay"] != 0)], ids=_option_id
)
def test_master_weights_track_an_fp32_run(backend, options):
    _run_against_torch(backend, "bf16-master", options)


# ---------------------------------------------------------------------------------------------
# torch's own test cases (torch.testing._internal.common_optimizers.optim_db)


def _sgd_optim_info():
    """torch's OptimizerInfo of SGD, or a skip naming why it cannot be read here."""
    try:
        from torch.testing._internal.common_optimizers import optim_db
    except Exception as error:  # noqa: BLE001 (torch's test dependencies may be missing)
        pytest.skip(f"torch's optim_db does not import here: {type(error).__name__}: {error}")
    return next(info for info in optim_db if info.optim_cls.__name__ == "SGD")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_optim_db_sgd_inputs_match_torch(backend):
    """Every SGD configuration of torch's optim_db (lr as float and tensor, weight decay,
    momentum, dampening, Nesterov, maximize), fp32, 3 steps on a few params."""
    info = _sgd_optim_info()
    inputs = info.optim_inputs_func(device=DEVICE.type, dtype=torch.float32)
    assert len(inputs) >= 8
    shapes = [(5,), (3, 4), (17,)]
    for case in inputs:
        kwargs = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)
                  for k, v in case.kwargs.items()}  # fmt: skip
        ours = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in shapes]
        theirs = [p.detach().clone().requires_grad_() for p in ours]
        ref_kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                      for k, v in kwargs.items()}  # fmt: skip
        opt = FusedSGD(ours, backend=backend, **kwargs)
        ref_opt = torch.optim.SGD(theirs, foreach=False, **ref_kwargs)
        lr = float(kwargs.get("lr", 1e-3))
        wd = float(kwargs.get("weight_decay", 0.0))
        bounds = _Bounds(theirs)
        for _ in range(3):
            before = [(q.detach().clone(), _buffer(ref_opt, q)) for q in theirs]
            for p, q in zip(ours, theirs):
                p.grad = random_tensor(p.shape, torch.float32, DEVICE)
                q.grad = p.grad.clone()
            opt.step()
            ref_opt.step()
            for i, q in enumerate(theirs):
                old, old_buffer = before[i]
                old_buffer = torch.zeros_like(q) if old_buffer is None else old_buffer.clone()
                new_buffer = _buffer(ref_opt, q)
                new_buffer = torch.zeros_like(q) if new_buffer is None else new_buffer
                bounds.add(i, q.grad, old, old_buffer, new_buffer, lr, wd)
        for i, (p, q) in enumerate(zip(ours, theirs)):
            assert_close(
                p, q, terms=_Bounds.PARAM_TERMS, magnitude=bounds.param[i],
                msg=f"optim_db {case.desc!r} param {i}",
            )  # fmt: skip
            assert set(opt.state.get(p, {})) == set(ref_opt.state.get(q, {})), case.desc


def test_torch_optim_db_sgd_error_inputs_raise_as_torch():
    """torch's optim_db construction errors for SGD (bad params, duplicate params, a 2-element
    lr tensor, negative momentum...) raise the same from FusedSGD."""
    info = _sgd_optim_info()
    checked = 0
    for error_input in info.optim_error_inputs_func(device=DEVICE.type, dtype=torch.float32):
        case = error_input.optimizer_error_input
        if "CONSTRUCTION" not in str(error_input.error_on):
            continue
        params = case.params
        if params is None:
            params = [random_tensor((3,), torch.float32, DEVICE).requires_grad_()]
        if issubclass(error_input.error_type, Warning):
            with pytest.warns(error_input.error_type, match=error_input.error_regex):
                FusedSGD(params, **case.kwargs)
        else:
            with pytest.raises(error_input.error_type, match=error_input.error_regex):
                FusedSGD(params, **case.kwargs)
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_optim_db_sparse_configuration_matches_torch(backend):
    """optim_db's sparse SGD configuration (and with momentum) on an embedding with sparse
    gradients beside a dense param: the sparse one takes torch's path, the dense one the
    kernels; both equal torch.optim.SGD's."""
    info = _sgd_optim_info()
    kwargs, _ = info.metadata_for_sparse
    for extra in ({}, {"momentum": 0.9}):
        _sparse_against_torch(backend, {**kwargs, **extra})


# ---------------------------------------------------------------------------------------------
# Sparse gradients: torch's own sparse path, never refused


def _sparse_against_torch(backend, options, steps=3):
    torch.manual_seed(torch.seed())
    embedding = torch.nn.Embedding(12, 3, sparse=True).to(DEVICE)
    dense = torch.nn.Parameter(random_tensor((4, 3), torch.float32, DEVICE))
    ref_embedding, ref_dense = copy.deepcopy(embedding), copy.deepcopy(dense)
    opt = FusedSGD([*embedding.parameters(), dense], backend=backend, **options)
    ref_opt = torch.optim.SGD([*ref_embedding.parameters(), ref_dense], foreach=False, **options)
    for _ in range(steps):
        index = torch.randint(0, 12, (5,), device=DEVICE)
        weights = random_tensor((5, 3), torch.float32, DEVICE)
        target = random_tensor((4, 3), torch.float32, DEVICE)
        for emb, d, o in ((embedding, dense, opt), (ref_embedding, ref_dense, ref_opt)):
            o.zero_grad()
            ((emb(index) * weights).sum() + (d * target).sum()).backward()
            assert emb.weight.grad.is_sparse
            o.step()
    assert_close(embedding.weight, ref_embedding.weight, terms=steps, msg=str(options))
    assert_close(dense, ref_dense, terms=steps, msg=str(options))
    for p, q in ((embedding.weight, ref_embedding.weight), (dense, ref_dense)):
        assert set(opt.state.get(p, {})) == set(ref_opt.state.get(q, {}))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sparse_gradients_take_torchs_sparse_path(backend, momentum):
    _sparse_against_torch(backend, {"lr": 0.1, "momentum": momentum})


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_gradients_under_a_grad_scaler(backend):
    """A sparse embedding keeps training under a GradScaler: its gradient unscaled, the step
    skipped where the scaled gradients overflowed, as torch.optim.SGD under its own scaler."""
    embedding = torch.nn.Embedding(10, 3, sparse=True).to(DEVICE)
    ref = copy.deepcopy(embedding)
    opt = FusedSGD(embedding.parameters(), lr=0.1, momentum=0.9, backend=backend)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    scalers = [torch.amp.GradScaler(DEVICE.type, init_scale=2.0**8) for _ in range(2)]
    for step, poison in enumerate([False, True, False]):
        index = torch.randint(0, 10, (4,), device=DEVICE)
        weights = random_tensor((4, 3), torch.float32, DEVICE)
        if poison:
            weights[0, 0] = float("inf")
        before = embedding.weight.detach().clone()
        for emb, o, scaler in ((embedding, opt, scalers[0]), (ref, ref_opt, scalers[1])):
            o.zero_grad()
            scaler.scale((emb(index) * weights).sum()).backward()
            scaler.step(o)
            scaler.update()
        if poison:
            assert torch.equal(embedding.weight, before), step
        assert_close(embedding.weight, ref.weight, terms=3, msg=f"step {step}")
    assert scalers[0].get_scale() == scalers[1].get_scale()


# ---------------------------------------------------------------------------------------------
# GradScaler: unscale in the kernel, skip on the device


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dampening", [0.0, 0.5])
def test_grad_scaler_skips_inf_steps_a_first_one_included(backend, dampening):
    """torch.amp.GradScaler on this device: the first step overflows (the momentum buffers'
    first step is skipped on the device: torch never starts them), then good and bad steps.
    Params, buffers, unscaled gradients and the scale equal torch.optim.SGD's under its own
    scaler (which skips the whole step after a host sync); the state_dict after the skipped
    first step has no momentum buffer, as torch's."""
    options = dict(lr=0.1, momentum=0.9, dampening=dampening, weight_decay=0.01)
    ours = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(7,), (3, 5)]]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedSGD(ours, backend=backend, **options)
    ref_opt = torch.optim.SGD(theirs, foreach=False, **options)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
    ref_scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
    for step, poison in enumerate([True, False, True, False, False]):
        before = [p.detach().clone() for p in ours]
        buffers = [_buffer(opt, p) for p in ours]
        buffers = [None if b is None else b.clone() for b in buffers]
        grads = [random_tensor(p.shape, torch.float32, DEVICE) for p in ours]
        for params, optimizer, grad_scaler in ((ours, opt, scaler), (theirs, ref_opt, ref_scaler)):
            for p, g in zip(params, grads):
                p.grad = grad_scaler.scale(g).clone()
            if poison:
                params[1].grad[1, 2] = float("inf")
            grad_scaler.step(optimizer)
            grad_scaler.update()
        if poison:  # skipped: params and buffers untouched
            for p, b in zip(ours, before):
                assert torch.equal(p, b)
            for p, b in zip(ours, buffers):
                assert b is None or torch.equal(_buffer(opt, p), b)
        if step == 0:
            assert opt.state_dict()["state"] == ref_opt.state_dict()["state"] == {}
        param_sum, buffer_sum = _term_sums(step + 1, 0.1, 0.9, 0.01)
        for p, q in zip(ours, theirs):
            assert_close(p, q, terms=4 * (step + 1), magnitude=param_sum, msg=f"step {step}")
            if not poison:
                assert_close(p.grad, q.grad, terms=1, magnitude=3, msg="unscaled grad")
        ours_saved, theirs_saved = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        assert ours_saved.keys() == theirs_saved.keys()
        for key, state in theirs_saved.items():
            assert_close(
                ours_saved[key]["momentum_buffer"], state["momentum_buffer"],
                terms=3 * (step + 1), magnitude=buffer_sum,
            )  # fmt: skip
    assert scaler.get_scale() == ref_scaler.get_scale()


@pytest.mark.parametrize("backend", BACKENDS)
def test_skipped_first_steps_are_followed_per_param(backend):
    """Two buffers whose first step a GradScaler skipped (dampening 0.5): then only the first
    param steps (its buffer starts: b = g), then both (the second's buffer starts only now, not
    as a continued zero buffer); equal to torch.optim.SGD under its own scaler."""
    options = dict(lr=0.1, momentum=0.9, dampening=0.5)
    ours = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(6,), (2, 3)]]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedSGD(ours, backend=backend, **options)
    ref_opt = torch.optim.SGD(theirs, foreach=False, **options)
    scalers = [torch.amp.GradScaler(DEVICE.type, init_scale=2.0**4) for _ in range(2)]
    for step, (which, poison) in enumerate([((0, 1), True), ((0,), False), ((0, 1), False)]):
        grads = [random_tensor(p.shape, torch.float32, DEVICE) for p in ours]
        for params, optimizer, scaler in ((ours, opt, scalers[0]), (theirs, ref_opt, scalers[1])):
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = scaler.scale(g).clone() if i in which else None
            if poison:
                params[0].grad[0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        saved, ref_saved = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        assert saved.keys() == ref_saved.keys(), step
        param_sum, buffer_sum = _term_sums(step + 1, 0.1, 0.9)
        for p, q in zip(ours, theirs):
            assert_close(p, q, terms=4 * (step + 1), magnitude=param_sum, msg=f"step {step}")
        for key, state in ref_saved.items():
            assert_close(
                saved[key]["momentum_buffer"], state["momentum_buffer"], terms=3 * (step + 1),
                magnitude=buffer_sum, msg=f"buffer {key} step {step}",
            )  # fmt: skip


class _HostSync(Exception):
    """A step read a tensor's value on the host."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_under_a_grad_scaler_never_waits_for_the_device(backend, monkeypatch):
    """No .item(), bool(tensor), float(tensor)... in a step under a GradScaler's grad_scale and
    found_inf, with a tensor lr, dampening and a first step skipped (on a GPU also: no
    synchronising CUDA call, torch.cuda.set_sync_debug_mode). The first two steps (state,
    pending flags and Triton's launch tables built on the host from host tensors, which on CPU
    the patch cannot tell apart) are not checked."""
    params = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(9,), (4, 5)]]
    lr = torch.tensor(0.1, device=DEVICE)
    opt = FusedSGD(params, lr=lr, momentum=0.9, dampening=0.5, backend=backend)
    opt.grad_scale = torch.tensor(4.0, device=DEVICE)
    for p in params:
        p.grad = random_tensor(p.shape, torch.float32, DEVICE)
    for found in (1.0, 0.0):  # a skipped first step, then one that goes through
        opt.found_inf = torch.tensor(found, device=DEVICE)
        opt.step()

    def refuse(name):
        def method(*args, **kwargs):
            raise _HostSync(f"Tensor.{name} during step")

        return method

    for p in params:  # new values in the same tensors (Triton's launch tables stay cached)
        p.grad.copy_(random_tensor(p.shape, torch.float32, DEVICE))
    before = [p.detach().clone() for p in params]
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
    assert not any(torch.equal(p, b) for p, b in zip(params, before))
    with monkeypatch.context() as patched:  # the check itself works
        patched.setattr(torch.Tensor, "item", refuse("item"))
        with pytest.raises(_HostSync):
            params[0].sum().item()


# ---------------------------------------------------------------------------------------------
# The kernels: one launch per (device, dtype) group, chunks and table refills, layouts


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_one_launch_per_device_and_dtype_group(backend, monkeypatch):
    """Two dtypes in two param groups: one kernel launch per (group, dtype), whatever the
    number of tensors (Triton: its kernel's launches; CUDA: calls of the extension's op)."""
    launches = []
    if backend == "triton":
        from fusedops.kernels.triton import sgd as kernels

        original = kernels._sgd_kernel

        class Counted:
            def __getitem__(self, grid):
                launches.append(grid)
                return original[grid]

        monkeypatch.setattr(kernels, "_sgd_kernel", Counted())
    else:
        from fusedops.kernels.cuda import sgd as kernels

        library = kernels.library

        class Library:
            def sgd_step(self, *args):
                launches.append(len(args[0]))
                return library().sgd_step(*args)

        monkeypatch.setattr(kernels, "library", Library)
    f32 = [random_tensor((n,), torch.float32, DEVICE).requires_grad_() for n in (3, 50, 7, 1)]
    bf16 = [random_tensor((n,), torch.bfloat16, DEVICE).requires_grad_() for n in (5, 9)]
    opt = FusedSGD(
        [{"params": f32 + bf16[:1]}, {"params": bf16[1:], "lr": 0.2}],
        lr=0.1, momentum=0.9, backend=backend,
    )  # fmt: skip
    for p in f32 + bf16:
        p.grad = random_tensor(p.shape, p.dtype, DEVICE)
    opt.step()
    assert len(launches) == 3  # group 1: fp32 and bf16; group 2: bf16


@pytest.mark.parametrize(("max_tensors", "max_chunks"), [(2, 3), (3, 1000), (1000, 2)])
def test_plan_tables_covers_every_chunk_once(max_tensors, max_chunks):
    triton_sgd = pytest.importorskip("fusedops.kernels.triton.sgd")
    sizes = torch.tensor([1, 700, 5, 1300, 64, 65])
    chunk = 64
    tables = triton_sgd.plan_tables(sizes, chunk, max_tensors, max_chunks)
    counts = (sizes + chunk - 1) // chunk
    assert tables[0][2] == 0 and tables[-1][3] == int(counts.sum())
    ends = torch.cumsum(counts, 0)
    for (first, last, start, stop), following in zip(tables, tables[1:] + [None]):
        assert 0 < stop - start <= max_chunks and 0 < last - first <= max_tensors
        assert int(ends[first - 1]) <= start if first else start == 0
        assert stop <= int(ends[last - 1])
        if following is not None:
            assert following[2] == stop


#: Keyword arguments of a backend's ``step`` (layout: fusedops.ops.sgd) for the kernel tests.
KERNEL_STEP_OPTIONS = dict(
    lr=0.05, lr_tensor=None, momentum=0.9, dampening=0.3, weight_decay=0.1, nesterov=False,
    maximize=True, grad_scale=None, found_inf=None,
)  # fmt: skip


def _kernel_lists(shapes, device, offset=0, dtype=torch.float32):
    """params, grads, momentum buffers (random), no masters, first flags alternating 1 and 0;
    ``offset``: each tensor a view that many elements into a buffer (misaligned)."""

    def make(shape):
        values = random_tensor(shape, dtype, device)
        buffer = torch.empty(values.numel() + 8, dtype=dtype, device=device)
        return buffer[offset : offset + values.numel()].view(shape).copy_(values)

    flags = [torch.tensor(float(i % 2), device=device) for i in range(len(shapes))]
    return [[make(s) for s in shapes], [make(s) for s in shapes], [make(s) for s in shapes], [],
            flags]  # fmt: skip


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_small_chunks_and_table_refills_match_reference(backend):
    """Many chunks per tensor and tables that fill up: a tensor's chunks continue in the next
    table. Triton: several iterations per chunk, tables of 2 tensors / 3 chunks / 1 tensor;
    CUDA: its fixed 40-tensor / 320-block tables, overrun by 46 tensors and a 391-chunk one."""
    from fusedops.ops.sgd import reference

    shapes = [(1,), (700,), (5,), (1300,), (64,), (65,)]
    if backend == "cuda":
        shapes += [(100_000,)] + [(37,)] * 40
    lists = _kernel_lists(shapes, DEVICE)
    expected = [[t.clone() for t in values] for values in lists]
    reference.step(*expected, **KERNEL_STEP_OPTIONS)
    if backend == "cuda":
        from fusedops.kernels.cuda import sgd as cuda_sgd

        runs = {"chunk 256": lambda got: cuda_sgd.step(*got, chunk=256, **KERNEL_STEP_OPTIONS)}
    else:
        from fusedops.kernels.triton import sgd as triton_sgd

        runs = {
            f"tables of {t} tensors, {c} chunks": (
                lambda got, t=t, c=c: triton_sgd.step(
                    *got, chunk=256, block=64, max_tensors=t, max_chunks=c, **KERNEL_STEP_OPTIONS
                )
            )
            for t, c in [(2, 3), (1000, 1), (1, 1000)]
        }
    magnitude = max(_term_sums(1, 0.05, 0.9, 0.1, nesterov=True))  # buffers start in [-3, 3]
    for label, run in runs.items():
        got = [[t.clone() for t in values] for values in lists]
        run(got)
        for name, mine, theirs in zip(["param", "grad", "buffer"], got, expected):
            for a, b in zip(mine, theirs):
                assert_close(a, b, terms=5, magnitude=magnitude, msg=f"{name} ({label})")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "offset-views"])
def test_vector_and_scalar_paths_match_reference(backend, dtype, aligned):
    """Tensors at 16-byte-aligned addresses take the kernels' vectorised loops (whole blocks,
    then a partial one); views one element into a buffer take the scalar loops. Both match the
    reference, with sizes that leave partial blocks and partial vectors, under grad_scale."""
    from fusedops.ops.sgd import reference

    shapes = [(1,), (7,), (1000,), (4099,), (2, 515)]
    lists = _kernel_lists(shapes, DEVICE, offset=0 if aligned else 1, dtype=dtype)
    options = dict(KERNEL_STEP_OPTIONS, nesterov=True, dampening=0.0)
    options["grad_scale"] = torch.tensor(4.0, device=DEVICE)
    options["found_inf"] = torch.tensor(0.0, device=DEVICE)
    expected = [[t.clone() for t in values] for values in lists]
    reference.step(*expected, **options)
    if backend == "cuda":
        from fusedops.kernels.cuda import sgd as cuda_sgd

        cuda_sgd.step(*lists, chunk=1024, **options)
    else:
        from fusedops.kernels.triton import sgd as triton_sgd

        tables = triton_sgd.build_tables(lists, 512, 1000, 1000)
        assert [table[3] for table in tables] == [aligned]
        triton_sgd.step(*lists, chunk=512, block=128, **options)
    magnitude = max(_term_sums(1, 0.05, 0.9, 0.1, nesterov=True))
    for name, mine, theirs in zip(["param", "grad", "buffer"], lists, expected):
        for a, b in zip(mine, theirs):
            assert_close(
                a, b, terms=5, magnitude=magnitude, msg=f"{name} ({dtype}, aligned={aligned})"
            )


@pytest.mark.skipif("triton" not in KERNEL_BACKENDS, reason="triton is not available here")
def test_triton_step_checks_its_lists():
    from fusedops.kernels.triton import sgd as triton_sgd

    good = _kernel_lists([(4, 6)], DEVICE)
    bad = [list(values) for values in good]
    bad[2] = [torch.zeros(6, 4, device=DEVICE).t()]  # transposed buffer
    with pytest.raises(ValueError, match=r"momentum_buffers\[0\] must have params\[0\]'s"):
        triton_sgd.step(*bad, **KERNEL_STEP_OPTIONS)
    bad = [list(values) for values in good]
    bad[1] = [bad[1][0].double()]
    with pytest.raises(TypeError, match=r"grads\[0\] is torch.float64"):
        triton_sgd.step(*bad, **KERNEL_STEP_OPTIONS)
    bad = [list(values) for values in good]
    bad[2] = []
    with pytest.raises(ValueError, match="momentum_buffers has 0 tensors"):
        triton_sgd.step(*bad, **KERNEL_STEP_OPTIONS)
    bad = [list(values) for values in good]
    bad[4] = [torch.ones(2, device=DEVICE)]
    with pytest.raises(ValueError, match="firsts must be one 1-element float32"):
        triton_sgd.step(*bad, **KERNEL_STEP_OPTIONS)


# ---------------------------------------------------------------------------------------------
# State dicts


def _train(opt, params, steps):
    for _ in range(steps):
        for p in params:
            p.grad = random_tensor(p.shape, p.dtype, p.device)
        opt.step()


@pytest.mark.parametrize("direction", ["torch->fused", "fused->torch"])
@pytest.mark.parametrize("dampening", [0.0, 0.2])
def test_state_dict_round_trip_continues_identically(direction, dampening):
    first_cls, second_cls = (
        (torch.optim.SGD, FusedSGD) if direction == "torch->fused" else (FusedSGD, torch.optim.SGD)
    )
    options = dict(lr=0.05, momentum=0.9, dampening=dampening, weight_decay=0.01)
    params = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(3, 4), (50,)]]
    first = first_cls(params, **options)
    _train(first, params, 3)
    saved = copy.deepcopy(first.state_dict())  # as saved to and loaded from a file
    assert set(saved["state"][0]) == {"momentum_buffer"}
    copies = [p.detach().clone().requires_grad_() for p in params]
    second = second_cls(copies, **options)
    second.load_state_dict(saved)
    torch.manual_seed(1)
    _train(first, params, 3)
    torch.manual_seed(1)
    _train(second, copies, 3)
    param_sum, buffer_sum = _term_sums(6, 0.05, 0.9, 0.01)
    for p, q in zip(copies, params):
        assert_close(p, q, terms=4 * 6, magnitude=param_sum)
        assert_close(second.state[p]["momentum_buffer"], first.state[q]["momentum_buffer"],
                     terms=3 * 6, magnitude=buffer_sum)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_replaced_between_steps_is_seen(backend):
    """The step's fast path (state checked once, then trusted) notices a cleared state (the
    buffers start again), a buffer replaced by hand and a param whose storage was swapped, as
    torch does."""
    options = dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01)
    params = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(3, 4), (50,)]]
    copies = [p.detach().clone().requires_grad_() for p in params]
    ours = FusedSGD(params, backend=backend, **options)
    theirs = torch.optim.SGD(copies, foreach=False, **options)
    edits = [None, None, "clear", None, "replace", None, "storage", None]
    for step, edit in enumerate(edits):
        replacement = random_tensor((3, 4), torch.float32, DEVICE)
        grads = [random_tensor(p.shape, torch.float32, DEVICE) for p in params]
        for opt, tensors in ((ours, params), (theirs, copies)):
            if edit == "clear":
                opt.state.clear()
            elif edit == "replace":
                opt.state[tensors[0]]["momentum_buffer"] = replacement.clone()
            elif edit == "storage":
                tensors[1].data = tensors[1].data.clone()
            for p, g in zip(tensors, grads):
                p.grad = g.clone()
            opt.step()
        param_sum, _ = _term_sums(step + 1, 0.05, 0.9, 0.01)
        for p, q in zip(params, copies):
            assert_close(p, q, terms=4 * (step + 1), magnitude=param_sum, msg=f"after {edit}")


def test_master_weights_state_dict_keeps_fp32_state():
    params = [random_tensor(s, torch.bfloat16, DEVICE).requires_grad_() for s in [(3, 4), (9,)]]
    opt = FusedSGD(params, lr=0.05, momentum=0.9, master_weights=True)
    _train(opt, params, 2)
    saved = copy.deepcopy(opt.state_dict())
    state = saved["state"][1]
    assert state["master_param"].dtype == state["momentum_buffer"].dtype == torch.float32
    copies = [p.detach().clone().requires_grad_() for p in params]
    restored = FusedSGD(copies, lr=0.05, momentum=0.9, master_weights=True)
    restored.load_state_dict(saved)
    for key in ("master_param", "momentum_buffer"):
        assert restored.state[copies[1]][key].dtype == torch.float32
        assert torch.equal(restored.state[copies[1]][key], state[key])
    torch.manual_seed(2)
    _train(opt, params, 2)
    torch.manual_seed(2)
    _train(restored, copies, 2)
    for p, q in zip(copies, params):
        assert torch.equal(p, q)


# ---------------------------------------------------------------------------------------------
# Params: empty, zero-size, complex, non-contiguous, several dtypes, fp64


def test_empty_parameter_list_raises_as_torch():
    for cls in (FusedSGD, torch.optim.SGD):
        with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
            cls([], lr=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_params_and_no_gradients(backend):
    """Only zero-size params: the step runs (nothing to update; torch's state: a buffer each);
    params without gradients are left alone and get no state."""
    ours = [random_tensor(s, torch.float32, DEVICE).requires_grad_() for s in [(0,), (3, 0)]]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedSGD(ours, lr=0.1, momentum=0.9, backend=backend)
    ref_opt = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    opt.step()  # no gradients: nothing happens
    assert not opt.state
    for p, q in zip(ours, theirs):
        p.grad = random_tensor(p.shape, torch.float32, DEVICE)
        q.grad = p.grad.clone()
    opt.step()
    ref_opt.step()
    for p, q in zip(ours, theirs):
        assert p.shape == q.shape and set(opt.state[p]) == set(ref_opt.state[q])


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_params_match_torch(backend):
    z = torch.complex(*(random_tensor((5, 3), torch.float32, DEVICE) for _ in range(2)))
    ours, theirs = [z.clone().requires_grad_()], [z.clone().requires_grad_()]
    options = dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)
    opt = FusedSGD(ours, backend=backend, **options)
    ref_opt = torch.optim.SGD(theirs, foreach=False, **options)
    for _ in range(3):
        g = torch.complex(*(random_tensor((5, 3), torch.float32, DEVICE) for _ in range(2)))
        ours[0].grad, theirs[0].grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    param_sum, buffer_sum = _term_sums(3, 0.05, 0.9, 0.1, nesterov=True)
    assert_close(
        torch.view_as_real(ours[0]), torch.view_as_real(theirs[0]), terms=12, magnitude=param_sum
    )
    buffer, ref_buffer = opt.state[ours[0]]["momentum_buffer"], ref_opt.state[theirs[0]]
    assert buffer.is_complex()
    assert_close(torch.view_as_real(buffer), torch.view_as_real(ref_buffer["momentum_buffer"]),
                 terms=9, magnitude=buffer_sum)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_params_match_torch(backend):
    base = random_tensor((6, 10), torch.float32, DEVICE)
    made = [
        lambda: base.clone().t(),  # dense, not contiguous: updated in place as a flat array
        lambda: base.clone()[:, ::2],  # gaps: goes through contiguous copies
        lambda: base.clone().to(memory_format=torch.contiguous_format)[1:],
    ]
    ours = [torch.nn.Parameter(make()) for make in made]
    theirs = [torch.nn.Parameter(make()) for make in made]
    opt = FusedSGD(ours, lr=0.05, momentum=0.9, dampening=0.1, backend=backend)
    ref_opt = torch.optim.SGD(theirs, lr=0.05, momentum=0.9, dampening=0.1, foreach=False)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            g = random_tensor(p.shape, torch.float32, DEVICE)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    param_sum, buffer_sum = _term_sums(3, 0.05, 0.9)
    for p, q in zip(ours, theirs):
        assert p.stride() == q.stride()
        assert_close(p, q, terms=12, magnitude=param_sum)
        assert_close(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"],
                     terms=9, magnitude=buffer_sum)  # fmt: skip


def test_float64_params_use_native_and_kernels_refuse_them():
    params = [random_tensor((9,), torch.float64, DEVICE).requires_grad_()]
    copies = [params[0].detach().clone().requires_grad_()]
    opt = FusedSGD(params, lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(copies, lr=0.1, momentum=0.9)
    for _ in range(2):
        params[0].grad = random_tensor((9,), torch.float64, DEVICE)
        copies[0].grad = params[0].grad.clone()
        opt.step()
        ref_opt.step()
    assert dispatch.last_used["sgd"] == "native"
    assert_close(params[0], copies[0], terms=8, magnitude=_term_sums(2, 0.1, 0.9)[0])
    if "triton" in BACKENDS:
        with pytest.raises(fusedops.BackendUnavailableError, match="float64"):
            FusedSGD(params, backend="triton").step()


@pytest.mark.parametrize("backend", BACKENDS)
def test_use_backend_is_honoured(backend):
    params = [random_tensor((4, 3), torch.float32, DEVICE).requires_grad_()]
    opt = FusedSGD(params, lr=0.1)
    with fusedops.use_backend(backend):
        _train(opt, params, 1)
    assert dispatch.last_used["sgd"] == backend


@pytest.mark.gpu
def test_params_on_the_host_and_the_gpu_under_one_scaler():
    """gpu-only: one FusedSGD over CPU and CUDA params (one step per device) driven by a CUDA
    GradScaler: the host params get the scaler's values in one blocking copy; results equal
    torch.optim.SGD's. (Two dtypes on one device, the same grouping, run everywhere in
    test_one_launch_per_device_and_dtype_group.)"""
    devices = ["cpu", "cuda", "cuda"]
    ours = [random_tensor((5,), torch.float32, d).requires_grad_() for d in devices]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt = FusedSGD(ours, lr=0.1, momentum=0.9, dampening=0.2)
    ref_opt = torch.optim.SGD(theirs, lr=0.1, momentum=0.9, dampening=0.2)
    scalers = [torch.amp.GradScaler("cuda", init_scale=4.0) for _ in range(2)]
    for step in range(3):
        grads = [random_tensor((5,), torch.float32, d) for d in devices]
        for params, o, scaler in ((ours, opt, scalers[0]), (theirs, ref_opt, scalers[1])):
            scale = scaler.scale(torch.ones((), device="cuda"))
            for p, g in zip(params, grads):
                p.grad = g * scale.to(p.device)
            scaler.step(o)
            scaler.update()
        param_sum, _ = _term_sums(step + 1, 0.1, 0.9)
        for p, q in zip(ours, theirs):
            assert_close(p, q, terms=4 * (step + 1), magnitude=param_sum, msg=f"step {step}")


# ---------------------------------------------------------------------------------------------
# Construction: torch's errors, foreach/fused accepted


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(lr=-1e-3), ValueError, "Invalid learning rate"),
        (dict(lr=torch.tensor([1e-3, 1e-3])), ValueError, "Tensor lr must be 1-element"),
        (dict(momentum=-0.5), ValueError, "Invalid momentum value"),
        (dict(weight_decay=-0.1), ValueError, "Invalid weight_decay value"),
        (dict(nesterov=True), ValueError, "Nesterov momentum requires a momentum"),
        (dict(nesterov=True, momentum=0.9, dampening=0.1), ValueError, "zero dampening"),
    ],
)
def test_bad_hyperparameters_raise_as_torch(options, error, match):
    for cls in (FusedSGD, torch.optim.SGD):
        with pytest.raises(error, match=match):
            cls([random_tensor((3,), torch.float32, DEVICE).requires_grad_()], **options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(differentiable=True), "does not support differentiable=True"),
        (dict(backend="cuda2"), "unknown backend 'cuda2'"),
    ],
)
def test_fused_options_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        FusedSGD([random_tensor((3,), torch.float32, DEVICE).requires_grad_()], **options)


def test_foreach_and_fused_are_accepted_and_ignored():
    params = [random_tensor((4,), torch.float32, DEVICE).requires_grad_()]
    opt = FusedSGD(params, lr=torch.tensor(0.01), momentum=0.5, foreach=True, fused=True)
    assert opt._step_supports_amp_scaling and isinstance(opt, torch.optim.SGD)
    _train(opt, params, 1)
    assert set(opt.state[params[0]]) == {"momentum_buffer"}


def test_opcheck_sgd_step_custom_op():
    params = [
        random_tensor((5,), torch.float32, DEVICE),
        random_tensor((3,), torch.float32, DEVICE),
    ]
    grads = [random_tensor(p.shape, torch.float32, DEVICE) for p in params]
    buffers = [random_tensor(p.shape, torch.float32, DEVICE) for p in params]
    firsts = [torch.tensor(float(i), device=DEVICE) for i in range(2)]
    args = (params, grads, buffers, [], firsts, 0.01, None, 0.9, 0.2, 0.1, False, True)
    args += (None, None, "reference")
    # Schema (mutation annotations) and fake kernel; aot_dispatch is left out (it compiles).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.fusedops.sgd_step.default, args, test_utils=utils)


# ---------------------------------------------------------------------------------------------
# Hooks and the syncfree names


@pytest.mark.usefixtures("restore_hooks")
def test_hook_replaces_torch_sgd_and_restores():
    original = torch.optim.SGD
    hooks.enable_fused_sgd()
    assert "sgd" in hooks.enabled()
    assert torch.optim.SGD is FusedSGD and sys.modules["torch.optim.sgd"].SGD is FusedSGD
    params = [random_tensor((3, 4), torch.float32, DEVICE).requires_grad_()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    assert type(opt) is FusedSGD and isinstance(opt, original)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _train(opt, params, 1)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.05
    hooks.disable_fused_sgd()
    assert torch.optim.SGD is original and sys.modules["torch.optim.sgd"].SGD is original
    assert FusedSGD.__mro__[1] is original


@pytest.mark.usefixtures("restore_hooks")
@pytest.mark.filterwarnings("ignore:fusedops hook")  # other hooks' notes on classes they skip
def test_fusedops_hooks_all_includes_sgd():
    assert "sgd" in hooks.enable_from_spec("all")
    assert torch.optim.SGD is FusedSGD


def test_syncfree_names_the_fused_optimizers():
    from fusedops.optim import syncfree

    assert syncfree.SGD is FusedSGD and fusedops.optim.syncfree is syncfree
    assert syncfree.Adam is FusedAdam and syncfree.AdamW is FusedAdamW
    assert syncfree.__all__ == ["Adam", "AdamW", "SGD"]
    assert "syncfree" in fusedops.optim.__all__ and "FusedSGD" in fusedops.optim.__all__
    for cls in (syncfree.Adam, syncfree.AdamW, syncfree.SGD):
        assert cls._step_supports_amp_scaling
    assert re.search(r"syncfree\.SGD is\s+fusedops\.optim\.FusedSGD", syncfree.__doc__)
    params = [random_tensor((2,), torch.float32, DEVICE).requires_grad_()]
    assert math.isclose(syncfree.SGD(params).defaults["lr"], 1e-3)

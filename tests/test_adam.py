"""FusedAdam / FusedAdamW against torch.optim.Adam / AdamW, every backend available here."""

import copy
import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import fusedops
from fusedops import dispatch, hooks
from fusedops.optim import FusedAdam, FusedAdamW
from fusedops.testing import assert_close
from tests.op_testing import BACKENDS, DEVICE, KERNEL_BACKENDS

PAIRS = {"adam": (FusedAdam, torch.optim.Adam), "adamw": (FusedAdamW, torch.optim.AdamW)}
#: Params of every rank, odd sizes (1, 7, 1000, 65537) and zero-size ones.
SHAPES = [(1,), (7,), (10, 100), (65537,), (2, 3, 1, 5), (3, 0), (0,)]
NO_GRAD = [(5,), (2, 2)]  # never get a gradient
SOMETIMES = (4, 4)  # gets a gradient on even steps only: its step count lags
STEPS = 20


def _params(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = SHAPES + NO_GRAD + [SOMETIMES]
    return [torch.randn(s, generator=generator).to(DEVICE, dtype).requires_grad_() for s in shapes]


def _set_grads(groups, step, generator, dtype):
    """The same random gradient for the i-th param of every list in ``groups``."""
    sometimes = len(SHAPES) + len(NO_GRAD)
    for i, params in enumerate(zip(*groups)):
        has_grad = i < len(SHAPES) or (i == sometimes and step % 2 == 0)
        grad = None
        if has_grad:
            grad = torch.randn(params[0].shape, generator=generator).to(DEVICE, dtype)
        for p in params:
            p.grad = None if grad is None else grad.to(p.dtype)


def _check_state(ours, theirs, opt, ref_opt, *, dtype, master, scale=1.0):
    for p, q in zip(ours, theirs):
        state, ref_state = opt.state.get(p, {}), ref_opt.state.get(q, {})
        assert set(ref_state) <= set(state), (set(ref_state), set(state))
        if not ref_state:
            continue
        assert float(state["step"]) == float(ref_state["step"])
        if master:
            assert_close(state["master_param"], q, dtype=torch.float32, scale=scale, msg="master")
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in ref_state:
                assert_close(state[key], ref_state[key], dtype=dtype, scale=scale, msg=key)


def _run_against_torch(backend, kind, precision, weight_decay, amsgrad, maximize, lr_tensor):
    fused_cls, torch_cls = PAIRS[kind]
    lr = torch.tensor(0.01) if lr_tensor else 0.01
    options = dict(weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    master = precision == "bf16-master"
    ours = _params(dtype)
    if precision == "bf16":
        # torch's fused Adam does the same per-element fp32 math with one rounding per store.
        theirs = [p.detach().clone().requires_grad_() for p in ours]
        reference_options = dict(fused=True)
    else:  # fp32, or the fp32 run that bf16 master weights must track
        theirs = [p.detach().to(torch.float32, copy=True).requires_grad_() for p in ours]
        reference_options = dict(foreach=False)
    reference_lr = lr.clone() if lr_tensor else lr
    opt = fused_cls(ours, lr=lr, master_weights=master, backend=backend, **options)
    ref_opt = torch_cls(theirs, lr=reference_lr, **options, **reference_options)
    generator = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        _set_grads([ours, theirs], step, generator, dtype)
        opt.step()
        ref_opt.step()
    assert dispatch.last_used["adam"] == backend
    param_dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    for p, q in zip(ours, theirs):
        assert p.dtype == dtype
        assert_close(p, q, dtype=param_dtype, scale=2.0, msg="param")
    _check_state(ours, theirs, opt, ref_opt, dtype=param_dtype, master=master, scale=2.0)
    for shape, p in zip(SHAPES + NO_GRAD, ours):
        if shape in NO_GRAD:
            assert p not in opt.state


#: Every combination; AdamW without weight decay is Adam, so that half is not repeated.
MATRIX = [
    combination
    for combination in itertools.product(
        ["adam", "adamw"], ["fp32", "bf16", "bf16-master"], [0.0, 0.01], [False, True],
        [False, True], [False, True],
    )
    if not (combination[0] == "adamw" and combination[2] == 0.0)
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "precision", "weight_decay", "amsgrad", "maximize", "lr_tensor"), MATRIX
)
def test_reference_matches_torch(kind, precision, weight_decay, amsgrad, maximize, lr_tensor):
    _run_against_torch("reference", kind, precision, weight_decay, amsgrad, maximize, lr_tensor)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize(
    ("kind", "precision", "weight_decay", "amsgrad", "maximize", "lr_tensor"), MATRIX
)
def test_kernel_matches_torch(backend, kind, precision, weight_decay, amsgrad, maximize, lr_tensor):
    _run_against_torch(backend, kind, precision, weight_decay, amsgrad, maximize, lr_tensor)


@pytest.mark.parametrize(
    ("kind", "precision", "weight_decay", "amsgrad", "maximize", "lr_tensor"),
    # torch's own fused step under each precision and kind, its options all off or all on
    [c for c in MATRIX if c[3] == c[4] == c[5]],
)
def test_native_matches_torch(kind, precision, weight_decay, amsgrad, maximize, lr_tensor):
    _run_against_torch("native", kind, precision, weight_decay, amsgrad, maximize, lr_tensor)


# ---------------------------------------------------------------------------------------------
# Multi-tensor apply: chunks and table refills


@pytest.mark.parametrize(("max_tensors", "max_chunks"), [(2, 3), (3, 1000), (1000, 2)])
def test_plan_tables_covers_every_chunk_once(max_tensors, max_chunks):
    triton_adam = pytest.importorskip("fusedops.kernels.triton.adam")
    sizes = torch.tensor([1, 700, 5, 1300, 64, 65])
    chunk = 64
    tables = triton_adam.plan_tables(sizes, chunk, max_tensors, max_chunks)
    counts = (sizes + chunk - 1) // chunk
    assert tables[0][2] == 0 and tables[-1][3] == int(counts.sum())
    ends = torch.cumsum(counts, 0)
    for (first, last, start, stop), following in zip(tables, tables[1:] + [None]):
        assert 0 < stop - start <= max_chunks and 0 < last - first <= max_tensors
        assert int(ends[first - 1]) <= start if first else start == 0
        assert stop <= int(ends[last - 1])
        if following is not None:
            assert following[2] == stop


#: Keyword arguments of a backend's ``step`` (layout: fusedops.ops.adam) for the kernel tests.
KERNEL_STEP_OPTIONS = dict(
    lr=0.01, lr_tensor=None, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
    amsgrad=False, maximize=False, decoupled=True, grad_scale=None, found_inf=None,
)  # fmt: skip


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_small_chunks_and_table_refills_match_reference(backend):
    """Many chunks per tensor and tables that fill up: a tensor's chunks continue in the next
    table. Triton: several iterations per chunk, tables of 2 tensors / 3 chunks / 1 tensor;
    CUDA: its fixed 32-tensor / 320-block tables, overrun by 46 tensors and a 391-chunk one."""
    from fusedops.ops.adam import reference

    generator = torch.Generator().manual_seed(3)
    shapes = [(1,), (700,), (5,), (1300,), (64,), (65,)]
    if backend == "cuda":
        shapes += [(100_000,)] + [(37,)] * 40
    make = lambda s: torch.randn(s, generator=generator, device="cpu").to(DEVICE)
    exp_avg_sqs = [make(s).abs() for s in shapes]
    lists = [
        [make(s) for s in shapes],  # params
        [make(s) for s in shapes],  # grads
        [make(s) for s in shapes],  # exp_avgs
        exp_avg_sqs,
        [t + 0.5 for t in exp_avg_sqs],  # max_exp_avg_sqs
        [],  # masters
        [torch.tensor(3.0, device=DEVICE) for _ in shapes],  # steps
    ]
    options = dict(KERNEL_STEP_OPTIONS, amsgrad=True)
    expected = [[t.clone() for t in values] for values in lists]
    reference.step(*expected, **options)
    if backend == "cuda":
        from fusedops.kernels.cuda import adam as cuda_adam

        runs = {"chunk 256": lambda got: cuda_adam.step(*got, chunk=256, **options)}
    else:
        from fusedops.kernels.triton import adam as triton_adam

        runs = {
            f"tables of {t} tensors, {c} chunks": (
                lambda got, t=t, c=c: triton_adam.step(
                    *got, chunk=256, block=64, max_tensors=t, max_chunks=c, **options
                )
            )
            for t, c in [(2, 3), (1000, 1), (1, 1000)]
        }
    for label, run in runs.items():
        got = [[t.clone() for t in values] for values in lists]
        run(got)
        for name, mine, theirs in zip(["param", "grad", "m", "v", "vmax"], got, expected):
            for a, b in zip(mine, theirs):
                assert_close(a, b, msg=f"{name} ({label})")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "offset-views"])
def test_vector_and_scalar_paths_match_reference(backend, dtype, aligned):
    """Tensors at 16-byte-aligned addresses take the kernels' vectorised loops (whole blocks,
    then a partial one); views one element into a buffer take the scalar loops. Both match the
    reference, with sizes that leave partial blocks and partial vectors."""
    from fusedops.ops.adam import reference

    generator = torch.Generator().manual_seed(5)
    shapes = [(1,), (7,), (1000,), (4099,), (2, 515)]
    offset = 0 if aligned else 1

    def make(shape, positive=False):
        values = torch.randn(shape, generator=generator, device="cpu")
        values = values.abs() if positive else values
        buffer = torch.empty(values.numel() + 8, dtype=dtype, device=DEVICE)
        view = buffer[offset : offset + values.numel()].view(shape)
        return view.copy_(values.to(DEVICE, dtype))

    lists = [
        [make(s) for s in shapes],
        [make(s) for s in shapes],
        [make(s) for s in shapes],
        [make(s, positive=True) for s in shapes],
        [],
        [],
        [torch.tensor(2.0, device=DEVICE) for _ in shapes],
    ]
    options = dict(KERNEL_STEP_OPTIONS, amsgrad=False)
    expected = [[t.clone() for t in values] for values in lists]
    reference.step(*expected, **options)
    if backend == "cuda":
        from fusedops.kernels.cuda import adam as cuda_adam

        cuda_adam.step(*lists, chunk=1024, **options)
    else:
        from fusedops.kernels.triton import adam as triton_adam

        tables = triton_adam.build_tables(lists, 512, 1000, 1000)
        assert [table[3] for table in tables] == [aligned]
        triton_adam.step(*lists, chunk=512, block=128, **options)
    for name, mine, theirs in zip(["param", "grad", "m", "v"], lists, expected):
        for a, b in zip(mine, theirs):
            assert_close(a, b, msg=f"{name} ({dtype}, {'aligned' if aligned else 'offset'})")


# ---------------------------------------------------------------------------------------------
# State dicts


def _train(opt, params, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator).to(DEVICE, p.dtype)
        opt.step()


def _model_params(dtype=torch.float32):
    generator = torch.Generator().manual_seed(5)
    return [
        torch.randn(s, generator=generator).to(DEVICE, dtype).requires_grad_()
        for s in [(3, 4), (1000,), (1,)]
    ]


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("direction", ["torch->fused", "fused->torch"])
def test_state_dict_round_trip_continues_identically(kind, direction):
    fused_cls, torch_cls = PAIRS[kind]
    first_cls, second_cls = (
        (torch_cls, fused_cls) if direction == "torch->fused" else (fused_cls, torch_cls)
    )
    options = dict(lr=0.01, weight_decay=0.01, amsgrad=True)
    params = _model_params()
    first = first_cls(params, **options)
    _train(first, params, 3, seed=0)
    saved = copy.deepcopy(first.state_dict())  # as saved to and loaded from a file
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}

    copies = [p.detach().clone().requires_grad_() for p in params]
    second = second_cls(copies, **options)
    second.load_state_dict(saved)
    if second_cls is fused_cls:
        assert second.state[copies[0]]["step"].device == copies[0].device
    _train(first, params, 3, seed=1)
    _train(second, copies, 3, seed=1)
    for p, q in zip(copies, params):
        assert_close(p, q)
        for key, value in first.state[q].items():
            assert_close(second.state[p][key].float(), value.float(), msg=key)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_replaced_between_steps_is_seen(backend):
    """The step's fast path (state checked once, then trusted) notices a cleared state, a
    state entry replaced by hand and a param whose storage was swapped, as torch does."""
    params = _model_params()
    copies = [p.detach().clone().requires_grad_() for p in params]
    ours = FusedAdam(params, lr=0.01, weight_decay=0.01, backend=backend)
    theirs = torch.optim.Adam(copies, lr=0.01, weight_decay=0.01, foreach=False)
    for step, edit in enumerate([None, None, "clear", None, "replace", None, "storage", None]):
        for opt, tensors in ((ours, params), (theirs, copies)):
            if edit == "clear":
                opt.state.clear()
            elif edit == "replace":
                state = opt.state[tensors[0]]
                state["exp_avg"] = torch.full_like(state["exp_avg"], 0.5)
            elif edit == "storage":
                tensors[1].data = tensors[1].data.clone()
        _train(ours, params, 1, seed=step)
        _train(theirs, copies, 1, seed=step)
        for p, q in zip(params, copies):
            assert_close(p, q, msg=f"after {edit} (step {step})")


@pytest.mark.parametrize("backend", BACKENDS)
def test_layout_change_between_steps_matches_torch(backend):
    """A channels_last param (so channels_last moments) made contiguous between steps: the
    step must not treat the old moments as flat arrays in the param's new layout."""
    generator = torch.Generator().manual_seed(9)
    start = torch.randn(2, 3, 4, 5, generator=generator, device="cpu").to(DEVICE)
    ours = start.to(memory_format=torch.channels_last).requires_grad_()
    theirs = ours.detach().clone(memory_format=torch.channels_last).requires_grad_()
    opt = FusedAdam([ours], lr=0.01, backend=backend)
    ref_opt = torch.optim.Adam([theirs], lr=0.01, foreach=False)
    for step in range(4):
        if step == 2:
            ours.data = ours.data.contiguous()
            theirs.data = theirs.data.contiguous()
        grad = torch.randn(start.shape, generator=generator, device="cpu").to(DEVICE)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt.step()
        ref_opt.step()
        assert_close(ours, theirs, msg=f"step {step}")


def test_replaced_state_is_not_kept_alive():
    """States dropped by state.clear() or load_state_dict are freed (the step's cache of
    checked states holds only what the last step used)."""
    import gc
    import weakref

    params = _model_params()
    opt = FusedAdam(params, lr=0.01, backend="reference")
    _train(opt, params, 2, seed=0)
    saved = copy.deepcopy(opt.state_dict())
    for drop in (lambda: opt.state.clear(), lambda: opt.load_state_dict(saved)):
        old = weakref.ref(opt.state[params[0]]["exp_avg"])
        drop()
        _train(opt, params, 1, seed=1)
        gc.collect()
        assert old() is None


@pytest.mark.skipif("triton" not in KERNEL_BACKENDS, reason="triton is not available here")
def test_triton_step_checks_its_lists():
    from fusedops.kernels.triton import adam as triton_adam

    def lists():
        p = torch.randn(4, 6, device=DEVICE)
        step = torch.tensor(1.0, device=DEVICE)
        return [[p], [torch.randn_like(p)], [torch.zeros_like(p)], [torch.zeros_like(p)], [],
                [], [step]]  # fmt: skip

    bad = lists()
    bad[2] = [torch.zeros(6, 4, device=DEVICE).t()]  # transposed exp_avg
    with pytest.raises(ValueError, match=r"exp_avgs\[0\] must have params\[0\]'s elements"):
        triton_adam.step(*bad, **KERNEL_STEP_OPTIONS)
    bad = lists()
    bad[1] = [bad[1][0].double()]
    with pytest.raises(TypeError, match=r"grads\[0\] is torch.float64"):
        triton_adam.step(*bad, **KERNEL_STEP_OPTIONS)
    bad = lists()
    bad[3] = []
    with pytest.raises(ValueError, match="exp_avg_sqs has 0 tensors"):
        triton_adam.step(*bad, **KERNEL_STEP_OPTIONS)


def test_master_weights_state_dict_keeps_fp32_state():
    params = _model_params(torch.bfloat16)
    opt = FusedAdamW(params, lr=0.01, master_weights=True)
    _train(opt, params, 2, seed=0)
    saved = copy.deepcopy(opt.state_dict())
    state = saved["state"][1]
    assert state["master_param"].dtype == torch.float32 and state["exp_avg"].dtype == torch.float32
    copies = [p.detach().clone().requires_grad_() for p in params]
    restored = FusedAdamW(copies, lr=0.01, master_weights=True)
    restored.load_state_dict(saved)
    for key in ("master_param", "exp_avg", "exp_avg_sq"):
        assert restored.state[copies[1]][key].dtype == torch.float32
        assert torch.equal(restored.state[copies[1]][key], state[key])
    _train(opt, params, 2, seed=1)
    _train(restored, copies, 2, seed=1)
    for p, q in zip(copies, params):
        assert torch.equal(p, q)


# ---------------------------------------------------------------------------------------------
# GradScaler: unscale in the kernel, skip on the device


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_scaler_unscales_and_skips_inf_steps_on_device(backend, monkeypatch):
    import fusedops.optim.adam as fused_adam

    seen = []
    original = fused_adam.adam_step

    def spy(*args, **kwargs):
        seen.append((kwargs["grad_scale"], kwargs["found_inf"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(fused_adam, "adam_step", spy)
    params = _model_params()
    copies = [p.detach().clone().requires_grad_() for p in params]
    opt = FusedAdam(params, lr=0.01, backend=backend)
    ref_opt = torch.optim.Adam(copies, lr=0.01, fused=True)
    device = DEVICE.type
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
    ref_scaler = torch.amp.GradScaler(device, init_scale=2.0**10)

    def scaled_step(values, optimizer, grad_scaler, poison):
        grads = [torch.randn(p.shape, generator=generator, device="cpu").to(DEVICE) for p in values]
        for p, g in zip(values, grads):
            p.grad = grad_scaler.scale(g).clone()
        if poison:
            values[1].grad[7] = float("inf")
        grad_scaler.step(optimizer)
        grad_scaler.update()

    for step, poison in enumerate([False, True, False]):
        before = [p.detach().clone() for p in params]
        state_before = {k: v.clone() for k, v in opt.state[params[0]].items()} if step else {}
        for values, optimizer, grad_scaler in (
            (params, opt, scaler),
            (copies, ref_opt, ref_scaler),
        ):
            generator = torch.Generator().manual_seed(step)
            scaled_step(values, optimizer, grad_scaler, poison)
        grad_scale, found_inf = seen[-1]
        assert grad_scale is not None and found_inf is not None
        if poison:  # skipped: params, moments and step untouched
            assert float(found_inf) == 1.0
            for p, b in zip(params, before):
                assert torch.equal(p, b)
            for key, value in opt.state[params[0]].items():
                assert torch.equal(value, state_before[key]), key
            assert float(opt.state[params[0]]["step"]) == 1.0
        for p, q in zip(params, copies):
            assert_close(p, q)
            assert_close(p.grad, q.grad, msg="unscaled grad")
    assert float(opt.state[params[0]]["step"]) == 2.0
    assert scaler.get_scale() == ref_scaler.get_scale()


# ---------------------------------------------------------------------------------------------
# Backend choice, layouts, complex params


@pytest.mark.parametrize("backend", BACKENDS)
def test_use_backend_is_honoured(backend):
    params = _model_params()
    opt = FusedAdam(params)
    with fusedops.use_backend(backend):
        _train(opt, params, 1, seed=0)
    assert dispatch.last_used["adam"] == backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_params_match_torch(backend):
    generator = torch.Generator().manual_seed(7)
    base = torch.randn(6, 10, generator=generator, device="cpu").to(DEVICE)
    made = [
        lambda: base.clone().t(),  # dense, not contiguous: updated in place as a flat array
        lambda: base.clone()[:, ::2],  # gaps: goes through contiguous copies
        lambda: base.clone().to(memory_format=torch.contiguous_format)[1:],
    ]
    ours = [torch.nn.Parameter(make()) for make in made]
    theirs = [torch.nn.Parameter(make()) for make in made]
    opt = FusedAdamW(ours, lr=0.01, backend=backend)
    ref_opt = torch.optim.AdamW(theirs, lr=0.01, foreach=False)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            g = torch.randn(p.shape, generator=generator, device="cpu").to(DEVICE)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, theirs):
        assert p.stride() == q.stride()
        assert_close(p, q)
        assert_close(opt.state[p]["exp_avg"], ref_opt.state[q]["exp_avg"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_params_match_torch(backend):
    generator = torch.Generator().manual_seed(8)
    z = torch.randn(5, 3, dtype=torch.complex64, generator=generator, device="cpu").to(DEVICE)
    ours, theirs = [z.clone().requires_grad_()], [z.clone().requires_grad_()]
    opt = FusedAdam(ours, lr=0.01, weight_decay=0.1, amsgrad=True, backend=backend)
    ref_opt = torch.optim.Adam(theirs, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=False)
    for _ in range(3):
        g = torch.randn(5, 3, dtype=torch.complex64, generator=generator, device="cpu").to(DEVICE)
        ours[0].grad, theirs[0].grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    assert_close(torch.view_as_real(ours[0]), torch.view_as_real(theirs[0]))


def test_float64_params_use_native_and_kernels_refuse_them():
    params = [torch.randn(9, dtype=torch.float64, device=DEVICE).requires_grad_()]
    copies = [params[0].detach().clone().requires_grad_()]
    opt, ref_opt = FusedAdam(params, lr=0.1), torch.optim.Adam(copies, lr=0.1)
    for _ in range(2):
        params[0].grad = copies[0].grad = torch.ones(9, dtype=torch.float64, device=DEVICE)
        opt.step()
        ref_opt.step()
    assert dispatch.last_used["adam"] == "native"
    assert_close(params[0], copies[0])
    if "triton" in BACKENDS:
        with pytest.raises(fusedops.BackendUnavailableError, match="float64"):
            FusedAdam(params, backend="triton").step()


# ---------------------------------------------------------------------------------------------
# Bad inputs: torch's own errors


@pytest.mark.parametrize("cls", [FusedAdam, FusedAdamW])
@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(lr=-1e-3), ValueError, "Invalid learning rate"),
        (dict(lr=torch.tensor([1e-3, 1e-3])), ValueError, "Tensor lr must be 1-element"),
        (dict(eps=-1e-8), ValueError, "Invalid epsilon value"),
        (dict(betas=(1.0, 0.999)), ValueError, "Invalid beta parameter at index 0"),
        (dict(betas=(-0.1, 0.999)), ValueError, "Invalid beta parameter at index 0"),
        (dict(betas=(0.9, 1.0)), ValueError, "Invalid beta parameter at index 1"),
        (dict(weight_decay=-0.1), ValueError, "Invalid weight_decay value"),
        (dict(differentiable=True), ValueError, "does not support differentiable=True"),
        (dict(backend="cuda2"), ValueError, "unknown backend 'cuda2'"),
    ],
)
def test_bad_hyperparameters(cls, options, error, match):
    with pytest.raises(error, match=match):
        cls([torch.zeros(3, requires_grad=True)], **options)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_gradient_raises_like_torch(backend):
    embedding = torch.nn.Embedding(10, 3, sparse=True).to(DEVICE)
    embedding(torch.tensor([1, 2], device=DEVICE)).sum().backward()
    for opt in (
        FusedAdam(embedding.parameters(), backend=backend),
        torch.optim.Adam(embedding.parameters()),
    ):
        with pytest.raises(RuntimeError, match="does not support sparse gradients"):
            opt.step()


def test_foreach_and_fused_are_accepted_and_ignored():
    params = _model_params()
    opt = FusedAdam(params, lr=torch.tensor(0.01), foreach=True, fused=True, capturable=True)
    _train(opt, params, 1, seed=0)
    assert float(opt.state[params[0]]["step"]) == 1.0


# ---------------------------------------------------------------------------------------------
# Hooks


@pytest.fixture
def _restore_hooks():
    yield
    hooks.disable_fused_adam()
    hooks.disable_fused_adamw()


@pytest.mark.usefixtures("_restore_hooks")
def test_hooks_replace_torch_adam_and_adamw_and_restore():
    original_adam, original_adamw = torch.optim.Adam, torch.optim.AdamW
    hooks.enable_fused_adam()
    hooks.enable_fused_adamw()
    assert {"adam", "adamw"} <= set(hooks.enabled())
    assert torch.optim.Adam is FusedAdam and sys.modules["torch.optim.adam"].Adam is FusedAdam
    assert torch.optim.AdamW is FusedAdamW and sys.modules["torch.optim.adamw"].AdamW is FusedAdamW
    params = _model_params()
    opt = torch.optim.Adam(params, lr=0.1)
    assert type(opt) is FusedAdam and isinstance(opt, original_adam)
    assert isinstance(torch.optim.AdamW(params), original_adamw)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _train(opt, params, 1, seed=0)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.05
    hooks.disable_fused_adam()
    hooks.disable_fused_adamw()
    assert torch.optim.Adam is original_adam and torch.optim.AdamW is original_adamw
    assert sys.modules["torch.optim.adam"].Adam is original_adam
    assert FusedAdam.__mro__[2] is original_adam and FusedAdamW.__mro__[2] is original_adamw


@pytest.mark.usefixtures("_restore_hooks")
def test_enable_fused_adam_replaces_adam_and_adamw():
    """TorchAcc's ``hooks.enable_fused_adam()`` ("Adam/AdamW"): both classes, in both places
    torch exposes each; report() lists the four; disable restores both."""
    original_adam, original_adamw = torch.optim.Adam, torch.optim.AdamW
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hooks.enable_fused_adam()
    assert "adam" in hooks.enabled() and "adamw" not in hooks.enabled()
    assert torch.optim.Adam is FusedAdam and sys.modules["torch.optim.adam"].Adam is FusedAdam
    assert torch.optim.AdamW is FusedAdamW and sys.modules["torch.optim.adamw"].AdamW is FusedAdamW
    report = hooks.report()
    for where in ("torch.optim.Adam", "torch.optim.adam.Adam"):
        assert f"  patched {where}\n" in report
    for where in ("torch.optim.AdamW", "torch.optim.adamw.AdamW"):
        assert f"  patched {where}" in report
    assert hooks.state()["adam"]["patched"] == [
        "torch.optim.Adam",
        "torch.optim.adam.Adam",
        "torch.optim.AdamW",
        "torch.optim.adamw.AdamW",
    ]
    params = _model_params()
    assert type(torch.optim.AdamW(params, lr=0.1)) is FusedAdamW
    hooks.disable_fused_adam()
    assert torch.optim.Adam is original_adam and torch.optim.AdamW is original_adamw
    assert sys.modules["torch.optim.adamw"].AdamW is original_adamw
    # FUSEDOPS_HOOKS=adam names the same hook
    assert hooks.enable_from_spec("adam") == ["adam"]
    assert torch.optim.AdamW is FusedAdamW and torch.optim.Adam is FusedAdam


@pytest.mark.usefixtures("_restore_hooks")
@pytest.mark.parametrize("first", ["adam", "adamw"])
def test_adam_and_adamw_hooks_hold_adamw_together(first):
    """Both hooks on (either order, no warning): AdamW stays fused until the last of them is
    disabled; enable_fused_adamw alone leaves Adam as it is."""
    original_adam, original_adamw = torch.optim.Adam, torch.optim.AdamW
    switches = {
        "adam": (hooks.enable_fused_adam, hooks.disable_fused_adam),
        "adamw": (hooks.enable_fused_adamw, hooks.disable_fused_adamw),
    }
    second = "adamw" if first == "adam" else "adam"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        switches[first][0]()
        assert torch.optim.Adam is (FusedAdam if first == "adam" else original_adam)
        switches[second][0]()
    assert torch.optim.Adam is FusedAdam and torch.optim.AdamW is FusedAdamW
    assert hooks.state()["adamw"]["patched"] == ["torch.optim.AdamW", "torch.optim.adamw.AdamW"]
    switches[first][1]()
    assert torch.optim.AdamW is FusedAdamW and sys.modules["torch.optim.adamw"].AdamW is FusedAdamW
    assert torch.optim.Adam is (original_adam if first == "adam" else FusedAdam)
    switches[second][1]()
    assert torch.optim.Adam is original_adam and torch.optim.AdamW is original_adamw
    assert sys.modules["torch.optim.adamw"].AdamW is original_adamw


def test_enable_fused_adam_before_torch_import_patches_adamw_too():
    code = (
        "import sys\n"
        "from fusedops import hooks\n"
        "hooks.enable_fused_adam()\n"
        "assert 'torch' not in sys.modules\n"
        "from torch.optim import Adam, AdamW\n"
        "print(Adam.__name__, Adam.__module__, AdamW.__name__, AdamW.__module__)\n"
    )
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "FUSEDOPS_HOOKS": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "FusedAdam",
        "fusedops.optim.adam",
        "FusedAdamW",
        "fusedops.optim.adam",
    ]


def test_hook_enabled_before_torch_import_patches_from_imports():
    code = (
        "import sys\n"
        "from fusedops import hooks\n"
        "hooks.enable_fused_adam(); hooks.enable_fused_adamw()\n"
        "assert 'torch' not in sys.modules\n"
        "from torch.optim import Adam, AdamW\n"
        "import torch\n"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
        "opt = AdamW([p], lr=0.1); opt.step()\n"
        "print(Adam.__module__, type(opt).__name__, isinstance(opt, Adam.__mro__[2]))\n"
        # a re-import while torch.optim.Adam is patched still subclasses torch's own class
        "import importlib, fusedops.optim.adam as m\n"
        "importlib.reload(m)\n"
        "print([c.__module__ for c in m.FusedAdam.__mro__[1:3]])\n"
    )
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "FUSEDOPS_HOOKS": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["fusedops.optim.adam", "FusedAdamW", "True"]
    assert lines[1] == "['fusedops.optim.adam', 'torch.optim.adam']"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("master", [False, True])
def test_float16_params_match_torch(backend, master):
    generator = torch.Generator().manual_seed(9)
    ours = [
        torch.randn(s, generator=generator, device="cpu").to(DEVICE, torch.float16)
        for s in [(7,), (300,)]
    ]
    if master:  # the fp32 run that the master copies track
        theirs = [p.to(torch.float32, copy=True) for p in ours]
        ref_opt = torch.optim.Adam(theirs, lr=0.01, amsgrad=True, weight_decay=0.01)
    else:  # torch's fused Adam: the same per-element fp32 math, one rounding per store
        theirs = [p.clone() for p in ours]
        ref_opt = torch.optim.Adam(theirs, lr=0.01, amsgrad=True, weight_decay=0.01, fused=True)
    opt = FusedAdam(
        ours, lr=0.01, amsgrad=True, weight_decay=0.01, master_weights=master, backend=backend
    )
    for _ in range(5):
        for p, q in zip(ours, theirs):
            g = torch.randn(p.shape, generator=generator, device="cpu").to(DEVICE, torch.float16)
            p.grad, q.grad = g, g.to(q.dtype, copy=True)
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, theirs):
        assert p.dtype == torch.float16
        assert_close(p, q, dtype=torch.float16)
        state, ref_state = opt.state[p], ref_opt.state[q]
        if master:
            assert_close(state["master_param"], q)
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert_close(state[key], ref_state[key], dtype=torch.float16, msg=key)


def test_opcheck_adam_step_custom_op():
    make = lambda: [torch.randn(5, device=DEVICE), torch.randn(3, device=DEVICE)]
    params, grads = make(), make()
    moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    steps = [torch.tensor(0.0, device=DEVICE) for _ in params]
    args = (params, grads, *moments, [], [], steps, 0.01, None, 0.9, 0.999, 1e-8, 0.0)
    args += (False, False, False, None, None, None, "reference")
    # Schema (mutation annotations) and fake kernel; aot_dispatch is left out (it compiles).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.fusedops.adam_step.default, args, test_utils=utils)

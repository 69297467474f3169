"""Op contract 5: every ``fusedops::`` op has an XLA lowering, and the lowering matches the op.

The ops are discovered, not listed: every op in the ``fusedops`` namespace after
``fusedops.ops.load_all()``. Each forward op runs under ``partial_trace(fullgraph=True)`` on
sample inputs (one XLA program forward, one backward where the op is differentiable, so its
``<name>_backward`` op is lowered too) and is compared with the eager op, outputs and gradients.
Sample inputs come from ``SAMPLES`` below or from a ``samples(name)`` function beside the op's
lowering in ``fusedops/xla/fused/<op>.py`` (a list of argument tuples for forward op
``name``);
a new op without either fails ``test_every_forward_op_has_samples``.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from fusedops.testing import assert_close, device_under_test, random_tensor

pytest.importorskip("jax")

from fusedops import ops as fusedops_ops  # noqa: E402
from fusedops.xla import lower, partial_trace, xla_trace  # noqa: E402

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
#: where the module and optimizer tests run: CUDA where there is one (eager then runs fusedops'
#: CUDA/Triton kernels, the programs their lowerings), else the CPU
DEVICE = device_under_test()


def _namespace_ops() -> dict[str, object]:
    """name (``layer_norm``, ``adam_step``...) -> OpOverload of every ``fusedops::`` op."""
    fusedops_ops.load_all()
    found = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "fusedops":
            continue
        name, _, overload = rest.partition(".")
        found[rest] = getattr(getattr(torch.ops.fusedops, name), overload or "default")
    return found


OPS = _namespace_ops()
BACKWARD_OPS = {n for n in OPS if n.endswith("_backward") and n[: -len("_backward")] in OPS}
MUTATING = {n for n, op in OPS.items() if op in lower.MUTATES}
FORWARD_OPS = sorted(set(OPS) - BACKWARD_OPS - MUTATING)


def R(*shape, dtype=F32):
    return random_tensor(shape, dtype)


def _norm_samples(rms: bool) -> list[tuple]:
    """(x rows, weight, [bias,] eps) in the layouts the public functions pass."""
    cases = [
        (R(6, 33), R(33), R(33)),  # N not a power of two
        (R(1, 8), R(8), None),  # one row, no bias
        (R(5, 16), None, None),  # no affine
        (R(4, 24, dtype=BF16), R(24), R(24)),  # bf16 x with fp32 parameters (autocast)
        (R(3, 10, dtype=F16), R(10, dtype=F16), R(10, dtype=F16)),
        (R(3, 12, dtype=F64), R(12, dtype=F64), R(12, dtype=F64)),
    ]
    if rms:
        variants = [  # transformers' LlamaRMSNorm / T5LayerNorm rounding (out_dtype, xhat_dtype)
            (R(4, 24, dtype=BF16), R(24), 1e-6, None, F32, BF16),
            (R(3, 16, dtype=BF16), R(16, dtype=BF16), 1e-6, None, BF16, BF16),
            (R(3, 16, dtype=F16), R(16), 1e-6, None, F32, None),
        ]
        return [(x, w, 1e-6) for x, w, _ in cases] + variants
    return [(x, w, b, 1e-5) for x, w, b in cases]


#: forward op name -> builder of a list of argument tuples
SAMPLES = {
    "quick_gelu": lambda: [(R(4, 9),), (R(7, dtype=BF16),), (R(2, 3, 5, dtype=F64),)],
    "layer_norm": lambda: _norm_samples(rms=False),
    "rms_norm": lambda: _norm_samples(rms=True),
}


def _samples(name: str):
    if name in SAMPLES:
        return SAMPLES[name]
    module = importlib.import_module(lower.LOWERINGS[OPS[name]].__module__)
    samples = getattr(module, "samples", None)
    return None if samples is None else (lambda: samples(name))


def test_every_fusedops_op_has_a_lowering():
    assert {"quick_gelu", "layer_norm", "rms_norm", "adam_step"} <= set(OPS)
    missing = sorted(n for n, op in OPS.items() if op not in lower.LOWERINGS)
    assert not missing, f"fusedops ops without an XLA lowering (xla/fused/<op>.py): {missing}"


def test_every_forward_op_has_samples():
    missing = [n for n in FORWARD_OPS if _samples(n) is None]
    assert not missing, (
        f"no sample inputs for {missing}: add them to SAMPLES here or a samples(name) function "
        "beside the lowering in fusedops/xla/fused/<op>.py"
    )


def _float_leaves(args):
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]


def _outputs(out) -> list:
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,))]


def _run(op, args, differentiable: bool, traced: bool):
    """Outputs and (when differentiable) gradients of the float tensor arguments under a fixed
    random cotangent, eager or through ``partial_trace(fullgraph=True)``."""
    positions = _float_leaves(args) if differentiable else []
    leaves = [
        a.detach().clone().requires_grad_(True) if i in positions else a for i, a in enumerate(args)
    ]
    tensor_at = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]

    def call(*tensors):
        full = list(leaves)
        for i, t in zip(tensor_at, tensors):
            full[i] = t
        return op(*full)

    fn = partial_trace(call, fullgraph=True) if traced else call
    outs = _outputs(fn(*[leaves[i] for i in tensor_at]))
    grads = []
    if positions:
        torch.manual_seed(1234)
        pairs = [
            (o, torch.randn_like(o))
            for o in outs
            if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
        ]
        loss = sum((o * c).sum() for o, c in pairs)
        grads = torch.autograd.grad(loss, [leaves[i] for i in positions], allow_unused=True)
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads, fn


def _compare(actual, expected, msg):
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, msg
        return
    assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} != {expected.dtype}"
    if expected.is_floating_point():
        assert_close(actual, expected, scale=4.0, msg=msg)
    else:
        assert torch.equal(actual, expected), msg


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_op_lowers_into_one_program_per_direction_and_matches_eager(name):
    build = _samples(name)
    assert build is not None, f"no samples for fusedops::{name}"
    op = OPS[name]
    backward = OPS.get(f"{name}_backward")
    for k, args in enumerate(build()):
        torch._dynamo.reset()
        want_out, want_grads, _ = _run(op, args, backward is not None, traced=False)
        got_out, got_grads, traced = _run(op, args, backward is not None, traced=True)
        for i, (g, w) in enumerate(zip(got_out, want_out)):
            _compare(g, w, f"{name} sample {k} output {i}")
        for i, (g, w) in enumerate(zip(got_grads, want_grads)):
            if w is None:
                assert g is None
            else:
                _compare(g, w, f"{name} sample {k} grad {i}")
        stats = traced.stats
        assert not stats.eager_ops
        assert stats.programs == (2 if want_grads else 1), stats
        if want_grads:
            ran = {
                node.target for p in stats.compiled for node in p.gm.graph.nodes
            }  # every op the programs ran
            assert backward in ran, f"{name}'s backward op did not run inside the program"


# ------------------------------------------------------------------------------ adam_step (mutates)
def _adam_lists(n_params: int, dtype, *, amsgrad=False, masters=False):
    params = [R(3, 5, dtype=dtype), R(7, dtype=dtype), R(0, dtype=dtype)][:n_params]
    moment = F32 if masters else dtype
    grads = [R(*p.shape, dtype=dtype) for p in params]
    exp_avgs = [R(*p.shape, dtype=moment) for p in params]
    exp_avg_sqs = [R(*p.shape, dtype=moment).abs() for p in params]
    max_sqs = [s + R(*s.shape, dtype=moment).abs() for s in exp_avg_sqs] if amsgrad else []
    master = [p.float() + 0.01 for p in params] if masters else []
    steps = [torch.tensor(float(i + 2)) for i in range(len(params))]
    return [params, grads, exp_avgs, exp_avg_sqs, max_sqs, master, steps]


ADAM_CASES = {
    "adamw": ({}, {"weight_decay": 0.1, "decoupled": True}),
    "adam-l2-amsgrad-maximize": (
        {"amsgrad": True},
        {"weight_decay": 0.05, "amsgrad": True, "maximize": True},
    ),
    "bf16-master-weights-lr-tensor": (
        {"masters": True, "dtype": BF16},
        {"lr": torch.tensor([0.02]), "weight_decay": 0.1, "decoupled": True},
    ),
    "grad-scale-found-inf": (
        {},
        {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(1.0)},
    ),
    "grad-scale-no-inf": (
        {"dtype": F16},
        {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(0.0)},
    ),
    "clip-coef-grad-scale": (
        {"amsgrad": True},
        {"amsgrad": True, "grad_scale": torch.tensor(4.0), "clip_coef": torch.tensor(0.3)},
    ),
}


@pytest.mark.parametrize("case", list(ADAM_CASES))
def test_adam_step_lowering_matches_the_op(case):
    from fusedops.ops.adam import adam_step

    list_options, options = ADAM_CASES[case]
    dtype = list_options.pop("dtype", F32) if "dtype" in list_options else F32
    lists = _adam_lists(3, dtype, **list_options)
    options = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.0, **options}
    expected = copy.deepcopy(lists)
    adam_step(*expected, **options)

    @partial_trace(fullgraph=True)
    def step(*flat):
        adam_step(*flat, **options)

    step(*lists)
    assert step.stats.programs == 1 and not step.stats.eager_ops
    for got_list, want_list in zip(lists, expected):
        for got, want in zip(got_list, want_list):
            _compare(got, want, f"adam_step {case}")


# ------------------------------------------------------------------- xla_trace with FusedAdam(W)
def _sum_step(x, *, net, opt):
    """A training step on the sum of the model's output (fp32); returns the loss."""
    loss = net(x).float().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize(
    ("cls", "dtype", "options"),
    [
        ("FusedAdamW", F32, {"weight_decay": 0.1, "amsgrad": True}),
        ("FusedAdam", F32, {"weight_decay": 0.05}),
        ("FusedAdamW", BF16, {"weight_decay": 0.1, "master_weights": True}),
        ("FusedAdamW", F32, {"weight_decay": 0.1, "max_grad_norm": 0.5}),
        ("FusedAdam", BF16, {"master_weights": True, "max_grad_norm": 0.5, "norm_type": "inf"}),
    ],
)
@pytest.mark.usefixtures("no_tf32")
def test_xla_trace_with_fused_adam_matches_eager(cls, dtype, options):
    """Parameters, optimizer state (FusedAdam's layout, master copies included) after three
    steps on DEVICE. The loss is linear in the parameters and the batch one row, so bf16
    gradients are exact and the two updates differ by fp32 rounding only. With max_grad_norm
    the gradients (norms of about 3 and more) are clipped inside the traced step as in eager's."""
    if options.get("norm_type") == "inf":
        options = {**options, "norm_type": float("inf")}
    from fusedops import optim

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4).to(DEVICE, dtype)
    ref = copy.deepcopy(model)
    opt = getattr(optim, cls)(model.parameters(), lr=0.05, **options)
    ref_opt = getattr(optim, cls)(ref.parameters(), lr=0.05, **options)

    train_step = xla_trace(_sum_step)

    for _ in range(3):
        x = random_tensor((1, 6), dtype, DEVICE)
        train_step(x, net=model, opt=opt)
        ref(x).float().sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert train_step.programs == 1
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device.type == DEVICE.type
        _compare(p.detach(), q.detach(), name)
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert state.keys() == ref_state.keys()
        for key in ref_state:
            _compare(state[key], ref_state[key], f"{name} {key}")


def test_xla_trace_refuses_a_grad_scaler_driven_fused_adam():
    from fusedops.optim import FusedAdamW
    from fusedops.xla import XLATraceError

    model = torch.nn.Linear(3, 2)
    opt = FusedAdamW(model.parameters())
    opt.grad_scale, opt.found_inf = torch.tensor(2.0), torch.tensor(0.0)

    @xla_trace
    def train_step(x, *, net, opt):
        net(x).sum().backward()
        opt.step()

    with pytest.raises(XLATraceError, match="GradScaler"):
        train_step(R(2, 3), net=model, opt=opt)


# ----------------------------------------------------------------- hooked modules: one program
@pytest.mark.usefixtures("no_tf32")
def test_fused_modules_give_one_program_per_direction():
    """A block built from fusedops.nn modules (LayerNorm, RMSNorm, QuickGELU) on DEVICE under
    partial_trace(fullgraph=True): one forward and one backward program, eager's results."""
    from fusedops import nn as fnn

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 64), fnn.LayerNorm(64), fnn.QuickGELU(), fnn.RMSNorm(64),
        torch.nn.Linear(64, 3),
    ).to(DEVICE)  # fmt: skip
    ref = copy.deepcopy(model)
    traced = partial_trace(model, fullgraph=True)
    x = random_tensor((4, 5, 8), device=DEVICE)
    out = traced(x)
    out.square().sum().backward()
    expected = ref(x)
    expected.square().sum().backward()
    assert traced.stats.programs == 2 and not traced.stats.eager_ops
    assert out.device == x.device
    assert_close(out, expected, scale=4.0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, scale=8.0, msg=name)


def test_xla_trace_with_fused_adamw_on_complex_parameters():
    """FusedAdamW updates a complex parameter's real and imaginary parts independently."""
    from fusedops.optim import FusedAdamW

    class Rotator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5, dtype=torch.complex64))

        def forward(self, z):
            return (self.w * z).abs().sum()

    model = Rotator()
    ref = copy.deepcopy(model)
    opt = FusedAdamW(model.parameters(), lr=0.1)
    # the eager oracle: the reference step, whose math the XLA lowering of adam_step mirrors
    ref_opt = FusedAdamW(ref.parameters(), lr=0.1, backend="reference")

    train_step = xla_trace(_sum_step)

    for _ in range(2):
        z = torch.randn(5, dtype=torch.complex64)
        train_step(z, net=model, opt=opt)
        ref(z).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    torch.testing.assert_close(model.w.detach(), ref.w.detach(), rtol=1e-5, atol=1e-6)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(opt.state[model.w][key], ref_opt.state[ref.w][key])

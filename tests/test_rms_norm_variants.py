"""The RMSNorm variants of model libraries (fusedops/integrations/transformers/rms_norm_variants.py)
against the real transformers classes, every backend available here, forward and backward.

Each fused class must return the original class's dtype with its rounding points (xhat rounded
to x's dtype before the weight multiply in LlamaRMSNorm, to the weight's dtype in T5LayerNorm),
and agree with the original computed in float64.
"""

import copy
import importlib
import math

import pytest
import torch

import fusedops
from fusedops._env import triton_interpreter
from fusedops.integrations.transformers import rms_norm_variants
from fusedops.testing import TOLERANCES, assert_close, random_tensor
from tests.op_testing import BACKENDS, DEVICE, KERNEL_BACKENDS
from tests.test_layer_norm import _force_looped

pytest.importorskip("transformers")

_M = "transformers.models."

#: case -> (module, class, constructor kwargs, variant)
CLASSES = {
    "llama": (_M + "llama.modeling_llama", "LlamaRMSNorm", {}, "llama"),
    "llama4": (_M + "llama4.modeling_llama4", "Llama4TextRMSNorm", {}, "llama"),
    "t5": (_M + "t5.modeling_t5", "T5LayerNorm", {}, "t5"),
    "olmo2": (_M + "olmo2.modeling_olmo2", "Olmo2RMSNorm", {}, "fp32_weight"),
    "gemma3n_no_scale": (
        _M + "gemma3n.modeling_gemma3n",
        "Gemma3nRMSNorm",
        {"with_scale": False},
        "fp32_weight",
    ),
    "falcon_mamba_weightless": (
        _M + "falcon_mamba.modeling_falcon_mamba",
        "FalconMambaWeightlessRMSNorm",
        {},
        "unweighted",
    ),
    "gemma": (_M + "gemma.modeling_gemma", "GemmaRMSNorm", {}, "gemma"),
}
#: (x dtype, weight dtype)
DTYPES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32),
]
HIDDEN = 40


def _original_class(case):
    module, name, _, _ = CLASSES[case]
    return getattr(importlib.import_module(module), name)


def _pair(case, weight_dtype, hidden=HIDDEN):
    """(original module, fused module) of width ``hidden`` with the same random parameters in
    weight_dtype."""
    _, _, kwargs, variant = CLASSES[case]
    cls = _original_class(case)
    original = cls(hidden, **kwargs).to(DEVICE)
    with torch.no_grad():
        for p in original.parameters():
            p.copy_(random_tensor(p.shape, device=DEVICE, low=0.5, high=1.5))
    original.to(weight_dtype)
    fused = cls(hidden, **kwargs).to(DEVICE).to(weight_dtype)
    fused.load_state_dict(original.state_dict())
    fused.__class__ = rms_norm_variants.fused_subclass(cls, variant)
    return original, fused


def _rounding_dtype(case, x_dtype, weight_dtype):
    """The coarsest dtype the original rounds to on its way to the output (None: none)."""
    variant = CLASSES[case][3]
    if variant == "llama" and x_dtype != torch.float32:
        return x_dtype
    if variant == "t5" and weight_dtype in (torch.float16, torch.bfloat16):
        return weight_dtype
    return None


def _coarsest(*dtypes):
    return max((d for d in dtypes if d is not None), key=lambda d: torch.finfo(d).eps)


def _grads(module, x, grad):
    x = x.detach().clone().requires_grad_()
    module.zero_grad()
    y = module(x)
    y.backward(grad.to(y.dtype))
    weight = getattr(module, "weight", None)
    dweight = weight.grad if isinstance(weight, torch.nn.Parameter) else None
    return y, x.grad, dweight


def _float64(original, x, grad):
    """The original class on float64 parameters and input (no rounding to bf16/fp16 left; the
    classes that cast to fp32 keep that cast): y, dx, dweight."""
    return _grads(copy.deepcopy(original).double(), x.double(), grad.double())


def _same_rounding_fraction(actual, expected):
    """Fraction of elements equal within the fp32 tolerance: near 1 when the rounding points
    are the original's, near 0 when an fp32 output skipped a rounding to bf16/fp16."""
    rtol, atol = TOLERANCES[torch.float32]
    close = torch.isclose(actual.double(), expected.double(), rtol=rtol, atol=atol)
    return close.double().mean().item()


def _eps(module) -> float:
    return module.__dict__.get("variance_epsilon", getattr(module, "eps", None))


def _error_scales(case, module, x, grad):
    """Tolerance scales of (dx, dweight) as in test_layer_norm: dx is a difference of terms of
    size |g| * rstd, g = grad * (the weight the norm multiplies by); dweight sums M products."""
    rows = x.detach().double().reshape(-1, HIDDEN)
    rstd = torch.rsqrt(rows.square().mean(dim=1, keepdim=True) + _eps(module))
    g = grad.double().reshape(rows.shape).abs()
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.nn.Parameter):
        scale = 1 + weight.detach().double() if CLASSES[case][3] == "gemma" else weight.double()
        g = g * scale.abs()
    return max(1.0, (g * rstd).max().item() / 3.0), max(1.0, math.sqrt(rows.shape[0]) / 2.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("x_dtype", "weight_dtype"), DTYPES)
@pytest.mark.parametrize("case", list(CLASSES))
def test_variant_matches_the_original_class(case, x_dtype, weight_dtype, backend):
    original, fused = _pair(case, weight_dtype)
    x = random_tensor((3, 5, HIDDEN), x_dtype, DEVICE)
    y_original = original(x)
    grad = random_tensor(y_original.shape, y_original.dtype, DEVICE)
    with fusedops.dispatch.use_backend(backend):
        y, dx, dweight = _grads(fused, x, grad)
    y64, dx64, dweight64 = _float64(original, x, grad)

    assert y.dtype == y_original.dtype and dx.dtype == x_dtype
    rounding = _rounding_dtype(case, x_dtype, weight_dtype)
    assert_close(y, y_original, dtype=_coarsest(y.dtype, rounding), msg="vs original")
    if rounding is not None and torch.finfo(rounding).eps > torch.finfo(y.dtype).eps:
        # an output finer than a rounding point inside: the rounding must be the original's
        assert _same_rounding_fraction(y, y_original) > 0.99
    assert_close(y, y64, dtype=_coarsest(y.dtype, rounding), msg="vs float64")

    dx_scale, _ = _error_scales(case, fused, x, grad)
    assert_close(dx, dx64, scale=dx_scale, msg="dx")
    if dweight64 is None:
        assert dweight is None
    else:
        assert dweight.dtype == weight_dtype
        tolerance_dtype = _coarsest(weight_dtype, rounding, x_dtype)
        # dweight sums one product dy * xhat per row, each xhat rounded (up to the coarsest
        # dtype): the error bound scales with sum |dy * xhat| per element, not with |dweight|
        # (which cancels), over the rows summed
        rows = x.detach().double().reshape(-1, HIDDEN)
        xhat = rows * torch.rsqrt(rows.square().mean(dim=1, keepdim=True) + _eps(fused))
        magnitude = (grad.double().reshape(rows.shape) * xhat).abs().sum(dim=0)
        assert_close(
            dweight, dweight64, dtype=tolerance_dtype, terms=rows.shape[0],
            magnitude=magnitude.view(dweight64.shape), msg="dweight",
        )  # fmt: skip


def test_the_rounding_check_can_fail():
    """Plain RMSNorm (no rounding of xhat) is not LlamaRMSNorm for a bf16 x and an fp32 weight:
    the check used above tells them apart."""
    original, _ = _pair("llama", torch.float32)
    x = random_tensor((3, 5, HIDDEN), torch.bfloat16, DEVICE)
    plain = fusedops.rms_norm(
        x, (HIDDEN,), original.weight, original.variance_epsilon, out_dtype=torch.float32
    )
    assert _same_rounding_fraction(plain, original(x)) < 0.5


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("case", ["llama", "t5"])
def test_variant_on_the_looped_path(monkeypatch, case, backend):
    """Rows longer than the register threshold (lowered to 32 < HIDDEN) take the kernels'
    looped path."""
    _force_looped(monkeypatch, backend)
    weight_dtype = torch.bfloat16 if case == "t5" else torch.float32
    original, fused = _pair(case, weight_dtype)
    x = random_tensor((7, HIDDEN), torch.float32 if case == "t5" else torch.bfloat16, DEVICE)
    grad = random_tensor(x.shape, original(x).dtype, DEVICE)
    with fusedops.dispatch.use_backend(backend):
        y, dx, dweight = _grads(fused, x, grad)
    y_original, dx_original, dweight_original = _grads(original, x, grad)
    assert y.dtype == y_original.dtype
    assert_close(y, y_original, dtype=torch.bfloat16)
    assert_close(dx, dx_original, dtype=torch.bfloat16, scale=4)
    assert_close(dweight, dweight_original, dtype=torch.bfloat16, scale=2)


@pytest.mark.parametrize("case", list(CLASSES))
def test_fused_class_keeps_the_original_interface(case):
    _, _, kwargs, variant = CLASSES[case]
    cls = _original_class(case)
    fused_cls = rms_norm_variants.fused_subclass(cls, variant)
    assert issubclass(fused_cls, cls) and fused_cls is not cls
    assert (fused_cls.__name__, fused_cls.__module__) == (cls.__name__, cls.__module__)
    assert rms_norm_variants.fused_subclass(cls, variant) is fused_cls
    assert rms_norm_variants.fused_subclass(fused_cls, variant) is fused_cls
    original, fused = cls(HIDDEN, **kwargs), fused_cls(HIDDEN, **kwargs)
    assert list(fused.state_dict()) == list(original.state_dict())
    assert repr(fused) == repr(original)
    eps_names = {"variance_epsilon", "eps"} & set(original.__dict__)
    assert eps_names and all(fused.__dict__[n] == original.__dict__[n] for n in eps_names)


def test_unknown_variant():
    with pytest.raises(ValueError, match="variant must be one of"):
        rms_norm_variants.fused_subclass(_original_class("llama"), "nope")


@pytest.mark.parametrize("name", ["out_dtype", "xhat_dtype"])
def test_bad_dtype_arguments_name_the_argument(name):
    x = torch.ones(2, 4)
    with pytest.raises(TypeError, match=f"{name} must be a torch.dtype"):
        fusedops.rms_norm(x, 4, **{name: "float32"})
    with pytest.raises(ValueError, match=f"{name} must be a floating dtype"):
        fusedops.rms_norm(x, 4, **{name: torch.int32})


def test_opcheck_with_out_and_xhat_dtypes():
    x = random_tensor((3, 10), torch.bfloat16, DEVICE).requires_grad_()
    w = random_tensor((10,), torch.float32, DEVICE).requires_grad_()
    args = (x, w, 1e-6, None, torch.float32, torch.bfloat16)
    torch.library.opcheck(torch.ops.fusedops.rms_norm.default, args)
    y, rstd = torch.ops.fusedops.rms_norm(x.detach(), w.detach(), *args[2:])
    assert y.dtype == torch.float32
    dy = random_tensor(y.shape, torch.float32, DEVICE)
    torch.library.opcheck(
        torch.ops.fusedops.rms_norm_backward.default,
        (dy, x.detach(), w.detach(), rstd, None, torch.bfloat16),
    )


def test_torch_compile_and_export_of_a_fused_llama_norm():
    original, fused = _pair("llama", torch.float32)
    x = random_tensor((2, 3, HIDDEN), torch.bfloat16, DEVICE)
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert fused.weight.grad is not None and out.dtype == torch.float32
    assert_close(out, original(x), dtype=torch.bfloat16)
    exported = torch.export.export(fused, (x,))
    assert "fusedops.rms_norm" in str(exported.graph)
    assert torch.equal(exported.module()(x), fused(x))


# Triton's CPU interpreter casts fp32 to bf16 by truncation (measured: half of all casts differ
# from torch's round-to-nearest-even), so its bf16 rounding points are checked on a GPU only.
ROUNDING_CASES = [
    (backend, x_dtype, weight_dtype)
    for backend in BACKENDS
    for x_dtype, weight_dtype in [*DTYPES, (torch.float16, torch.bfloat16)]
    if not (backend == "triton" and triton_interpreter())
    or torch.bfloat16 not in (x_dtype, weight_dtype)
]


@pytest.mark.parametrize(("backend", "x_dtype", "weight_dtype"), ROUNDING_CASES, ids=str)
@pytest.mark.parametrize("case", ["llama", "t5"])
def test_backends_give_the_same_bits_as_the_original_rounding(backend, case, x_dtype, weight_dtype):
    """Every backend rounds as torch does (to nearest even): the output equals the original
    class's wherever rstd agrees, on a wide input (the modules built for its width, 1024;
    512 rows on a GPU, 32 on the CPU)."""
    original, fused = _pair(case, weight_dtype, hidden=1024)
    x = random_tensor((512 if DEVICE.type == "cuda" else 32, 1024), x_dtype, DEVICE)
    expected = original(x)
    with fusedops.dispatch.use_backend(backend):
        y = fused(x)
    assert y.dtype == expected.dtype
    assert _same_rounding_fraction(y, expected) > 0.99

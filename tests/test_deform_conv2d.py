"""deform_conv2d (DCNv1/DCNv2) against a float64 oracle written here from the definition, every
backend available, forward and the five gradients (input, offset, mask, weight, bias).

The oracle is a plain loop over (image, offset group, kernel point, output pixel) sampling one
group's channels bilinearly with torchvision's corner rules; its gradients come from autograd
through that loop (``floor`` contributes nothing, so d/dy of the fraction is 1), so a sample at
exactly y = -1 or x = -1, outside like every sample the forward reads as 0, has offset gradient
0 (torchvision's kernels give the one-sided derivative into the image there, pytorch/vision#6885:
native corrects it, the border tests check it). Shapes are tiny: Triton runs under the CPU
interpreter here. Tolerances: ``fusedops.testing``'s per-dtype table scaled by the number of
terms each result sums.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import fusedops
from fusedops.testing import (
    assert_close,
    backends_under_test,
    cuda_include_dir,
    host_library,
    poisoned_outputs,
    random_tensor,
)
from tests.op_testing import DEVICE, KERNEL_BACKENDS

BACKENDS = backends_under_test()
F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16


# ------------------------------------------------------------------------------------ oracle
def _bilinear(img, y, x):
    """img (Cg, H, W) float64 sampled at scalar tensors (y, x): 0 outside (-1, H) x (-1, W),
    else the corners inside the image weighted bilinearly."""
    _, h, w = img.shape
    yf, xf = float(y.detach()), float(x.detach())
    if yf <= -1 or yf >= h or xf <= -1 or xf >= w:
        return img.new_zeros(img.shape[0])
    y0, x0 = math.floor(yf), math.floor(xf)
    fy, fx = y - y0, x - x0
    total = img.new_zeros(img.shape[0])
    for yy, wy in ((y0, 1 - fy), (y0 + 1, fy)):
        for xx, wx in ((x0, 1 - fx), (x0 + 1, fx)):
            if 0 <= yy < h and 0 <= xx < w:
                total = total + wy * wx * img[:, yy, xx]
    return total


def oracle(input, offset, weight, bias, stride, padding, dilation, mask):
    """The definition, in float64 with loops; differentiable through autograd."""
    b, cin, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    h_out, w_out = offset.shape[2:]
    groups = offset.shape[1] // (2 * kh * kw)
    cg = cin // groups
    columns = []  # per image: (C_in, kh, kw, H_out, W_out)
    for n in range(b):
        per_group = []
        for g in range(groups):
            points = []
            for i in range(kh):
                for j in range(kw):
                    k = g * kh * kw + i * kw + j
                    pixels = []
                    for oy in range(h_out):
                        for ox in range(w_out):
                            y = oy * sh - ph + i * dh + offset[n, 2 * k, oy, ox]
                            x = ox * sw - pw + j * dw + offset[n, 2 * k + 1, oy, ox]
                            v = _bilinear(input[n, g * cg : (g + 1) * cg], y, x)
                            if mask is not None:
                                v = v * mask[n, k, oy, ox]
                            pixels.append(v)
                    points.append(torch.stack(pixels, dim=-1))  # (Cg, L)
            per_group.append(torch.stack(points, dim=1))  # (Cg, K, L)
        columns.append(torch.cat(per_group, dim=0))  # (C_in, K, L)
    cols = torch.stack(columns)  # (B, C_in, K, L)
    wg = cin // cin_g
    cols = cols.reshape(b, wg, cin_g * kh * kw, h_out * w_out)
    wmat = weight.reshape(wg, cout // wg, cin_g * kh * kw)
    out = torch.einsum("gok,bgkl->bgol", wmat, cols).reshape(b, cout, h_out, w_out)
    if bias is not None:
        out = out + bias[:, None, None]
    return out


# ------------------------------------------------------------------------------------ cases
# (B, C_in, H, W, C_out, (kh, kw), stride, padding, dilation, offset groups, weight groups,
#  mask, bias, offset range, dtype)
CASES = [
    (2, 4, 5, 6, 3, (3, 3), 1, 1, 1, 1, 1, True, True, 2.0, F32),  # rectangular, DCNv2
    (1, 4, 6, 5, 4, (3, 2), (2, 1), (1, 0), (1, 2), 2, 2, True, False, 1.5, F32),
    (2, 2, 4, 4, 2, (1, 1), 1, 0, 1, 1, 1, False, True, 1.0, F32),  # 1x1 kernel, DCNv1
    (1, 6, 5, 4, 6, (2, 2), 2, 2, 2, 3, 3, True, True, 4.0, F32),  # samples far outside
    (1, 4, 4, 5, 2, (3, 3), 1, 1, 1, 2, 1, True, True, 1.0, F16),
    (1, 4, 5, 4, 4, (3, 3), 1, 1, 1, 1, 2, False, True, 1.0, BF16),
    (1, 2, 4, 4, 2, (2, 2), 1, 0, 1, 1, 1, True, True, 2.0, F64),
]


def _case_id(case):
    b, cin, h, w, cout, k, s, p, d, g, wg, m, bias, r, dtype = case
    return (
        f"B{b}-C{cin}-{h}x{w}-O{cout}-k{k[0]}x{k[1]}-s{s}-p{p}-d{d}-G{g}-wg{wg}"
        f"-{'mask' if m else 'nomask'}-{'bias' if bias else 'nobias'}-{str(dtype)[6:]}"
    )


def _pair(v):
    return (v, v) if isinstance(v, int) else v


def _inputs(case):
    b, cin, h, w, cout, (kh, kw), s, p, d, g, wg, has_mask, has_bias, spread, dtype = case
    s, p, d = _pair(s), _pair(p), _pair(d)
    h_out = (h + 2 * p[0] - (d[0] * (kh - 1) + 1)) // s[0] + 1
    w_out = (w + 2 * p[1] - (d[1] * (kw - 1) + 1)) // s[1] + 1

    def r(shape, low=-1.0, high=1.0):
        return random_tensor(shape, dtype, DEVICE, low=low, high=high)

    offset = r((b, 2 * g * kh * kw, h_out, w_out), -spread, spread)
    # a few samples exactly on the edges (-1, 0, H-1, integer offsets) where the corner rules bite
    offset.view(-1)[::7] = offset.view(-1)[::7].round()
    tensors = {
        "input": r((b, cin, h, w)),
        "offset": offset,
        "weight": r((cout, cin // wg, kh, kw)),
        "bias": r((cout,)) if has_bias else None,
        "mask": r((b, g * kh * kw, h_out, w_out), 0.0, 1.0) if has_mask else None,
    }
    return tensors, {"stride": s, "padding": p, "dilation": d}


def _terms(case) -> dict[str, float]:
    """How many products each result sums (the tolerance scale for a 16/32-bit result)."""
    b, cin, h, w, cout, (kh, kw), _, _, _, g, wg, *_ = case
    per_output = cin // wg * kh * kw
    return {
        "out": per_output,
        "input": cout // wg * kh * kw * 4,
        "offset": cout // wg * cin // g * 4,
        "mask": cout // wg * cin // g,
        "weight": b * h * w,
        "bias": b * h * w,
    }


def _run(tensors, geometry, backend, deterministic=None):
    leaves = {
        k: (v.detach().clone().requires_grad_() if v is not None else None)
        for k, v in tensors.items()
    }
    out = fusedops.deform_conv2d(
        leaves["input"],
        leaves["offset"],
        leaves["weight"],
        leaves["bias"],
        mask=leaves["mask"],
        backend=backend,
        deterministic=deterministic,
        **geometry,
    )
    return out, leaves


def _expected(tensors, geometry, dout):
    leaves = {
        k: (v.detach().double().requires_grad_() if v is not None else None)
        for k, v in tensors.items()
    }
    out = oracle(
        leaves["input"],
        leaves["offset"],
        leaves["weight"],
        leaves["bias"],
        geometry["stride"],
        geometry["padding"],
        geometry["dilation"],
        leaves["mask"],
    )
    out.backward(dout.double())
    return out, leaves


#: (case, backend): fp64 runs on the reference and native backends only (test_kernels_refuse_fp64)
PAIRS = [
    pytest.param(case, backend, id=f"{_case_id(case)}-{backend}")
    for case in CASES
    for backend in BACKENDS
    if case[-1] != F64 or backend not in KERNEL_BACKENDS
]


@pytest.mark.parametrize(("case", "backend"), PAIRS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_matches_oracle(case, backend, deterministic):
    _check_against_oracle(case, *_inputs(case), backend, deterministic)


def _check_against_oracle(case, tensors, geometry, backend, deterministic):
    """Forward and the five gradients of ``backend`` on ``tensors`` against the oracle."""
    dtype = case[-1]
    with poisoned_outputs():
        out, leaves = _run(tensors, geometry, backend, deterministic)
        dout = random_tensor(out.shape, dtype, DEVICE, low=-1.0, high=1.0)
        out.backward(dout)
    want, want_leaves = _expected(tensors, geometry, dout)
    terms = _terms(case)
    assert out.dtype == dtype and out.device == tensors["input"].device
    assert_close(out, want, scale=terms["out"], msg="output")
    for name, leaf in leaves.items():
        if leaf is None:
            continue
        assert leaf.grad is not None, f"no gradient for {name}"
        assert leaf.grad.dtype == leaf.dtype
        assert_close(leaf.grad, want_leaves[name].grad, scale=terms[name], msg=f"grad {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_input_gradient_is_bitwise_repeatable(backend):
    """Many samples landing on few pixels (large offsets): two deterministic backward passes
    give identical bits, and match the atomic pass within tolerance."""
    case = (2, 4, 4, 4, 4, (3, 3), 1, 1, 1, 2, 1, True, True, 3.0, F32)
    tensors, geometry = _inputs(case)
    dout = random_tensor((2, 4, 4, 4), F32, DEVICE)
    grads = []
    for deterministic in (True, True, False):
        out, leaves = _run(tensors, geometry, backend, deterministic)
        out.backward(dout)
        grads.append(leaves["input"].grad)
    assert torch.equal(grads[0], grads[1])
    assert_close(grads[2], grads[0], scale=_terms(case)["input"])
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    # deterministic=None follows torch's flag. warn_only: on CUDA torch would otherwise refuse
    # the cuBLAS products unless CUBLAS_WORKSPACE_CONFIG is set (one stream: same bits per run).
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out, leaves = _run(tensors, geometry, backend)
            out.backward(dout)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    assert torch.equal(leaves["input"].grad, grads[0])


def _sample_coordinates(case, offset):
    """The test's own (y, x) of every sample, each (B, G, K, H_out, W_out) float64."""
    b, cin, h, w, cout, (kh, kw), s, p, d, g, *_ = case
    (sh, sw), (ph, pw), (dh, dw) = _pair(s), _pair(p), _pair(d)
    h_out, w_out = offset.shape[2:]
    off = offset.detach().double().reshape(b, g, kh * kw, 2, h_out, w_out)
    dev = offset.device
    i = torch.arange(kh, device=dev).repeat_interleave(kw)  # kernel point k = i * kw + j
    j = torch.arange(kw, device=dev).repeat(kh)
    oy = torch.arange(h_out, device=dev)
    ox = torch.arange(w_out, device=dev)
    base_y = (oy[None, :, None] * sh - ph + i[:, None, None] * dh).double()  # (K, H_out, 1)
    base_x = (ox[None, None, :] * sw - pw + j[:, None, None] * dw).double()  # (K, 1, W_out)
    return base_y + off[:, :, :, 0], base_x + off[:, :, :, 1]


#: cases for _border_inputs
BORDER_CASES = [
    (2, 4, 4, 5, 3, (3, 3), 1, 1, 1, 2, 1, True, True, 2.0, F32),
    (1, 2, 5, 4, 2, (2, 3), 1, (0, 1), 1, 1, 1, False, False, 2.0, F64),
]


def _border_inputs(case):
    """``_inputs`` with integer offsets in [-2, 2]: many samples exactly on -1, 0, H - 1 and H
    (and so for x), at least one at y = -1 and one at x = -1 with the other coordinate inside."""
    tensors, geometry = _inputs(case)
    offset = tensors["offset"]
    h, w = case[2], case[3]
    # a small case's draw can miss one of the two border samples (seed 6103): draw again
    for _ in range(100):
        drawn = torch.randint(-2, 3, offset.shape, device=offset.device).to(offset.dtype)
        y, x = _sample_coordinates(case, drawn)
        if ((y == -1) & (x > -1) & (x < w)).any() and ((x == -1) & (y > -1) & (y < h)).any():
            tensors["offset"] = drawn
            return tensors, geometry
    raise AssertionError(f"100 offset draws put no sample at y = -1 and at x = -1 ({case})")


@pytest.mark.parametrize(
    ("case", "backend"),
    [
        pytest.param(case, backend, id=f"{_case_id(case)}-{backend}")
        for case in BORDER_CASES
        for backend in BACKENDS
        if case[-1] != F64 or backend not in KERNEL_BACKENDS
    ],
)
def test_offset_gradient_of_samples_on_the_border(case, backend):
    """A sample at exactly y = -1 or x = -1 is outside (the forward reads 0 there), so its offset
    gradient is 0 on every backend, as the oracle's; torchvision's kernels give the one-sided
    derivative into the image there (native must not). Samples at 0, H - 1, H likewise."""
    _check_against_oracle(case, *_border_inputs(case), backend, None)


class _TorchvisionStandIn(torch.autograd.Function):
    """``torch.ops.torchvision.deform_conv2d``'s signature over the reference, with a backward
    whose offset gradient is junk (nonzero) for every sample outside the image: native must
    keep torchvision's gradients inside and give the op's 0 outside."""

    backward_calls = 0

    @staticmethod
    def forward(ctx, input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, wg, g, use_mask):
        impl = importlib.import_module("fusedops.ops.deform_conv2d").reference
        geometry = ((sh, sw), (ph, pw), (dh, dw))
        ctx.save_for_backward(input, weight, offset, mask, bias)
        ctx.geometry, ctx.use_mask = geometry, use_mask
        return impl.forward(input, offset, mask if use_mask else None, weight, bias, *geometry)

    @staticmethod
    def backward(ctx, grad):
        _TorchvisionStandIn.backward_calls += 1
        impl = importlib.import_module("fusedops.ops.deform_conv2d").reference
        input, weight, offset, mask, bias = ctx.saved_tensors
        m = mask if ctx.use_mask else None
        gi, go, gm, gw, gb = impl.backward(
            grad, input, offset, m, weight, bias, *ctx.geometry, False
        )
        b, _, h, w = input.shape
        kh, kw = weight.shape[2:]
        groups = offset.shape[1] // (2 * kh * kw)
        case = (b, input.shape[1], h, w, 0, (kh, kw), *ctx.geometry, groups)
        y, x = _sample_coordinates(case, offset)
        outside = ~((y > -1) & (y < h) & (x > -1) & (x < w))
        junk = random_tensor(go.shape, go.dtype, go.device, low=0.5, high=1.0)
        junk = junk.view(*outside.shape[:3], 2, *outside.shape[3:]) * outside[:, :, :, None]
        gm = gm if ctx.use_mask else torch.zeros_like(mask)
        return (gi, gw, go + junk.view(go.shape), gm, gb, *[None] * 9)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("repeatable", [True, False], ids=["cpu-like", "cuda-like"])
def test_native_takes_torchvision_but_the_border_rule_and_determinism(
    monkeypatch, deterministic, repeatable
):
    """Native through torchvision's op (a stand-in here; the real one where torchvision loads):
    its offset gradient is the op's (0 for samples outside), and a deterministic backward on a
    device where torchvision's scatters with atomics ("cuda-like") runs the reference's."""
    module = importlib.import_module("fusedops.ops.deform_conv2d")
    monkeypatch.setattr(module, "_torchvision_op", lambda: _TorchvisionStandIn.apply)
    monkeypatch.setattr(module, "_torchvision_backward_repeatable", lambda device: repeatable)
    monkeypatch.setattr(_TorchvisionStandIn, "backward_calls", 0)
    for case in BORDER_CASES:
        _check_against_oracle(case, *_border_inputs(case), "native", deterministic)
    took_torchvision = repeatable or not deterministic
    assert _TorchvisionStandIn.backward_calls == (len(BORDER_CASES) if took_torchvision else 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_empty_batch(backend, deterministic):
    case = (0, 4, 5, 6, 2, (3, 3), 1, 1, 1, 2, 2, True, True, 1.0, F32)
    tensors, geometry = _inputs(case)
    out, leaves = _run(tensors, geometry, backend, deterministic)
    assert out.shape == (0, 2, 5, 6)
    out.sum().backward()
    for name, leaf in leaves.items():
        assert leaf.grad.shape == leaf.shape and not leaf.grad.any(), name


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_kernels_refuse_fp64(backend):
    tensors, geometry = _inputs(CASES[-1])
    with pytest.raises(fusedops.BackendUnavailableError, match="float64"):
        _run(tensors, geometry, backend)


def _bad(**changes):
    """Arguments of a valid call (B=2, C_in=4, 5x5, 3x3 kernel, padding 1, 2 offset groups)
    with ``changes`` applied."""
    args = {
        "input": torch.rand(2, 4, 5, 5, device=DEVICE),
        "offset": torch.rand(2, 36, 5, 5, device=DEVICE),
        "weight": torch.rand(3, 4, 3, 3, device=DEVICE),
        "bias": torch.rand(3, device=DEVICE),
        "padding": 1,
        "mask": torch.rand(2, 18, 5, 5, device=DEVICE),
    }
    args.update(changes)
    return args


BAD = {
    "offset": _bad(offset=torch.rand(2, 35, 5, 5, device=DEVICE)),
    "offset ": _bad(offset=torch.rand(2, 36, 4, 5, device=DEVICE)),  # wrong output size
    "offset  ": _bad(offset=torch.rand(2, 54, 5, 5, device=DEVICE)),  # 3 groups of 4 channels
    "mask": _bad(mask=torch.rand(2, 9, 5, 5, device=DEVICE)),
    "weight": _bad(weight=torch.rand(3, 3, 3, 3, device=DEVICE)),
    "bias": _bad(bias=torch.rand(4, device=DEVICE)),
    "input": _bad(input=torch.rand(4, 5, 5, device=DEVICE)),
    "padding": _bad(padding=-1),
    "stride": _bad(stride=(1, 0)),
    "dilation": _bad(dilation=(1, 2, 3)),
    "mask has dtype": _bad(mask=torch.rand(2, 18, 5, 5, device=DEVICE, dtype=F64)),
    "weight has dtype": _bad(weight=torch.rand(3, 4, 3, 3, device=DEVICE, dtype=F16)),
    "offset is on meta": _bad(offset=torch.rand(2, 36, 5, 5, device="meta")),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_name_the_argument(name):
    with pytest.raises((ValueError, TypeError), match=name.strip()):
        fusedops.deform_conv2d(**BAD[name], backend="reference")


# ------------------------------------------------------------------------------------ modules
def test_dcn_state_dict_and_fresh_module_is_a_half_weighted_convolution():
    """DCNv2 package layout; zero conv_offset_mask: zero offsets, mask sigmoid(0) = 0.5."""
    from fusedops.nn import DCN

    module = DCN(4, 6, 3, stride=2, padding=1, deformable_groups=2).to(DEVICE)
    assert set(module.state_dict()) == {
        "weight", "bias", "conv_offset_mask.weight", "conv_offset_mask.bias",
    }  # fmt: skip
    assert module.conv_offset_mask.weight.shape == (2 * 3 * 9, 4, 3, 3)
    assert not module.conv_offset_mask.weight.any() and not module.bias.any()
    with torch.no_grad():
        module.bias.copy_(random_tensor((6,), F32, DEVICE))
    x = random_tensor((2, 4, 7, 6), F32, DEVICE)
    plain = torch.nn.functional.conv2d(x, module.weight * 0.5, module.bias, stride=2, padding=1)
    assert_close(module(x), plain, scale=4 * 9)


def test_dcn_matches_the_oracle_with_learned_offsets():
    from fusedops.nn import DCN, DCNv2

    module = DCN(4, 3, (3, 2), stride=1, padding=(1, 0), bias=False).to(DEVICE)
    assert module.bias is None and "bias" not in module.state_dict()
    with torch.no_grad():
        module.conv_offset_mask.weight.copy_(
            random_tensor((18, 4, 3, 2), F32, DEVICE, low=-0.5, high=0.5)
        )
    x = random_tensor((2, 4, 5, 4), F32, DEVICE, low=-1.0, high=1.0).requires_grad_()
    out = module(x)
    o1, o2, m = torch.chunk(module.conv_offset_mask(x), 3, dim=1)
    offset, mask = torch.cat((o1, o2), dim=1), torch.sigmoid(m)
    args = [t.detach().double() for t in (x, offset, module.weight, mask)]
    want = oracle(args[0], args[1], args[2], None, (1, 1), (1, 0), (1, 1), args[3])
    assert_close(out, want, scale=4 * 6)
    out.sum().backward()
    assert module.weight.grad is not None and module.conv_offset_mask.weight.grad.any()
    plain = DCNv2(4, 3, (3, 2), 1, (1, 0), bias=False).to(DEVICE)
    plain.weight.data.copy_(module.weight.data)
    assert torch.equal(plain(x, offset, mask), out)


# ------------------------------------------------------------------------ CUDA kernels on CPU
# deform_conv2d.cu's kernels (the part before its host launchers) compiled by g++ as host code
# and run as one thread (their grid-stride loops then cover every item), inside the CUDA
# backend's host steps: the kernels' index arithmetic and math checked on machines without a GPU.
_HOST_SHIM = """
#include <cmath>
#include <cstdint>
using std::isnan;
struct HostDim { unsigned x; };
static const HostDim gridDim{1}, blockDim{1}, blockIdx{0}, threadIdx{0};
inline float atomicAdd(float* p, float v) { const float old = *p; *p += v; return old; }
"""
_HOST_API = """
}  // namespace (the kernels' anonymous one, left open by the cut)
}  // namespace fusedops
namespace fusedops {
template <typename F> void sized(const int64_t* a, int wide, F f) {
  const DeformConvGeometry g{a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
                             a[11], a[12], a[13], a[14]};
  if (wide) f(Sizes<WideDivider>(g)); else f(Sizes<FastDivider>(g));
}
}  // namespace fusedops
using namespace fusedops;
extern "C" void host_columns(const float* x, const float* off, const float* m, float* cols,
                             const int64_t* a, int wide) {
  sized(a, wide, [&](auto s) { columns_kernel<float>(x, off, m, cols, s); });
}
extern "C" void host_sample_grads(const float* gc, const float* x, const float* off,
                                  const float* m, float* go, float* gm, float* gi, int64_t* keys,
                                  float* coefs, const int64_t* a, int wide) {
  sized(a, wide, [&](auto s) {
    if (gi) sample_grads_kernel<float, true>(gc, x, off, m, go, gm, gi, keys, coefs, s);
    else sample_grads_kernel<float, false>(gc, x, off, m, go, gm, gi, keys, coefs, s);
  });
}
extern "C" void host_segment_gather(const float* gc, const int64_t* order, const float* coefs,
                                    const int64_t* starts, float* gi, const int64_t* a,
                                    int wide) {
  sized(a, wide, [&](auto s) { segment_gather_kernel<float>(gc, order, coefs, starts, gi, s); });
}
"""
_LAUNCHERS_MARK = "// ---- host launchers"


@pytest.fixture(scope="module")
def host_cuda_library(tmp_path_factory):
    """deform_conv2d.cu's kernels as a host shared library (ctypes)."""
    include = cuda_include_dir()
    if shutil.which("g++") is None or include is None:
        pytest.skip("needs g++ and the CUDA headers")
    folder = Path(fusedops.__file__).parent / "kernels" / "cuda"
    kernels = (folder / "deform_conv2d.cu").read_text().split(_LAUNCHERS_MARK)[0]
    assert "columns_kernel" in kernels and "<<<" not in kernels
    build = tmp_path_factory.mktemp("dcn_host")
    return host_library(build, "dcn_host", _HOST_SHIM + kernels + _HOST_API, (include, folder))


def _host_kernels(library, wide):
    """The CUDA backend's three kernels (kernels/cuda/deform_conv2d.py's signatures) on CPU
    fp32 tensors through the host library."""

    def ptr(t):
        return None if t is None else ctypes.c_void_p(t.data_ptr())

    def sizes(geo):
        values = (
            geo.batch, geo.channels, geo.height, geo.width, geo.offset_groups, geo.kh, geo.kw,
            geo.h_out, geo.w_out, *geo.stride, *geo.padding, *geo.dilation,
        )  # fmt: skip
        return (ctypes.c_int64 * len(values))(*values)

    def columns(cols, input, offset, mask, geo):
        library.host_columns(ptr(input), ptr(offset), ptr(mask), ptr(cols), sizes(geo), wide)

    def sample_grads(grad_cols, input, offset, mask, geo, grad_offset, grad_mask, grad_input,
                     keys, coefs):  # fmt: skip
        tensors = (grad_cols, input, offset, mask, grad_offset, grad_mask, grad_input, keys, coefs)
        library.host_sample_grads(*map(ptr, tensors), sizes(geo), wide)

    def segment_gather(grad_cols, order, coefs, starts, grad_input, geo):
        tensors = (grad_cols, order, coefs, starts, grad_input)
        library.host_segment_gather(*map(ptr, tensors), sizes(geo), wide)

    return columns, sample_grads, segment_gather


@pytest.mark.parametrize("wide", [False, True], ids=["fast-divider", "wide-divider"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    ("case", "make_inputs"),
    [pytest.param(c, _inputs, id=_case_id(c)) for c in CASES if c[-1] == F32]
    + [pytest.param(c, _border_inputs, id=f"border-{_case_id(c)}") for c in BORDER_CASES[:1]],
)
def test_cuda_kernels_as_host_code_match_the_oracle(
    host_cuda_library, case, make_inputs, deterministic, wide
):
    from fusedops.kernels import deform_conv2d_host as host

    forward, backward = host.entry_points(*_host_kernels(host_cuda_library, wide))
    tensors, geometry = make_inputs(case)
    tensors = {k: None if v is None else v.cpu() for k, v in tensors.items()}
    names = ("input", "offset", "mask", "weight", "bias")
    args = [tensors[k] for k in names] + [geometry[k] for k in ("stride", "padding", "dilation")]
    out = forward(*args)
    dout = random_tensor(out.shape, F32, torch.device("cpu"), low=-1.0, high=1.0)
    grads = dict(zip(names, backward(dout, *args, deterministic)))
    want, want_leaves = _expected(tensors, geometry, dout)
    terms = _terms(case)
    assert_close(out, want, scale=terms["out"], msg="output")
    for name in names:
        if tensors[name] is None:
            assert grads[name] is None, name
            continue
        assert_close(grads[name], want_leaves[name].grad, scale=terms[name], msg=f"grad {name}")

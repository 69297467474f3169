"""Deformable convolution, DCNv1 and DCNv2 (modulated), with ``torchvision.ops.deform_conv2d``'s
semantics.

Shapes: input ``(B, C_in, H, W)``; weight ``(C_out, C_in // wg, kh, kw)`` with ``wg`` weight
groups (``C_in // weight.shape[1]``); offset ``(B, 2 * G * kh * kw, H_out, W_out)`` holding a
``(dy, dx)`` pair per offset group ``g`` and kernel point ``k = i * kw + j`` at channels
``2 * (g * kh * kw + k)`` and ``+ 1``; mask ``(B, G * kh * kw, H_out, W_out)`` (None: DCNv1, a
mask of ones); bias ``(C_out,)`` or None. Input channel ``c`` belongs to offset group
``c // (C_in // G)``.

Output pixel ``(oy, ox)``, kernel point ``(i, j)`` samples the input at
``y = oy * stride_h - pad_h + i * dil_h + dy``, ``x = ox * stride_w - pad_w + j * dil_w + dx``,
bilinearly: a sample with ``y <= -1``, ``y >= H``, ``x <= -1`` or ``x >= W`` is 0; otherwise
each of the four corners ``(floor(y) + {0, 1}, floor(x) + {0, 1})`` inside the image contributes
its value times its bilinear weight. The sample times the mask forms the "columns"
``(B, C_in * kh * kw, H_out * W_out)``; the output is ``weight @ columns`` per weight group, plus
bias. Math in fp32 for 16-bit inputs (fp64 for fp64 on the reference); output in input's dtype.

Backward (every backend): ``grad_columns = weight^T @ grad_out``; grad_weight is one batched
product ``grad_out @ columns^T`` over batch and pixels; grad_bias sums grad_out; grad_mask and
grad_offset are gathers (each sample's gradient sums its group's channels); grad_input scatters
``grad_columns * mask * corner weight`` to the four corners: atomics, or with ``deterministic``
a sorted, segmented gather (the same sum in a fixed order every run).

Every backend exposes ``forward(input, offset, mask, weight, bias, stride, padding, dilation)``
and ``backward(grad, input, offset, mask, weight, bias, stride, padding, dilation,
deterministic) -> (grad_input, grad_offset, grad_mask, grad_weight, grad_bias)`` (grad_mask None
without a mask, grad_bias None without a bias), stride/padding/dilation ``(h, w)`` pairs.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.ops._checks import check_same_device, check_tensor
from fusedops.ops._define import define_module_op
from fusedops.ops._dtypes import compute_dtype

__all__ = ["deform_conv2d"]

# ------------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch, vectorised over the batch): gather-based im2col.


def output_size(h, w, kh, kw, stride, padding, dilation) -> tuple[int, int]:
    """(H_out, W_out) of a (kh, kw) deformable convolution on an (h, w) image."""
    h_out = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    w_out = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    return h_out, w_out


def _sample_points(input_shape, offset, kh, kw, stride, padding, dilation, c):
    """Every sample's coordinates ``y``, ``x`` in dtype ``c`` and whether it lies inside
    ``(-1, H) x (-1, W)`` (the samples outside read 0), each ``(B, G, K, L)``."""
    b, g2k, h_out, w_out = offset.shape
    h, w = input_shape[2:]
    k = kh * kw
    off = offset.to(c).view(b, g2k // (2 * k), k, 2, h_out, w_out)
    dev = offset.device
    base_y = (torch.arange(kh, device=dev) * dilation[0])[:, None] + (
        torch.arange(h_out, device=dev) * stride[0] - padding[0]
    )[None, :]  # (kh, H_out)
    base_x = (torch.arange(kw, device=dev) * dilation[1])[:, None] + (
        torch.arange(w_out, device=dev) * stride[1] - padding[1]
    )[None, :]  # (kw, W_out)
    base_y = base_y[:, None, :, None].expand(kh, kw, h_out, 1).reshape(k, h_out, 1)
    base_x = base_x[None, :, None, :].expand(kh, kw, 1, w_out).reshape(k, 1, w_out)
    y = (base_y.to(c) + off[:, :, :, 0]).flatten(-2)  # (B, G, K, L)
    x = (base_x.to(c) + off[:, :, :, 1]).flatten(-2)
    return y, x, (y > -1) & (y < h) & (x > -1) & (x < w)


def _corners(input_shape, offset, kh, kw, stride, padding, dilation, c):
    """The bilinear corners of every sample: a list of four (flat index into H*W, weight,
    (dweight/dy, dweight/dx)) with shapes ``(B, G, K, L)``; a corner outside the image, or a
    sample outside ``(-1, H) x (-1, W)``, has weight 0 (its index clamped into the image)."""
    h, w = input_shape[2:]
    y, x, inside = _sample_points(input_shape, offset, kh, kw, stride, padding, dilation, c)
    y0, x0 = torch.floor(y), torch.floor(x)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    y0, x0 = y0.long(), x0.long()
    corners = []
    for dy, wy, dwy in ((0, hy, -1.0), (1, ly, 1.0)):
        for dx, wx, dwx in ((0, hx, -1.0), (1, lx, 1.0)):
            yy, xx = y0 + dy, x0 + dx
            ok = inside & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            index = yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)
            okf = ok.to(c)
            corners.append((index, wy * wx * okf, (dwy * wx * okf, wy * dwx * okf)))
    return corners


def _gather(flat, index):
    """``flat`` (B, G, Cg, HW) read at ``index`` (B, G, K, L) -> (B, G, Cg, K, L)."""
    b, g, cg, _ = flat.shape
    _, _, k, n = index.shape
    full = index.view(b, g, 1, k * n).expand(b, g, cg, k * n)
    return torch.gather(flat, 3, full).view(b, g, cg, k, n)


def _geometry(input, offset, mask, weight, stride, padding, dilation):
    c = compute_dtype(input.dtype)
    b, cin, h, w = input.shape
    kh, kw = weight.shape[2:]
    groups = offset.shape[1] // (2 * kh * kw)
    flat = input.to(c).reshape(b, groups, cin // groups, h * w)
    corners = _corners(input.shape, offset, kh, kw, stride, padding, dilation, c)
    m = None
    if mask is not None:
        m = mask.to(c).reshape(b, groups, 1, kh * kw, mask.shape[2] * mask.shape[3])
    return c, flat, corners, m


def _columns(flat, corners, m):
    """(B, G, Cg, K, L) sampled values times the mask, and the unmasked samples."""
    sampled = sum(_gather(flat, index) * wt[:, :, None] for index, wt, _ in corners)
    return (sampled if m is None else sampled * m), sampled


def _ref_forward(input, offset, mask, weight, bias, stride, padding, dilation):
    c, flat, corners, m = _geometry(input, offset, mask, weight, stride, padding, dilation)
    cols, _ = _columns(flat, corners, m)
    b = input.shape[0]
    cout, cin_g, kh, kw = weight.shape
    wg = input.shape[1] // cin_g
    h_out, w_out = offset.shape[2:]
    cols = cols.reshape(b, wg, cin_g * kh * kw, h_out * w_out)
    wmat = weight.to(c).reshape(1, wg, cout // wg, cin_g * kh * kw)
    out = torch.matmul(wmat, cols).reshape(b, cout, h_out, w_out)
    if bias is not None:
        out = out + bias.to(c)[:, None, None]
    return out.to(input.dtype)


def _ref_backward(
    grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic
):
    c, flat, corners, m = _geometry(input, offset, mask, weight, stride, padding, dilation)
    b, cin, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    k, wg, groups = kh * kw, cin // cin_g, offset.shape[1] // (2 * kh * kw)
    h_out, w_out = offset.shape[2:]
    n = h_out * w_out
    cols, sampled = _columns(flat, corners, m)
    g = grad.to(c).reshape(b, wg, cout // wg, n)
    wmat = weight.to(c).reshape(1, wg, cout // wg, cin_g * k)
    grad_cols = torch.matmul(wmat.transpose(-1, -2), g).reshape(b, groups, cin // groups, k, n)
    # weight: one batched product over batch and pixels
    g_rows = g.permute(1, 2, 0, 3).reshape(wg, cout // wg, b * n)
    c_rows = cols.reshape(b, wg, cin_g * k, n).permute(1, 0, 3, 2).reshape(wg, b * n, cin_g * k)
    grad_weight = torch.matmul(g_rows, c_rows).reshape(weight.shape).to(weight.dtype)
    grad_bias = g.sum(dim=(0, 3)).reshape(cout).to(bias.dtype) if bias is not None else None
    grad_mask = None
    if m is not None:
        grad_mask = (grad_cols * sampled).sum(dim=2).reshape(mask.shape).to(mask.dtype)
        grad_cols = grad_cols * m
    # offset: gather of the bilinear weights' derivatives, summed over the group's channels
    dy = dx = 0
    grad_flat = torch.zeros_like(flat).reshape(-1)
    base = torch.arange(b * groups * (cin // groups), device=input.device) * (h * w)
    base = base.view(b, groups, cin // groups, 1, 1)
    for index, wt, (dwy, dwx) in corners:
        values = (_gather(flat, index) * grad_cols).sum(dim=2)
        dy = dy + values * dwy
        dx = dx + values * dwx
        target = (base + index[:, :, None]).expand_as(grad_cols)
        # index_put_ with accumulate: a sorted scatter on CUDA (the same bits every run)
        grad_flat.index_put_((target.reshape(-1),), (grad_cols * wt[:, :, None]).reshape(-1), True)
    grad_offset = torch.stack((dy, dx), dim=3).reshape(offset.shape).to(offset.dtype)
    grad_input = grad_flat.reshape(input.shape).to(input.dtype)
    return grad_input, grad_offset, grad_mask, grad_weight, grad_bias


reference = SimpleNamespace(forward=_ref_forward, backward=_ref_backward)

# ------------------------------------------------------------------------------------------
# Native: torchvision's deform_conv2d op where torchvision (with its compiled ops) is importable,
# else the reference. Called as ``torch.ops.torchvision.deform_conv2d`` so that the "dcn" hook,
# which replaces ``torchvision.ops.deform_conv2d`` by fusedops', never loops back here. 16-bit
# inputs run in fp32: torchvision's kernels take float, double and, on CUDA, half only.
# Two places where torchvision's backward is not this op's:
# - its offset gradient (CPU and CUDA kernels alike: get_coordinate_weight) lacks the forward's
#   "outside (-1, H) x (-1, W) reads 0" test, so a sample at exactly y = -1 (x = -1) gets the
#   one-sided derivative into the image instead of 0 (pytorch/vision#6885, still open; DCN's
#   original kernels and mmcv's return 0 there). Native keeps torchvision's offset gradient
#   inside and zeroes it outside, which is exactly the reference's.
# - on CUDA it scatters the input gradient with atomicAdd, so a deterministic backward there
#   runs the reference's (index_put_ with accumulate: a sorted scatter on CUDA, the same bits
#   every run); its CPU kernel loops in a fixed order.


@functools.cache
def _torchvision_op():
    try:
        import torchvision  # noqa: F401  (loads torch.ops.torchvision)

        return torch.ops.torchvision.deform_conv2d
    except (ImportError, AttributeError, RuntimeError):
        return None


def _native_args(input, offset, mask, weight, bias):
    c = compute_dtype(input.dtype)
    return [
        t if t is None or t.dtype == c else t.to(c) for t in (input, offset, mask, weight, bias)
    ]


def _torchvision_forward(op, input, offset, mask, weight, bias, stride, padding, dilation):
    kh, kw = weight.shape[2:]
    groups = offset.shape[1] // (2 * kh * kw)
    use_mask = mask is not None
    if mask is None:
        mask = input.new_zeros((offset.shape[0], groups * kh * kw, *offset.shape[2:]))
    if bias is None:
        bias = input.new_zeros((weight.shape[0],))
    wg = input.shape[1] // weight.shape[1]
    return op(input, weight, offset, mask, bias, *stride, *padding, *dilation, wg, groups, use_mask)


def _native_forward(input, offset, mask, weight, bias, stride, padding, dilation):
    op = _torchvision_op()
    if op is None:
        return _ref_forward(input, offset, mask, weight, bias, stride, padding, dilation)
    args = _native_args(input, offset, mask, weight, bias)
    return _torchvision_forward(op, *args, stride, padding, dilation).to(input.dtype)


def _torchvision_backward_repeatable(device: torch.device) -> bool:
    """Whether torchvision's backward gives the same bits every run on ``device``: its CPU
    kernel loops in a fixed order, its CUDA one scatters the input gradient with atomicAdd."""
    return device.type == "cpu"


def _inside_only(grad_offset, input_shape, offset, weight, stride, padding, dilation):
    """``grad_offset`` (B, 2 * G * kh * kw, H_out, W_out) with 0 for every sample outside
    ``(-1, H) x (-1, W)``, as the forward reads it (torchvision's is not 0 at y = -1, x = -1)."""
    kh, kw = weight.shape[2:]
    *_, inside = _sample_points(
        input_shape, offset, kh, kw, stride, padding, dilation, grad_offset.dtype
    )
    b, g, k, n = inside.shape
    kept = torch.where(inside[:, :, :, None], grad_offset.reshape(b, g, k, 2, n), 0)
    return kept.reshape(grad_offset.shape)


def _native_backward(
    grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic
):
    op = _torchvision_op()
    if op is None or (deterministic and not _torchvision_backward_repeatable(input.device)):
        return _ref_backward(
            grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic
        )
    originals = (input, offset, mask, weight, bias)
    args = [None if t is None else t.detach().requires_grad_() for t in _native_args(*originals)]
    with torch.enable_grad():
        out = _torchvision_forward(op, *args, stride, padding, dilation)
        leaves = [t for t in args if t is not None]
        found = iter(torch.autograd.grad(out, leaves, grad.to(out.dtype)))
    grads = [None if t is None else next(found) for t in args]
    grads[1] = _inside_only(grads[1], input.shape, args[1], weight, stride, padding, dilation)
    return tuple(None if g is None else g.to(t.dtype) for g, t in zip(grads, originals))


native = SimpleNamespace(forward=_native_forward, backward=_native_backward)

dispatch.register_op(
    "deform_conv2d",
    reference,
    kernels="deform_conv2d",
    native=native,
)

# ------------------------------------------------------------------------------------------
# Custom ops: fusedops::deform_conv2d and its backward.


def _pairs(*lists):
    return tuple(tuple(v) for v in lists)


def _select(input, offset, mask, weight, bias, backend):
    return dispatch.select("deform_conv2d", input, offset, mask, weight, bias, backend=backend)


def _forward(
    input: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    deterministic: bool,
    backend: str | None = None,
) -> torch.Tensor:
    impl = _select(input, offset, mask, weight, bias, backend)
    return impl.forward(input, offset, mask, weight, bias, *_pairs(stride, padding, dilation))


def _forward_fake(input, offset, mask, weight, bias, stride, padding, dilation, det, backend=None):
    b, h_out, w_out = offset.shape[0], offset.shape[2], offset.shape[3]
    return input.new_empty((b, weight.shape[0], h_out, w_out))


def _backward_body(
    grad: torch.Tensor,
    input: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    deterministic: bool,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = _select(input, offset, mask, weight, bias, backend)
    return impl.backward(
        grad.contiguous(),
        input,
        offset,
        mask,
        weight,
        bias,
        *_pairs(stride, padding, dilation),
        deterministic,
    )


def _backward_fake(grad, input, offset, mask, weight, bias, *rest):
    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    gm = like(mask) if mask is not None else None
    gb = like(bias) if bias is not None else None
    return like(input), like(offset), gm, like(weight), gb


def _setup_context(ctx, inputs, output):
    input, offset, mask, weight, bias, *geometry, deterministic, _ = inputs
    ctx.save_for_backward(input, offset, mask, weight, bias)
    ctx.geometry = geometry
    ctx.deterministic = deterministic


def _grads(ctx, backward, grad):
    input, offset, mask, weight, bias = ctx.saved_tensors
    return backward(
        grad, input, offset, mask, weight, bias, *ctx.geometry, ctx.deterministic, ctx.backend
    )


DEFORM_CONV2D = define_module_op("deform_conv2d", globals())

# ------------------------------------------------------------------------------------------
# Public function and its input checks.


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _check_inputs(input, offset, weight, bias, mask, stride, padding, dilation):
    check_tensor(input, "input")
    for name, t in (("offset", offset), ("weight", weight), ("bias", bias), ("mask", mask)):
        if t is None and name in ("bias", "mask"):
            continue
        check_tensor(t, name)
        if t.dtype != input.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}; expected input's {input.dtype}")
    check_same_device(input, "input", offset=offset, weight=weight, bias=bias, mask=mask)
    if input.dim() != 4:
        raise ValueError(f"input must be 4-D (B, C_in, H, W), got shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise ValueError(
            f"weight must be 4-D (C_out, C_in // groups, kh, kw), got shape {tuple(weight.shape)}"
        )
    b, cin, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    if cin_g < 1 or kh < 1 or kw < 1 or cin % cin_g or cout % (cin // cin_g):
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}: input's {cin} channels must be a multiple of "
            f"weight.shape[1] and C_out={cout} a multiple of the groups C_in // weight.shape[1]"
        )
    stride = _pair(stride, "stride", 1)
    padding = _pair(padding, "padding", 0)
    dilation = _pair(dilation, "dilation", 1)
    h_out, w_out = output_size(h, w, kh, kw, stride, padding, dilation)
    if h_out < 1 or w_out < 1:
        raise ValueError(
            f"input of size {(h, w)} is too small for a {kh}x{kw} kernel with stride {stride}, "
            f"padding {padding} and dilation {dilation} (output {(h_out, w_out)})"
        )
    k = kh * kw
    if (
        offset.dim() != 4
        or offset.shape[0] != b
        or offset.shape[1] == 0
        or offset.shape[1] % (2 * k)
        or cin % (offset.shape[1] // (2 * k))
        or tuple(offset.shape[2:]) != (h_out, w_out)
    ):
        raise ValueError(
            f"offset has shape {tuple(offset.shape)}; expected (B, 2 * offset_groups * kh * kw, "
            f"H_out, W_out) = ({b}, 2 * G * {k}, {h_out}, {w_out}) with C_in={cin} a multiple of G"
        )
    groups = offset.shape[1] // (2 * k)
    if mask is not None and tuple(mask.shape) != (b, groups * k, h_out, w_out):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected (B, offset_groups * kh * kw, H_out, "
            f"W_out) = {(b, groups * k, h_out, w_out)}"
        )
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected (C_out,) = {(cout,)}")
    return stride, padding, dilation


def deform_conv2d(
    input: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    mask: torch.Tensor | None = None,
    *,
    deterministic: bool | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Deformable convolution (DCNv1; DCNv2 with ``mask``), as ``torchvision.ops.deform_conv2d``.

    input ``(B, C_in, H, W)``; offset ``(B, 2 * G * kh * kw, H_out, W_out)`` ((dy, dx) per offset
    group G and kernel point); weight ``(C_out, C_in // groups, kh, kw)``; bias ``(C_out,)`` or
    None; mask ``(B, G * kh * kw, H_out, W_out)`` or None. All float16/bfloat16/float32 (float64
    on the reference and native backends), one dtype and device. stride, padding, dilation: int
    or (h, w). Returns ``(B, C_out, H_out, W_out)`` in input's dtype (fp32 accumulation).
    Differentiable in input, offset, mask, weight and bias. deterministic: accumulate the input
    gradient in a fixed order (sorted, segmented gather) instead of with atomics; None follows
    ``torch.are_deterministic_algorithms_enabled()`` at the forward.
    backend: "cuda" | "triton" | "reference" | "native" to force one (default: the dispatch rule).
    """
    stride, padding, dilation = _check_inputs(
        input, offset, weight, bias, mask, stride, padding, dilation
    )
    return DEFORM_CONV2D(
        input.contiguous(),
        offset.contiguous(),
        mask.contiguous() if mask is not None else None,
        weight.contiguous(),
        bias.contiguous() if bias is not None else None,
        list(stride),
        list(padding),
        list(dilation),
        torch.are_deterministic_algorithms_enabled()
        if deterministic is None
        else bool(deterministic),
        backend,
    )

"""Host side of the deform_conv2d kernels, shared by the Triton and CUDA backends.

Both backends provide three kernels (as a namespace ``kernels``):

- ``columns(cols, input, offset, mask, geo)``: the masked bilinear samples, written in the
  layout ``(C_in * K, B * L)`` (channel, kernel point) x (image, output pixel), so the weight's
  products read and write it without a transpose copy;
- ``sample_grads(grad_cols, input, offset, mask, geo, grad_offset, grad_mask, grad_input,
  keys, coefs)``: one thread per sample (image, offset group, kernel point, pixel) sums its
  group's channels into grad_offset and grad_mask (gather form: each written once), and either
  adds ``grad_cols * mask * corner weight`` into the fp32 ``grad_input`` with atomics, or
  (``grad_input`` None) writes each corner's destination ``keys`` (``(b * G + g) * H * W +
  pixel``, ``B * G * H * W`` for a corner outside the image) and coefficient ``coefs``;
- ``segment_gather(grad_cols, order, coefs, starts, grad_input, geo)``: deterministic input
  gradient: one thread per (image, channel, pixel) sums, in sorted order, the entries of its
  pixel's segment of the stably sorted keys.

The products (columns -> output, grad_out -> grad_columns, grad_weight) are cuBLAS/ATen matmuls
in the input dtype with fp32 accumulation; grad_weight is one batched product over every image
and pixel.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from fusedops import _alloc


@dataclass(frozen=True)
class Geometry:
    """Sizes of one deform_conv2d call (see ``ops/deform_conv2d.py``)."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    weight_groups: int
    kh: int
    kw: int
    offset_groups: int
    h_out: int
    w_out: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    @property
    def points(self) -> int:
        """Kernel points K = kh * kw."""
        return self.kh * self.kw

    @property
    def pixels(self) -> int:
        """Output pixels L = H_out * W_out."""
        return self.h_out * self.w_out

    @property
    def group_channels(self) -> int:
        """Input channels per offset group."""
        return self.channels // self.offset_groups

    @property
    def samples(self) -> int:
        """Samples B * G * K * L (one thread each in columns/sample_grads)."""
        return self.batch * self.offset_groups * self.points * self.pixels


def geometry(input, offset, weight, stride, padding, dilation) -> Geometry:
    """The Geometry of input ``(B, C, H, W)``, offset ``(B, 2GK, H_out, W_out)``, weight."""
    b, c, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    return Geometry(
        b, c, h, w, cout, c // cin_g, kh, kw, offset.shape[1] // (2 * kh * kw),
        offset.shape[2], offset.shape[3], tuple(stride), tuple(padding), tuple(dilation),
    )  # fmt: skip


def _columns(kernels, input, offset, mask, geo):
    cols = _alloc.empty(
        (geo.channels * geo.points, geo.batch * geo.pixels), dtype=input.dtype, device=input.device
    )
    if cols.numel():
        kernels.columns(cols, input, offset, mask, geo)
    return cols


def _weight_matrix(weight, geo):
    wg = geo.weight_groups
    return weight.reshape(wg, geo.out_channels // wg, -1)


def forward(kernels, input, offset, mask, weight, bias, stride, padding, dilation):
    """Output ``(B, C_out, H_out, W_out)`` in input's dtype."""
    geo = geometry(input, offset, weight, stride, padding, dilation)
    wg, o = geo.weight_groups, geo.out_channels // geo.weight_groups
    cols = _columns(kernels, input, offset, mask, geo)
    product = torch.matmul(
        _weight_matrix(weight, geo), cols.view(wg, cols.shape[0] // wg, cols.shape[1])
    )
    out = _alloc.empty(
        (geo.batch, geo.out_channels, geo.h_out, geo.w_out), dtype=input.dtype, device=input.device
    )
    by_image = product.view(wg, o, geo.batch, geo.pixels).permute(2, 0, 1, 3)
    if bias is None:
        out.view(geo.batch, wg, o, geo.pixels).copy_(by_image)
    else:
        torch.add(by_image, bias.view(1, wg, o, 1), out=out.view(geo.batch, wg, o, geo.pixels))
    return out


def backward(
    kernels, grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic
):
    """(grad_input, grad_offset, grad_mask or None, grad_weight, grad_bias or None)."""
    geo = geometry(input, offset, weight, stride, padding, dilation)
    wg, o = geo.weight_groups, geo.out_channels // geo.weight_groups
    g = (
        grad.view(geo.batch, wg, o, geo.pixels)
        .permute(1, 2, 0, 3)
        .reshape(wg, o, geo.batch * geo.pixels)
    )
    cols = _columns(kernels, input, offset, mask, geo)
    wmat = _weight_matrix(weight, geo)
    grad_weight = torch.matmul(
        g, cols.view(wg, cols.shape[0] // wg, cols.shape[1]).transpose(-1, -2)
    )
    grad_weight = grad_weight.reshape(weight.shape).to(weight.dtype)
    grad_bias = None
    if bias is not None:
        grad_bias = g.sum(dim=2, dtype=torch.float32).reshape(-1).to(bias.dtype)
    grad_cols = torch.matmul(wmat.transpose(-1, -2), g).view(cols.shape)
    device = input.device
    grad_offset = _alloc.empty(offset.shape, dtype=offset.dtype, device=device)
    grad_mask = (
        _alloc.empty(mask.shape, dtype=mask.dtype, device=device) if mask is not None else None
    )
    if not geo.samples:
        grad_offset.zero_()
        if grad_mask is not None:
            grad_mask.zero_()
        return torch.zeros_like(input), grad_offset, grad_mask, grad_weight, grad_bias
    if not deterministic:
        accumulator = torch.zeros(input.shape, dtype=torch.float32, device=device)
        kernels.sample_grads(
            grad_cols, input, offset, mask, geo, grad_offset, grad_mask, accumulator, None, None
        )
        return accumulator.to(input.dtype), grad_offset, grad_mask, grad_weight, grad_bias
    keys = torch.empty(geo.samples * 4, dtype=torch.int64, device=device)
    coefs = torch.empty(geo.samples * 4, dtype=torch.float32, device=device)
    kernels.sample_grads(
        grad_cols, input, offset, mask, geo, grad_offset, grad_mask, None, keys, coefs
    )
    segments = geo.batch * geo.offset_groups * geo.height * geo.width
    sorted_keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(segments + 1, dtype=torch.int64, device=device)
    starts = torch.searchsorted(sorted_keys, bounds)
    grad_input = _alloc.empty(input.shape, dtype=input.dtype, device=device)
    if grad_input.numel():
        kernels.segment_gather(grad_cols, order, coefs, starts, grad_input, geo)
    return grad_input, grad_offset, grad_mask, grad_weight, grad_bias


def entry_points(columns, sample_grads, segment_gather):
    """A backend module's ``forward`` and ``backward`` (the op's backend interface) over its
    three kernels (signatures in this module's docstring)."""
    kernels = SimpleNamespace(
        columns=columns, sample_grads=sample_grads, segment_gather=segment_gather
    )

    def backend_forward(input, offset, mask, weight, bias, stride, padding, dilation):
        """deform_conv2d output (B, C_out, H_out, W_out); contiguous CUDA fp16/bf16/fp32."""
        return forward(kernels, input, offset, mask, weight, bias, stride, padding, dilation)

    def backend_backward(
        grad, input, offset, mask, weight, bias, stride, padding, dilation, deterministic
    ):
        """(grad_input, grad_offset, grad_mask, grad_weight, grad_bias); see ``backward``."""
        return backward(
            kernels, grad, input, offset, mask, weight, bias, stride, padding, dilation,
            deterministic,
        )  # fmt: skip

    return backend_forward, backend_backward

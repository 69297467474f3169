"""DCN and DCNv2 modules with the constructor, state dict and forward of the DCNv2 package
(CharlesShang/DCNv2, as CenterNet and its forks use it), running ``fusedops.deform_conv2d``: the
seed runtime's ``from torchacc.runtime.nn.dcn_v2 import DCN, DCNv2`` ports as ``from
fusedops.nn.dcn_v2 import DCN, DCNv2``."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from fusedops.ops.deform_conv2d import deform_conv2d

__all__ = ["DCN", "DCNv2"]


class DCNv2(nn.Module):
    """Modulated deformable convolution taking its offset and mask as arguments.

    Parameters: ``weight (out_channels, in_channels, kh, kw)`` (uniform in +-1/sqrt(fan_in), as
    DCNv2) and ``bias (out_channels,)`` (zeros; None with ``bias=False``).
    forward(input (B, C_in, H, W), offset (B, 2 * deformable_groups * kh * kw, H_out, W_out),
    mask (B, deformable_groups * kh * kw, H_out, W_out)) -> (B, out_channels, H_out, W_out).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride,
        padding,
        dilation=1,
        deformable_groups: int = 1,
        bias: bool = True,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.deformable_groups = deformable_groups
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DCNv2's initialisation: weight uniform in +-1/sqrt(in_channels * kh * kw), bias 0."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, input, offset, mask):
        """Deformable convolution of input with the given offset and mask (see the class)."""
        return deform_conv2d(
            input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"deformable_groups={self.deformable_groups}, bias={self.bias is not None}"
        )


class DCN(DCNv2):
    """DCNv2 predicting its own offset and mask with ``conv_offset_mask`` (a Conv2d with
    ``3 * deformable_groups * kh * kw`` outputs, zero-initialised: a fresh DCN samples the plain
    convolution grid with mask sigmoid(0) = 0.5, as DCNv2's).

    forward(input (B, C_in, H, W)) -> (B, out_channels, H_out, W_out): ``o1, o2, m =
    chunk(conv_offset_mask(input), 3, dim=1)``, offset ``cat(o1, o2)``, mask ``sigmoid(m)``.
    """

    def __init__(self, *args, **kwargs):
        # DCNv2's arguments: (in_channels, out_channels, kernel_size, stride, padding,
        # dilation=1, deformable_groups=1, bias=True)
        super().__init__(*args, **kwargs)
        channels = self.deformable_groups * 3 * self.kernel_size[0] * self.kernel_size[1]
        self.conv_offset_mask = nn.Conv2d(
            self.in_channels,
            channels,
            kernel_size=self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            bias=True,
        )
        self.init_offset()

    def init_offset(self) -> None:
        """Zero ``conv_offset_mask`` (weight and bias), as DCNv2 does."""
        with torch.no_grad():
            self.conv_offset_mask.weight.zero_()
            self.conv_offset_mask.bias.zero_()

    def forward(self, input):
        """Offsets and mask from ``conv_offset_mask(input)``, then the deformable convolution."""
        o1, o2, mask = torch.chunk(self.conv_offset_mask(input), 3, dim=1)
        offset = torch.cat((o1, o2), dim=1)
        return super().forward(input, offset, torch.sigmoid(mask))

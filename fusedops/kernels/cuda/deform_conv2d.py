"""deform_conv2d on the CUDA extension: deform_conv2d.cu's kernels (columns, sample gradients,
deterministic segment gather) inside the host steps of ``kernels/deform_conv2d_host.py`` (the
cuBLAS products and the deterministic path's sort), shared with the Triton backend.
"""

from __future__ import annotations

from fusedops.kernels import deform_conv2d_host as host
from fusedops.kernels.cuda.build import library


def _sizes(geo: host.Geometry) -> list[int]:
    """The binding's ``geometry`` list (B, C, H, W come from the tensors)."""
    return [
        geo.offset_groups, geo.kh, geo.kw, geo.h_out, geo.w_out,
        *geo.stride, *geo.padding, *geo.dilation,
    ]  # fmt: skip


def _columns(cols, input, offset, mask, geo):
    library().deform_conv2d_columns(input, offset, mask, cols, _sizes(geo))


def _sample_grads(
    grad_cols, input, offset, mask, geo, grad_offset, grad_mask, grad_input, keys, coefs
):
    library().deform_conv2d_sample_grads(
        grad_cols, input, offset, mask, _sizes(geo), grad_offset, grad_mask, grad_input, keys,
        coefs,
    )  # fmt: skip


def _segment_gather(grad_cols, order, coefs, starts, grad_input, geo):
    library().deform_conv2d_segment_gather(grad_cols, order, coefs, starts, _sizes(geo), grad_input)


#: The op's backend interface (``ops/deform_conv2d.py``) over these kernels.
forward, backward = host.entry_points(_columns, _sample_grads, _segment_gather)

"""What the Swin attention ops (``swin_softmax``, ``window_attention``) share, in torch: window
``z``'s mask ``mask[z % nW]`` and the softmax whose fully masked rows give zeros.
``fusedops/xla/fused/_swin.py`` is the same in jax.numpy, and the kernels follow the same rule:

A row is fully masked when its max is -inf (every entry -inf): its softmax is 0, not NaN. A row
holding NaN or +inf has a NaN or +inf max, so its softmax is NaN, as ``torch.softmax`` gives.
"""

from __future__ import annotations

import math

import torch


def add_window_mask(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``scores`` (Z, H, N, N) with ``mask[z % nW]`` (nW, N, N) added to window z (the windows
    of one image consecutive, as Swin lays them out; nW divides Z)."""
    windows = mask.shape[0]
    by_image = scores.view(scores.shape[0] // windows, windows, *scores.shape[1:])
    return (by_image + mask[None, :, None]).view(scores.shape)


def shifted_exp(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(e, shift, masked)`` over the last dim: ``e = exp(scores - shift)`` with ``shift`` the
    row max (0 on fully masked rows, whose e is then 0, not NaN) and ``masked`` those rows
    (keepdim). NaN propagates: a row with NaN or +inf gets NaN in e."""
    top = scores.amax(dim=-1, keepdim=True)
    masked = top == -math.inf
    shift = torch.where(masked, 0.0, top)
    return torch.exp(scores - shift), shift, masked


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, fully masked rows giving 0 (see the module docstring)."""
    e, _, masked = shifted_exp(scores)
    return torch.where(masked, 0.0, e / e.sum(dim=-1, keepdim=True))


def native_softmax(scores: torch.Tensor) -> torch.Tensor:
    """``masked_softmax`` with torch's own ops, differentiable by torch's autograd (the native
    backend): ``torch.softmax`` when every score is above -inf (the minimum, one read pass,
    checked on CPU tensors, where reading the answer costs no synchronisation;
    ``aten._safe_softmax`` costs about three softmaxes forward and backward there), else (a -inf
    or a NaN score) ``aten._safe_softmax``, which gives fully masked rows zeros."""
    # min().item(): one op fewer than comparing on the tensor (NaN: False either way)
    if scores.device.type == "cpu" and scores.numel() and scores.min().item() > -math.inf:
        return torch.softmax(scores, -1)
    return torch.ops.aten._safe_softmax(scores, -1)

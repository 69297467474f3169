"""Fused timm Swin classes (``timm.models.swin_transformer``; the ``swin`` hook swaps them in).

- ``SwinTransformerBlock._attn``: shift + window partition and window reverse + unshift as the
  fused gathers. timm rolls the map before padding it, so a map that needs padding (H or W not
  a multiple of the window) runs timm's own ``_attn`` (its attention is still the fused one).
- ``WindowAttention.forward``: the model's qkv / proj, then ``attention_core`` with the
  bias from ``_get_rel_pos_bias`` and the (nW, N, N) mask kept separate.

Recognised shape (timm >= 0.9): the block has ``_attn`` and tuple ``window_size`` /
``shift_size``; the attention has ``_get_rel_pos_bias``. Other shapes stay unpatched.
"""

from __future__ import annotations

import inspect

from fusedops.ops.window_attention import attention_core
from fusedops.ops.window_process import window_partition_roll, window_reverse_roll


def _block_attn(self, x):
    batch, height, width, channels = x.shape
    window_h, window_w = self.window_size
    if height % window_h or width % window_w:  # timm pads after rolling: its own code
        return self._fusedops_original._attn(self, x)
    shift = tuple(self.shift_size)
    windows = window_partition_roll(x, (window_h, window_w), (-shift[0], -shift[1]))
    windows = windows.view(-1, window_h * window_w, channels)
    mask = self.get_attn_mask(x) if getattr(self, "dynamic_mask", False) else self.attn_mask
    out = self.attn(windows, mask=mask).view(-1, window_h, window_w, channels)
    return window_reverse_roll(out, (window_h, window_w), height, width, shift)


def _window_attention_forward(self, x, mask=None):
    windows, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(windows, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    bias = self._get_rel_pos_bias()[0]
    out = attention_core(q, k, v, bias, mask, self.scale, self.attn_drop.p, self.training)
    return self.proj_drop(self.proj(out.transpose(1, 2).reshape(windows, n, -1)))


def recognise(original: type) -> dict | str:
    """The fused class's attributes for a timm Swin class, or the reason it has none."""
    if original.__name__ == "SwinTransformerBlock":
        if not callable(getattr(original, "_attn", None)):
            return "it has no _attn method (timm < 0.9 code shape)"
        return {"_attn": _block_attn}
    if original.__name__ == "WindowAttention":
        if not callable(getattr(original, "_get_rel_pos_bias", None)):
            return "it has no _get_rel_pos_bias method (timm < 0.9 code shape)"
        params = tuple(inspect.signature(original.forward).parameters)[1:]
        if params != ("x", "mask"):
            return f"its forward{params} is a code shape fusedops does not know"
        return {"forward": _window_attention_forward}
    return f"{original.__name__} is not a timm Swin class fusedops knows"

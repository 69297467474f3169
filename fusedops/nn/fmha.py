"""The seed runtime's ``FusedSwinFmha``: Swin's attention softmax with the relative position
bias and the shift mask fused, a class with ``.apply`` as the original extension's autograd
Function (``from torchacc.runtime.nn.fmha import FusedSwinFmha`` ports as ``from
fusedops.nn.fmha import FusedSwinFmha``).
"""

from __future__ import annotations

from fusedops.nn._shapes import check_dims
from fusedops.ops.swin_softmax import swin_attention_softmax

__all__ = ["FusedSwinFmha"]


class FusedSwinFmha:
    """Swin's attention softmax with bias and shift mask fused (seed runtime name).

    ``FusedSwinFmha.apply(attn, relative_pos_bias, attn_mask, batch_size, window_num, num_head,
    window_len)``: ``softmax(attn + relative_pos_bias[None] + attn_mask[w][:, None])`` for attn
    (batch_size*window_num, num_head, window_len, window_len), relative_pos_bias (num_head, N, N),
    attn_mask (window_num, N, N) or None. Differentiable in attn and relative_pos_bias.
    """

    @staticmethod
    def apply(attn, relative_pos_bias, attn_mask, batch_size, window_num, num_head, window_len):
        n = window_len
        check_dims(attn, "attn", (batch_size * window_num, num_head, n, n),
                   "batch_size*window_num, num_head, window_len")  # fmt: skip
        if attn_mask is not None:
            check_dims(attn_mask, "attn_mask", (window_num, n, n), "window_num, window_len")
        return swin_attention_softmax(attn, relative_pos_bias, attn_mask)

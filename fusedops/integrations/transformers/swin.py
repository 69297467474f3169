"""Fused Hugging Face transformers Swin / Swinv2 classes (the ``swin`` hook swaps them in).

Each fused class subclasses the model's own class (same constructor, parameters, state_dict and
outputs) and replaces its ``forward``:

- ``SwinLayer`` / ``Swinv2Layer``: the layer's own padding (``maybe_pad``) and shift mask
  (``get_attn_mask``); shift + window partition and window reverse + unshift as the fused gathers
  (``window_partition_roll`` / ``window_reverse_roll``); the rest as the model writes it.
- ``SwinAttention`` (transformers 5.x: q/k/v/o projections and ``SwinRelativePositionBias``;
  4.x: the ``self`` / ``output`` pair) and ``Swinv2SelfAttention`` (cosine attention with the
  continuous position bias): the model's projections, then ``attention_core``, which
  takes the bias and the (nW, N, N) mask separately (the (B*nW, heads, N, N) combined mask is
  never built): ``fusedops.window_attention`` (flash-style, one kernel per direction) when no
  attention weights are asked for, else the products around the fused Swin softmax.

The code shape of each class is recognised from its ``forward`` signature (and, for the layers,
``get_attn_mask``'s, with or without ``device``; for Swinv2's attention, its source); a class of
a shape this module does not know gets no fused subclass (``recognise`` returns the reason), so
a transformers version it does not know keeps its own code.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.nn import functional as F

from fusedops.integrations.transformers.attention import attention_weights_requested
from fusedops.ops.window_attention import attention_core
from fusedops.ops.window_process import window_partition_roll, window_reverse_roll

# ------------------------------------------------------------------------------------------
# Layers: the windowed part shared by every Swin layer.


def _windowed_attention(layer, hidden_states, height, width, attend):
    """hidden_states (B, H, W, C) -> (B, H*W, C): the layer's padding, roll(-shift) + partition
    (one gather), ``attend(windows (B*nW, ws*ws, C), mask) -> (windows, extra)``, reverse +
    roll(+shift) (one gather), crop. Returns (output, extra)."""
    batch, _, _, channels = hidden_states.shape
    hidden_states, pad_values = layer.maybe_pad(hidden_states, height, width)
    _, height_pad, width_pad, _ = hidden_states.shape
    window, shift = layer.window_size, layer.shift_size
    windows = window_partition_roll(hidden_states, window, -shift)
    windows = windows.view(-1, window * window, channels)
    if layer._fusedops_mask_takes_device:
        mask = layer.get_attn_mask(
            height_pad, width_pad, dtype=hidden_states.dtype, device=windows.device
        )
    else:  # early 4.x: get_attn_mask(height, width, dtype), on the CPU
        mask = layer.get_attn_mask(height_pad, width_pad, hidden_states.dtype)
        mask = None if mask is None else mask.to(windows.device)
    out, extra = attend(windows, mask)
    out = out.view(-1, window, window, channels)
    out = window_reverse_roll(out, window, height_pad, width_pad, shift)
    if pad_values[3] > 0 or pad_values[5] > 0:
        out = out[:, :height, :width, :].contiguous()
    return out.view(batch, height * width, channels), extra


def _pre_norm_attention(layer, hidden_states, input_dimensions, always_partition, attend):
    """Swin (v1) layer's first half: LayerNorm, windowed attention, drop path, residual.
    Returns (hidden states (B, H*W, C), extra)."""
    if not always_partition:
        layer.set_shift_and_window_size(input_dimensions)
    height, width = input_dimensions
    batch, _, channels = hidden_states.size()
    normed = layer.layernorm_before(hidden_states).view(batch, height, width, channels)
    attention, extra = _windowed_attention(layer, normed, height, width, attend)
    return hidden_states + layer.drop_path(attention), extra


def _swin_layer_forward(self, hidden_states, input_dimensions, always_partition=False, **kwargs):
    # transformers 5.x SwinLayer: pre-norm, mlp, hidden dropout on the attention windows.
    def attend(windows, mask):
        out, weights = self.attention(windows, mask, **kwargs)
        return self.dropout(out), weights

    hidden_states, weights = _pre_norm_attention(
        self, hidden_states, input_dimensions, always_partition, attend
    )
    mlp_output = self.mlp(self.layernorm_after(hidden_states))
    return self.dropout(mlp_output) + hidden_states, weights


def _swin_layer_forward_v4(
    self, hidden_states, input_dimensions, head_mask=None, output_attentions=False,
    always_partition=False,
):  # fmt: skip
    # transformers 4.x SwinLayer: pre-norm, intermediate/output, tuple outputs.
    def attend(windows, mask):
        outputs = self.attention(windows, mask, head_mask, output_attentions=output_attentions)
        return outputs[0], outputs[1:]

    hidden_states, extra = _pre_norm_attention(
        self, hidden_states, input_dimensions, always_partition, attend
    )
    mlp_output = self.output(self.intermediate(self.layernorm_after(hidden_states)))
    layer_output = hidden_states + mlp_output
    return (layer_output, *extra) if output_attentions else (layer_output,)


def _swinv2_layer(self, hidden_states, input_dimensions, head_mask, output_attentions):
    # Swinv2Layer (4.x and 5.x): post-norm, intermediate/output, tuple outputs.
    height, width = input_dimensions
    batch, _, channels = hidden_states.size()
    shortcut = hidden_states
    extra_args = () if head_mask is _NO_HEAD_MASK else (head_mask,)

    def attend(windows, mask):
        outputs = self.attention(windows, mask, *extra_args, output_attentions=output_attentions)
        return outputs[0], outputs[1:]

    maps = hidden_states.view(batch, height, width, channels)
    attention, extra = _windowed_attention(self, maps, height, width, attend)
    hidden_states = shortcut + self.drop_path(self.layernorm_before(attention))
    layer_output = self.output(self.intermediate(hidden_states))
    layer_output = hidden_states + self.drop_path(self.layernorm_after(layer_output))
    return (layer_output, *extra) if output_attentions else (layer_output,)


_NO_HEAD_MASK = object()  # transformers 5.x: the attention takes no head_mask argument


def _swinv2_layer_forward(self, hidden_states, input_dimensions, output_attentions=False):
    return _swinv2_layer(self, hidden_states, input_dimensions, _NO_HEAD_MASK, output_attentions)


def _swinv2_layer_forward_v4(
    self, hidden_states, input_dimensions, head_mask=None, output_attentions=False
):
    return _swinv2_layer(self, hidden_states, input_dimensions, head_mask, output_attentions)


# ------------------------------------------------------------------------------------------
# Attention.


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B*nW, N, heads*d) -> (B*nW, heads, N, d)."""
    return x.view(*x.shape[:-1], heads, -1).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B*nW, heads, N, d) -> (B*nW, N, heads*d)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def _table_bias(table: torch.Tensor, index: torch.Tensor, window: tuple[int, int]):
    """(heads, N, N) bias from a (positions, heads) table and the (N, N) relative index."""
    n = window[0] * window[1]
    return table[index.reshape(-1)].view(n, n, -1).permute(2, 0, 1)


def _attend_with_weights(q, k, v, bias, mask, scale, dropout_p, training, need_weights):
    """``attention_core``'s output and weights, the weights None unless ``need_weights``."""
    out = attention_core(q, k, v, bias, mask, scale, dropout_p, training, need_weights)
    return out if need_weights else (out, None)


def _swin_attention_forward(self, hidden_states, attention_mask=None, **kwargs):
    # transformers 5.x SwinAttention: q/k/v/o projections, SwinRelativePositionBias.
    heads = self.num_attention_heads
    q = _heads(self.q_proj(hidden_states), heads)
    k = _heads(self.k_proj(hidden_states), heads)
    v = _heads(self.v_proj(hidden_states), heads)
    bias = self.relative_position_bias()[0]
    out, weights = _attend_with_weights(
        q, k, v, bias, attention_mask, self.scaling, self.attention_dropout, self.training,
        need_weights=attention_weights_requested(self, kwargs),
    )  # fmt: skip
    return self.o_proj(_merge_heads(out)), weights


def _swin_attention_forward_v4(
    self, hidden_states, attention_mask=None, head_mask=None, output_attentions=False
):
    # transformers 4.x SwinAttention: SwinSelfAttention (query/key/value, bias table) + output.
    inner = self.self
    if head_mask is not None:  # not fused: the model's own code
        return self._fusedops_original.forward(
            self, hidden_states, attention_mask, head_mask, output_attentions
        )
    heads = inner.num_attention_heads
    q = _heads(inner.query(hidden_states), heads)
    k = _heads(inner.key(hidden_states), heads)
    v = _heads(inner.value(hidden_states), heads)
    bias = _table_bias(
        inner.relative_position_bias_table, inner.relative_position_index, inner.window_size
    )
    out, probs = _attend_with_weights(
        q, k, v, bias, attention_mask, inner.attention_head_size**-0.5, inner.dropout.p,
        inner.training, need_weights=output_attentions,
    )  # fmt: skip
    attention_output = self.output(_merge_heads(out), hidden_states)
    return (attention_output, probs) if output_attentions else (attention_output,)


def _swinv2_attention(self, hidden_states, attention_mask, output_attentions):
    # Swinv2SelfAttention: cosine attention scaled per head, 16 * sigmoid(continuous bias).
    heads = self.num_attention_heads
    logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()  # (heads, 1, 1)
    q = F.normalize(_heads(self.query(hidden_states), heads), dim=-1) * logit_scale
    k = F.normalize(_heads(self.key(hidden_states), heads), dim=-1)
    v = _heads(self.value(hidden_states), heads)
    table = self.continuous_position_bias_mlp(self.relative_coords_table).view(-1, heads)
    bias = 16 * torch.sigmoid(_table_bias(table, self.relative_position_index, self.window_size))
    if attention_mask is not None and self._fusedops_mask_scale != 1:
        attention_mask = attention_mask * self._fusedops_mask_scale
    out, probs = _attend_with_weights(
        q, k, v, bias, attention_mask, 1.0, self.dropout.p, self.training,
        need_weights=output_attentions,
    )  # fmt: skip
    return (_merge_heads(out), probs) if output_attentions else (_merge_heads(out),)


def _swinv2_attention_forward(self, hidden_states, attention_mask=None, output_attentions=False):
    return _swinv2_attention(self, hidden_states, attention_mask, output_attentions)


def _swinv2_attention_forward_v4(
    self, hidden_states, attention_mask=None, head_mask=None, output_attentions=False
):
    if head_mask is not None:  # not fused: the model's own code
        return self._fusedops_original.forward(
            self, hidden_states, attention_mask, head_mask, output_attentions
        )
    return _swinv2_attention(self, hidden_states, attention_mask, output_attentions)


# ------------------------------------------------------------------------------------------
# Recognising a class's code shape.

_V4_LAYER = ("hidden_states", "input_dimensions", "head_mask", "output_attentions")
_V4_ATTENTION = ("hidden_states", "attention_mask", "head_mask", "output_attentions")

#: class name -> {forward's parameters (after self): fused forward}
SHAPES = {
    "SwinLayer": {
        ("hidden_states", "input_dimensions", "always_partition", "kwargs"): _swin_layer_forward,
        _V4_LAYER: _swin_layer_forward_v4,
        (*_V4_LAYER, "always_partition"): _swin_layer_forward_v4,
    },
    "SwinAttention": {
        ("hidden_states", "attention_mask", "kwargs"): _swin_attention_forward,
        _V4_ATTENTION: _swin_attention_forward_v4,
    },
    "Swinv2Layer": {
        ("hidden_states", "input_dimensions", "output_attentions"): _swinv2_layer_forward,
        _V4_LAYER: _swinv2_layer_forward_v4,
    },
    "Swinv2SelfAttention": {
        ("hidden_states", "attention_mask", "output_attentions"): _swinv2_attention_forward,
        _V4_ATTENTION: _swinv2_attention_forward_v4,
    },
}

#: get_attn_mask's parameters (after self) in the layers -> whether it takes ``device``.
MASK_SIGNATURES = {
    ("height", "width", "dtype", "device"): True,
    ("height", "width", "dtype"): False,
}

_MASK_TERM = "attention_mask.unsqueeze(1).unsqueeze(0)"


def _swinv2_mask_scale(original: type) -> float | str:
    """How many times Swinv2SelfAttention adds the mask to the scores: transformers adds it
    twice (4.x and 5.x); the fused softmax gets the mask scaled the same way, or a reason."""
    try:
        count = inspect.getsource(original.forward).count(_MASK_TERM)
    except (OSError, TypeError) as exc:
        return f"its source is not available ({exc})"
    if count not in (1, 2):
        return f"its forward adds the mask {count} times (expected 1 or 2)"
    return float(count)


def recognise(original: type) -> dict | str:
    """The fused class's attributes (``forward``, ...) for a transformers Swin class, or the
    reason it has no fused version."""
    shapes = SHAPES.get(original.__name__)
    if shapes is None:
        return f"{original.__name__} is not a Swin class fusedops knows"
    params = tuple(inspect.signature(original.forward).parameters)[1:]
    forward = shapes.get(params)
    if forward is None:
        return f"its forward{params} is a code shape fusedops does not know"
    attributes = {"forward": forward}
    if original.__name__.endswith("Layer"):
        mask_params = tuple(inspect.signature(original.get_attn_mask).parameters)[1:]
        if mask_params not in MASK_SIGNATURES:
            return f"its get_attn_mask{mask_params} is a signature fusedops does not know"
        attributes["_fusedops_mask_takes_device"] = MASK_SIGNATURES[mask_params]
    if original.__name__ == "Swinv2SelfAttention":
        scale = _swinv2_mask_scale(original)
        if isinstance(scale, str):
            return scale
        attributes["_fusedops_mask_scale"] = scale
    return attributes

"""fusedops' window attention as a Hugging Face ``transformers`` attention implementation.

    from fusedops.integrations.transformers import register_attention
    register_attention()                      # once, before building or running the model
    model = SwinForImageClassification(config)   # config._attn_implementation = "fusedops"
    model = AutoModel.from_pretrained(name, attn_implementation="fusedops")

Registration is explicit: importing fusedops never imports transformers, and this module imports
it only when ``register_attention`` is called. It adds ``"fusedops"`` to transformers'
``AttentionInterface`` (and to ``AttentionMaskInterface`` with transformers' eager float mask, so
models that build their masks through ``masking_utils`` pass a bias-style float mask).

What each call runs (``attention_forward``): ``fusedops.window_attention`` on q, k, v
``(B, H, N, d)`` with the model's float mask ``m`` (broadcastable to ``(B, H, N, N)``) mapped as:

- ``m`` shared by the batch (``m.shape[0] == 1``, e.g. Swin's or BEiT's relative position bias):
  ``relative_pos_bias = m[0]`` (expanded over heads), its gradient summed over the batch;
- ``m`` per batch element, shared by heads and constant (e.g. a padding mask): ``attn_mask``
  with ``nW = B``;
- otherwise (per batch element and head, or learned per batch element: HF Swin's shifted blocks
  pass ``bias + shift mask`` already combined to ``(B*nW, H, N, N)``): heads and batch are
  folded into one window of ``B*H`` heads whose ``relative_pos_bias`` is ``m``, so ``m`` gets
  its exact gradient. This path reads the model's materialised mask; the bias-and-mask-apart
  path that reads ``(H, N, N)`` and ``(nW, N, N)`` only is the Swin hook
  (``fusedops.hooks.enable_fused_swin``).

Inputs the op cannot take go to transformers' ``sdpa`` implementation (softcap and attention
sinks, which sdpa ignores or refuses, and calls asked for attention weights, which sdpa does not
return, to the model file's own ``eager_attention_forward``), with one warning per reason:
attention dropout in training, a boolean mask, causal attention, query and key lengths that
differ, N > 256, head dims outside {16, 32, 64, 128}, grouped key/value heads, softcap / sliding
window / attention sinks / paged cache, attention weights asked for (``output_attentions``),
dtypes other than fp16/bf16/fp32 or q, k, v dtypes that differ (autocast: sdpa casts them).
"""

from __future__ import annotations

import sys
import warnings

import torch

from fusedops.ops.window_attention import unsupported_reasons, window_attention

#: The attn_implementation name this module registers.
NAME = "fusedops"
#: Keyword arguments of the attention interface the op cannot honour when set.
_UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "sinks", "cache")
#: The ones transformers' sdpa ignores or refuses too: the model file's eager attention runs.
_EAGER_KWARGS = ("softcap", "s_aux", "sinks")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_warned: set[tuple[str, str]] = set()


def register_attention(name: str = NAME) -> None:
    """Register ``attention_forward`` as transformers attention implementation ``name``
    (idempotent). Afterwards ``attn_implementation=name`` selects it."""
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, eager_mask)


def attention_weights_requested(module, kwargs: dict) -> bool:
    """Whether a transformers attention call must return its weights: ``output_attentions``
    passed down, else the module's ``config.output_attentions`` (transformers 5.x records
    attentions asked for in the config without passing the value down)."""
    requested = kwargs.get("output_attentions")
    if requested is None:
        requested = getattr(getattr(module, "config", None), "output_attentions", False)
    return bool(requested)


def _is_causal(module, query, mask, kwargs) -> bool:
    """Whether transformers' sdpa would run this call causally (its own rule)."""
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return bool(is_causal) and mask is None and query.shape[2] > 1


def _fallback_reason(module, query, key, value, mask, dropout, causal, kwargs) -> str | None:
    """Why ``window_attention`` cannot compute this call (None: it can)."""
    batch, heads, n, d = query.shape
    if dropout:
        return "attention dropout (training with attention_probs_dropout_prob > 0)"
    if causal:
        return "causal attention"
    if attention_weights_requested(module, kwargs):
        return "attention weights asked for (output_attentions)"
    if query.dtype not in _FLOAT_DTYPES:
        return f"dtype {query.dtype}"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return f"query/key/value dtypes differ ({query.dtype}, {key.dtype}, {value.dtype})"
    if key.shape != query.shape or value.shape != query.shape:
        return "key/value shapes differ from the query's (grouped heads, or cached keys)"
    limits = unsupported_reasons("reference", query, key, value)  # what no backend takes
    if limits:
        return "; ".join(limits)
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS):
        return "softcap / sliding window / attention sinks / paged cache"
    if mask is None:
        return None
    if not mask.is_floating_point():
        return f"{mask.dtype} mask (the op takes additive float masks)"
    if mask.dtype not in (*_FLOAT_DTYPES, query.dtype):
        return f"{mask.dtype} mask with {query.dtype} queries"
    if (
        mask.dim() != 4
        or mask.shape[-2:] != (n, n)
        or mask.shape[0] not in (1, batch)
        or mask.shape[1] not in (1, heads)
    ):
        return f"mask of shape {tuple(mask.shape)}"
    return None


def _fallback(module, kwargs):
    """(function, name) that computes a call the op cannot: transformers' sdpa, or for what sdpa
    does not do either (softcap, attention sinks, returning the weights) the model file's own
    ``eager_attention_forward``."""
    eager_only = any(kwargs.get(name) is not None for name in _EAGER_KWARGS)
    if eager_only or attention_weights_requested(module, kwargs):
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is not None:
            return eager, "eager"
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward, "sdpa"


def _warn_once(reason: str, fallback: str) -> None:
    if (reason, fallback) not in _warned:
        _warned.add((reason, fallback))
        warnings.warn(
            f"fusedops attention: {reason}; such calls run transformers' {fallback} attention",
            stacklevel=3,
        )


def _attend(query, key, value, mask, scaling):
    """window_attention on (B, H, N, d) with an additive float mask broadcastable to
    (B, H, N, N); returns (B, H, N, d)."""
    batch, heads, n, d = query.shape
    if mask is None:
        return window_attention(query, key, value, None, None, scaling)
    if mask.shape[0] == 1:
        return window_attention(query, key, value, mask[0].expand(heads, n, n), None, scaling)
    if mask.shape[1] == 1 and not mask.requires_grad:
        return window_attention(query, key, value, None, mask[:, 0], scaling)
    folded = [t.reshape(1, batch * heads, n, d) for t in (query, key, value)]
    bias = mask.expand(batch, heads, n, n).reshape(batch * heads, n, n)
    return window_attention(*folded, bias, None, scaling).view(batch, heads, n, d)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: query, key, value ``(B, H, N, d)``,
    attention_mask an additive float mask broadcastable to ``(B, H, N, N)`` (or None).
    Returns ``(output (B, N, H, d), None)`` like transformers' sdpa implementation (the
    fallback's weights where one runs: the eager one's when weights are asked for)."""
    causal = _is_causal(module, query, attention_mask, kwargs)
    position_bias = kwargs.get("position_bias")
    mergeable = attention_mask is None or attention_mask.is_floating_point()
    if position_bias is not None and not causal and mergeable:
        # T5-style position bias: one additive mask with the model's own
        kwargs = {key: value for key, value in kwargs.items() if key != "position_bias"}
        if attention_mask is not None:
            position_bias = position_bias + attention_mask
        attention_mask = position_bias
    reason = _fallback_reason(module, query, key, value, attention_mask, dropout, causal, kwargs)
    if reason is not None:
        fallback, fallback_name = _fallback(module, kwargs)
        _warn_once(reason, fallback_name)
        return fallback(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return _attend(query, key, value, attention_mask, scale).transpose(1, 2), None

"""Fused forwards for the RMSNorm classes of model libraries, one per variant of their math.

transformers copies one RMSNorm into many model files (``LlamaRMSNorm``, ``Qwen2RMSNorm``,
``T5LayerNorm``, ...). Their forwards fall into a few variants (docs/ops.md, "RMSNorm classes
of model libraries"); each variant below reproduces its classes' output dtype and rounding
points through ``fusedops.rms_norm`` (statistics and the weight multiply in fp32):

- ``llama``: ``weight * (x.float() * rstd).to(x.dtype)``: xhat rounded to x's dtype, then the
  weight multiply in promote(x, weight) (fp32 for a bf16 x with an fp32 weight).
- ``t5``: ``x * rstd`` in fp32, rounded to the weight's dtype when that is fp16/bf16, then
  ``weight *`` (fp32 output with an fp32 weight, whatever x's dtype).
- ``fp32_weight``: ``(weight.float() * x.float() * rstd).to(x.dtype)``; a class built with
  ``with_scale=False`` has no weight.
- ``unweighted``: ``(x.float() * rstd).to(x.dtype)``; a ``weight`` buffer, if any, is unused.
- ``gemma``: ``(x.float() * rstd * (1 + weight.float())).to(x.dtype)``: the fp32
  ``1 + weight`` vector is the fused op's weight (the same rounding as the original).

The eps attribute is ``variance_epsilon`` (Llama, T5 families) or ``eps``. Which class has which
variant is listed in ``rms_norm_classes.json`` beside this module.
"""

from __future__ import annotations

import torch

from fusedops.nn import _fused_class
from fusedops.ops.layer_norm import rms_norm

_HALF = (torch.float16, torch.bfloat16)


def _eps(module) -> float:
    eps = module.__dict__.get("variance_epsilon")
    return module.eps if eps is None else eps


def _llama(self, hidden_states: torch.Tensor) -> torch.Tensor:
    x, weight = hidden_states, self.weight
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    return rms_norm(x, x.shape[-1:], weight, _eps(self), out_dtype=out_dtype, xhat_dtype=x.dtype)


def _t5(self, hidden_states: torch.Tensor) -> torch.Tensor:
    x, weight = hidden_states, self.weight
    if weight.dtype in _HALF:
        out_dtype = xhat_dtype = weight.dtype
    else:  # x * rstd is fp32 (fp64 for fp64 x): no rounding, promoted with the weight
        xhat_dtype = None
        out_dtype = torch.promote_types(weight.dtype, torch.promote_types(x.dtype, torch.float32))
    return rms_norm(x, x.shape[-1:], weight, _eps(self), out_dtype=out_dtype, xhat_dtype=xhat_dtype)


def _fp32_weight(self, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states
    weight = self.weight if getattr(self, "with_scale", True) else None
    return rms_norm(x, x.shape[-1:], weight, _eps(self))


def _unweighted(self, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states
    return rms_norm(x, x.shape[-1:], None, _eps(self))


def _gemma(self, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states
    return rms_norm(x, x.shape[-1:], 1.0 + self.weight.float(), _eps(self))


#: variant name -> the fused forward of its classes.
FORWARDS = {
    "llama": _llama,
    "t5": _t5,
    "fp32_weight": _fp32_weight,
    "unweighted": _unweighted,
    "gemma": _gemma,
}


def fused_subclass(original: type, variant: str) -> type:
    """The fused subclass of the RMSNorm class ``original`` whose math is ``variant`` (a key
    of ``FORWARDS``): same name, constructor, parameters, eps attribute and state_dict; input
    (..., hidden) in any float dtype, output in the dtype the original returns."""
    try:
        forward = FORWARDS[variant]
    except KeyError:
        raise ValueError(f"variant must be one of {', '.join(FORWARDS)}, got {variant!r}") from None
    computed_by = f"fusedops.rms_norm ({variant})"
    return _fused_class.fused_subclass(original, {"forward": forward}, computed_by)

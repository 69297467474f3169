"""LayerNorm and RMSNorm modules: subclasses of the torch modules, only ``forward`` replaced.

Same constructor (``normalized_shape``, ``eps``, ``elementwise_affine``, ``bias``, ``device``,
``dtype``), parameters, state_dict keys and repr as ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm``;
``isinstance(m, <torch class>)`` holds. The layer_norm / rms_norm hooks install these classes.
"""

from __future__ import annotations

import torch
from torch import nn

from fusedops.ops.layer_norm import layer_norm, rms_norm

__all__ = ["LayerNorm", "RMSNorm"]

# The torch classes as they were when this module was first imported (before any hook patched
# torch.nn; the hooks import this module before they replace anything).
_TorchLayerNorm = nn.modules.normalization.LayerNorm
_TorchRMSNorm = nn.modules.normalization.RMSNorm


class LayerNorm(_TorchLayerNorm):
    """``torch.nn.LayerNorm`` computed by ``fusedops.layer_norm``.

    Input (..., *normalized_shape) float16/bfloat16/float32; output: same shape and dtype.
    """

    _fusedops_fused = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(_TorchRMSNorm):
    """``torch.nn.RMSNorm`` computed by ``fusedops.rms_norm`` (eps=None: finfo(x.dtype).eps).

    Input (..., *normalized_shape) float16/bfloat16/float32; output: same shape and dtype.
    """

    _fusedops_fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

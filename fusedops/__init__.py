"""fusedops: drop-in fused Triton/CUDA kernels for PyTorch training.

Functional API (``fusedops.quick_gelu``, ...), modules (``fusedops.nn``), hooks
(``fusedops.hooks``), backend choice (``fusedops.use_backend``). Attributes load on first
access: ``import fusedops`` imports neither torch, triton nor JAX and initialises nothing, so
``fusedops.hooks`` can be enabled before ``import torch``.
"""

from __future__ import annotations

from fusedops._lazy import lazy_module

__version__ = "0.1.0"

_ATTRIBUTES = {
    "quick_gelu": "fusedops.ops.quick_gelu",
    "layer_norm": "fusedops.ops.layer_norm",
    "rms_norm": "fusedops.ops.layer_norm",
    "use_backend": "fusedops.dispatch",
    "bias_dropout_add": "fusedops.ops.bias_dropout_add",
    "bias_dropout_add_fused_train": "fusedops.ops.bias_dropout_add",
    "bias_dropout_add_fused_inference": "fusedops.ops.bias_dropout_add",
    "BackendUnavailableError": "fusedops.dispatch",
    "replace_modules": "fusedops.hooks",
    "window_attention": "fusedops.ops.window_attention",
    "window_partition_roll": "fusedops.ops.window_process",
    "window_reverse_roll": "fusedops.ops.window_process",
    "swin_attention_softmax": "fusedops.ops.swin_softmax",
    "nms": "fusedops.ops.nms",
    "batched_nms": "fusedops.ops.nms",
    "nms_normal": "fusedops.ops.nms",
    "soft_nms": "fusedops.ops.nms",
    "batched_soft_nms": "fusedops.ops.nms",
    "auto_checkpoint": "fusedops.utils.checkpoint",
    "info": "fusedops._info",
    "deform_conv2d": "fusedops.ops.deform_conv2d",
}
_SUBMODULES = (
    "dispatch",
    "hooks",
    "integrations",
    "io",
    "kernels",
    "nn",
    "ops",
    "optim",
    "testing",
    "utils",
    "xla",
)

__all__ = sorted(_ATTRIBUTES) + list(_SUBMODULES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES, _SUBMODULES)

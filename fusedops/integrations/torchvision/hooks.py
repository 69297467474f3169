"""torchvision's contributions to the hooks: the "nms" hook replaces ``torchvision.ops.nms`` and
``torchvision.ops.batched_nms`` (and their ``torchvision.ops.boxes`` homes, which torchvision's
own detection models call) by ``fusedops.nms`` / ``fusedops.batched_nms``: same signatures,
same results. ``fusedops.integrations.mmcv`` adds mmcv's NMS functions to the same hook.

The "dcn" hook replaces ``torchvision.ops.deform_conv2d`` (and its ``torchvision.ops.deform_conv``
home, whose global ``DeformConv2d.forward`` calls, so the module runs fusedops too) by
``fusedops.deform_conv2d``: same signature and semantics. ``fusedops.integrations.mmcv`` adds
mmcv's ``modulated_deform_conv2d`` (what ``ModulatedDeformConv2d`` and its ``Pack`` call).

Enabled before torchvision is imported, the patch lands when ``torchvision.ops`` is imported,
so ``from torchvision.ops import batched_nms`` in detection code gets fusedops' function.
Never imports torch or torchvision.
"""

from __future__ import annotations

from fusedops.hooks import registry  # noqa: F401  (defines the "nms" and "dcn" hooks)
from fusedops.hooks.machinery import Target, contribute, resolve

#: (module, attribute, replacement) patched by the "nms" hook in torchvision.
TORCHVISION_NMS = tuple(
    (module, name, f"fusedops.ops.nms:{name}")
    for module in ("torchvision.ops.boxes", "torchvision.ops")
    for name in ("nms", "batched_nms")
)


def _replacement(fused: str):
    return lambda original: resolve(fused)


def _torchvision_targets(**_) -> list[Target]:
    return [Target(module, attr, _replacement(fused)) for module, attr, fused in TORCHVISION_NMS]


contribute("nms", _torchvision_targets, package="torchvision")


#: (module, attribute, replacement) patched by the "dcn" hook in torchvision.
TORCHVISION_DCN = tuple(
    (module, "deform_conv2d", "fusedops.ops.deform_conv2d:deform_conv2d")
    for module in ("torchvision.ops.deform_conv", "torchvision.ops")
)


def _torchvision_dcn_targets(**_) -> list[Target]:
    return [Target(module, attr, _replacement(fused)) for module, attr, fused in TORCHVISION_DCN]


contribute("dcn", _torchvision_dcn_targets, package="torchvision")

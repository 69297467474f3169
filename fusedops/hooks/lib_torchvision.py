"""Hooks on torchvision: the "nms" hook replaces ``torchvision.ops.nms`` and
``torchvision.ops.batched_nms`` (and their ``torchvision.ops.boxes`` homes, which torchvision's
own detection models call) by ``fusedops.nms`` / ``fusedops.batched_nms``: same signatures,
same results. ``lib_mmcv`` adds mmcv's NMS functions to the same hook.

The "dcn" hook replaces ``torchvision.ops.deform_conv2d`` (and its ``torchvision.ops.deform_conv``
home, whose global ``DeformConv2d.forward`` calls, so the module runs fusedops too) by
``fusedops.deform_conv2d``: same signature and semantics. ``lib_mmcv`` adds mmcv's
``modulated_deform_conv2d`` (what ``ModulatedDeformConv2d`` and its ``Pack`` call).

Enabled before torchvision is imported, the patch lands when ``torchvision.ops`` is imported,
so ``from torchvision.ops import batched_nms`` in detection code gets fusedops' function.
Never imports torch or torchvision.
"""

from __future__ import annotations

from fusedops.hooks.machinery import (
    Hook,
    Target,
    contribute,
    disable,
    enable,
    register_hook,
    resolve,
)

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


register_hook(
    Hook("nms", targets=lambda **_: [], nothing_hint="neither torchvision nor mmcv is installed")
)
contribute("nms", _torchvision_targets, package="torchvision")


#: (module, attribute, replacement) patched by the "dcn" hook in torchvision.
TORCHVISION_DCN = tuple(
    (module, "deform_conv2d", "fusedops.ops.deform_conv2d:deform_conv2d")
    for module in ("torchvision.ops.deform_conv", "torchvision.ops")
)


def _torchvision_dcn_targets(**_) -> list[Target]:
    return [Target(module, attr, _replacement(fused)) for module, attr, fused in TORCHVISION_DCN]


register_hook(
    Hook("dcn", targets=lambda **_: [], nothing_hint="neither torchvision nor mmcv is installed")
)
contribute("dcn", _torchvision_dcn_targets, package="torchvision")


def enable_fused_dcn() -> None:
    """Replace torchvision's ``deform_conv2d`` (so ``DeformConv2d`` too) and mmcv's
    ``modulated_deform_conv2d`` (so ``ModulatedDeformConv2d`` and ``ModulatedDeformConv2dPack``)
    by fusedops' deformable convolution, now or when they are imported."""
    enable("dcn")


def disable_fused_dcn() -> None:
    """Restore the deformable convolutions ``enable_fused_dcn`` replaced."""
    disable("dcn")


def enable_fused_nms() -> None:
    """Replace torchvision's ``nms`` / ``batched_nms`` (``torchvision.ops`` and
    ``torchvision.ops.boxes``) and mmcv's ``nms`` / ``soft_nms`` / ``batched_nms``
    (``mmcv.ops`` and ``mmcv.ops.nms``) by fusedops' versions, now or when they are imported
    (only the installed libraries; with neither, the hook warns that it has nothing to patch)."""
    enable("nms")


def disable_fused_nms() -> None:
    """Restore the NMS functions ``enable_fused_nms`` replaced."""
    disable("nms")

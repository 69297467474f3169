"""mmcv's contributions to the hooks: its NMS functions in the "nms" hook: ``nms``, ``soft_nms``
and ``batched_nms`` in ``mmcv.ops`` and in the ``mmcv.ops.nms`` module (where mmcv's own
``batched_nms`` looks them up, and where mmdet imports them from).

The replacements keep mmcv's signatures and results: numpy inputs give numpy outputs; mmcv's
deprecated ``iou_thr`` (argument or ``nms_cfg`` key) is ``iou_threshold``, with mmcv's warning;
``batched_nms(boxes, scores, idxs, nms_cfg, class_agnostic=False)`` runs fusedops for
``type="nms"`` and ``"soft_nms"`` on (x1, y1, x2, y2) boxes and calls mmcv's own function for
anything else.

The "dcn" hook: ``modulated_deform_conv2d`` in ``mmcv.ops.modulated_deform_conv`` (the global
``ModulatedDeformConv2d.forward`` and ``ModulatedDeformConv2dPack.forward`` call) and in
``mmcv.ops``, by ``fusedops.deform_conv2d`` (mmcv's offset layout is torchvision's).
Never imports torch, mmcv or fusedops' ops until a replacement runs.
"""

from __future__ import annotations

import warnings

from fusedops.hooks import registry  # noqa: F401  (defines the "nms" and "dcn" hooks)
from fusedops.hooks.machinery import Target, contribute

#: mmcv runs one soft-NMS over all classes below this many boxes (its default ``split_thr``).
MMCV_SPLIT_THRESHOLD = 10000


def _numpy_aware(function, boxes, scores, *args):
    """``function(boxes, scores, *args) -> (dets, inds)`` on tensors; numpy arrays in, out."""
    import torch

    if isinstance(boxes, torch.Tensor):
        return function(boxes, scores, *args)
    dets, inds = function(torch.from_numpy(boxes), torch.as_tensor(scores), *args)
    return dets.numpy(), inds.numpy()


def _renamed(function: str, options: dict) -> dict:
    """``options`` with mmcv's deprecated ``iou_thr`` as ``iou_threshold`` (warning as mmcv's
    ``deprecated_api_warning`` does); any other unknown keyword is a TypeError."""
    unknown = set(options) - {"iou_thr", "iou_threshold"}
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {min(unknown)!r}")
    if "iou_thr" not in options:
        return options
    if options.get("iou_threshold") is not None:
        raise TypeError(f"{function}() got both iou_thr and iou_threshold; iou_thr is deprecated")
    warnings.warn(
        f'"iou_thr" is deprecated in `{function}`, please use "iou_threshold" instead',
        stacklevel=3,
    )
    options = dict(options)
    options["iou_threshold"] = options.pop("iou_thr")
    return options


def nms(boxes, scores, iou_threshold=None, offset=0, score_threshold=0, max_num=-1, **deprecated):
    """``mmcv.ops.nms`` on fusedops: ``(dets (K, 5), inds (K,))``."""
    from fusedops.ops.nms import nms_normal

    iou_threshold = _renamed("nms", {"iou_threshold": iou_threshold, **deprecated})["iou_threshold"]
    if iou_threshold is None:
        raise TypeError("nms() missing iou_threshold")
    options = (iou_threshold, offset, score_threshold, max_num)
    return _numpy_aware(nms_normal, boxes, scores, *options)


def soft_nms(
    boxes, scores, iou_threshold=None, sigma=0.5, min_score=1e-3, method="linear", offset=0,
    **deprecated,
):  # fmt: skip
    """``mmcv.ops.soft_nms`` on fusedops (on the boxes' device): ``(dets (K, 5), inds (K,))``;
    iou_threshold defaults to 0.3."""
    from fusedops.ops.nms import soft_nms as fused_soft_nms

    given = _renamed("soft_nms", {"iou_threshold": iou_threshold, **deprecated})["iou_threshold"]
    options = (0.3 if given is None else given, sigma, min_score, method, offset)
    return _numpy_aware(fused_soft_nms, boxes, scores, *options)


def batched_nms_replacing(original):
    """``mmcv.ops.batched_nms`` on fusedops, falling back to ``original`` (mmcv's)."""

    def batched_nms(boxes, scores, idxs, nms_cfg, class_agnostic=False):
        if nms_cfg is None or boxes.size(-1) != 4:
            return original(boxes, scores, idxs, nms_cfg, class_agnostic)
        cfg = dict(nms_cfg)
        class_agnostic = cfg.pop("class_agnostic", class_agnostic)
        kind = cfg.pop("type", "nms")
        split_thr = cfg.pop("split_thr", MMCV_SPLIT_THRESHOLD)
        max_num = cfg.pop("max_num", -1)
        if kind not in ("nms", "soft_nms"):
            return original(boxes, scores, idxs, nms_cfg, class_agnostic)
        if "iou_thr" in cfg:  # mmcv's nms functions take the deprecated name (with a warning)
            thresholds = {k: cfg.pop(k) for k in ("iou_thr", "iou_threshold") if k in cfg}
            cfg.update(_renamed(kind, thresholds))
        import torch

        from fusedops.ops import nms as ops

        groups = torch.zeros_like(idxs) if class_agnostic else idxs
        if kind == "nms":
            return ops.nms_with_options(boxes, scores, groups, max_num=max_num, **cfg)
        chosen = None
        if boxes.shape[0] < split_thr:
            # mmcv runs one soft-NMS over every class: only the overall best box is exempt
            # from min_score (per class, each class's best would be).
            passing = scores >= cfg.get("min_score", 1e-3)
            passing[torch.argmax(scores)] = True
            chosen = torch.nonzero(passing).flatten()
            boxes, scores, groups = boxes[chosen], scores[chosen], groups[chosen]
        dets, keep = ops.batched_soft_nms(boxes, scores, groups, **cfg)
        if chosen is not None:
            keep = chosen[keep]
        if max_num > 0:
            dets, keep = dets[:max_num], keep[:max_num]
        return dets, keep

    batched_nms.__doc__ = original.__doc__
    return batched_nms


def _mmcv_targets(**_) -> list[Target]:
    targets = []
    for module in ("mmcv.ops.nms", "mmcv.ops"):
        targets.append(Target(module, "nms", lambda original: nms))
        targets.append(Target(module, "soft_nms", lambda original: soft_nms))
        targets.append(Target(module, "batched_nms", batched_nms_replacing))
    return targets


contribute("nms", targets=_mmcv_targets, package="mmcv")


def modulated_deform_conv2d(
    input, offset, mask, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
    deform_groups=1,
):  # fmt: skip
    """mmcv's ``modulated_deform_conv2d`` on fusedops.deform_conv2d: groups and deform_groups
    must agree with the weight's and offset's shapes (fusedops reads them from the shapes)."""
    from fusedops.ops.deform_conv2d import deform_conv2d

    kh, kw = weight.shape[2:]
    if input.shape[1] != groups * weight.shape[1]:
        raise ValueError(f"groups={groups} does not match weight {tuple(weight.shape)}")
    if offset.shape[1] != 2 * deform_groups * kh * kw:
        raise ValueError(
            f"deform_groups={deform_groups} does not match offset {tuple(offset.shape)}"
        )
    return deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask)


def _mmcv_dcn_targets(**_) -> list[Target]:
    return [
        Target(module, "modulated_deform_conv2d", lambda original: modulated_deform_conv2d)
        for module in ("mmcv.ops.modulated_deform_conv", "mmcv.ops")
    ]


contribute("dcn", targets=_mmcv_dcn_targets, package="mmcv")

"""The NMS family under the seed runtime's module path (``from torchacc.runtime.nn.nms import
nms, nms_normal`` ports as ``from fusedops.nn.nms import nms, nms_normal``): re-exports
(``__reexports__``) of the op module ``fusedops.ops.nms``, their home, also
``fusedops.nms`` etc.

``nms(boxes, scores, iou_threshold)`` and ``batched_nms(boxes, scores, idxs, iou_threshold)``
as torchvision's (kept indices); ``nms_normal(boxes, scores, iou_threshold, offset=0,
score_threshold=0, max_num=-1)``, ``soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5,
min_score=1e-3, method="linear", offset=0)`` and ``batched_soft_nms(boxes, scores, idxs, ...)``
as mmcv's (``(dets, inds)``).
"""

from __future__ import annotations

from fusedops.ops.nms import batched_nms, batched_soft_nms, nms, nms_normal, soft_nms

__all__ = ["nms", "batched_nms", "nms_normal", "soft_nms", "batched_soft_nms"]
__reexports__ = __all__

"""The "nms" hook: torchvision's and mmcv's NMS functions replaced by fusedops'.

torchvision (a CUDA build in the registry) and mmcv cannot be imported here: the hook is tested
against stand-in packages with their module layout and names, whose functions are plain-loop
implementations of the libraries' algorithms (torchvision's batched_nms with its coordinate
trick, mmcv's soft-NMS loop), run in fresh interpreters so no stand-in leaks into this one.
"""

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fusedops
from fusedops import hooks
from fusedops.integrations.mmcv import hooks as lib_mmcv
from fusedops.testing import run_python, write_tree

pytestmark = [
    pytest.mark.usefixtures("restore_hooks"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

_LOOPS = """
import numpy as np
import torch


def greedy(boxes, scores, thr, offset=0):
    b = boxes.float().numpy()
    off = np.float32(offset)
    area = (b[:, 2] - b[:, 0] + off) * (b[:, 3] - b[:, 1] + off)
    order = torch.sort(scores, descending=True, stable=True).indices.numpy()
    removed, keep = np.zeros(len(b), bool), []
    for at, i in enumerate(order):
        if removed[i]:
            continue
        keep.append(i)
        rest = order[at + 1:]
        w = np.maximum(np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0]) + off, 0)
        h = np.maximum(np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1]) + off, 0)
        inter = (w * h).astype(np.float32)
        removed[rest[inter / (area[i] + area[rest] - inter) > np.float32(thr)]] = True
    return torch.tensor(keep, dtype=torch.int64)
"""

_STAND_INS = {
    "torchvision/__init__.py": "from torchvision import ops\n",
    "torchvision/ops/__init__.py": "from torchvision.ops.boxes import batched_nms, nms\n",
    "torchvision/ops/boxes.py": _LOOPS
    + """

def nms(boxes, scores, iou_threshold):
    return greedy(boxes, scores, iou_threshold)


def batched_nms(boxes, scores, idxs, iou_threshold):
    shift = idxs.to(boxes) * (boxes.max() + 1)
    return nms(boxes + shift[:, None], scores, iou_threshold)
""",
    "mmcv/__init__.py": "",
    "mmcv/ops/__init__.py": "from .nms import batched_nms, nms, soft_nms\n",
    "mmcv/ops/nms.py": _LOOPS
    + """

def nms(boxes, scores, iou_threshold, offset=0, score_threshold=0, max_num=-1):
    numpy_in = isinstance(boxes, np.ndarray)
    boxes, scores = torch.as_tensor(boxes), torch.as_tensor(scores)
    valid = torch.nonzero(scores > score_threshold).flatten()
    if score_threshold <= 0:
        valid = torch.arange(len(scores))
    inds = valid[greedy(boxes[valid], scores[valid], iou_threshold, offset)]
    if max_num > 0:
        inds = inds[:max_num]
    dets = torch.cat((boxes[inds], scores[inds, None]), 1)
    return (dets.numpy(), inds.numpy()) if numpy_in else (dets, inds)


def soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method="linear",
             offset=0):
    # one pick per step: the best remaining score moves to the front, the rest decay
    b, s = boxes.float().numpy().copy(), scores.float().numpy().copy()
    off, n = np.float32(offset), len(b)
    index = np.arange(n)
    dets, i = [], 0
    while i < n:
        m = i + int(np.argmax(s[i:n]))
        for a in (b, s, index):
            a[[i, m]] = a[[m, i]]
        dets.append((*b[i], s[i]))
        area = (b[:, 2] - b[:, 0] + off) * (b[:, 3] - b[:, 1] + off)
        rest = np.arange(i + 1, n)
        w = np.maximum(np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0]) + off, 0)
        h = np.maximum(np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1]) + off, 0)
        inter = (w * h).astype(np.float32)
        iou = np.nan_to_num(inter / (area[i] + area[rest] - inter), nan=0.0)
        if method == "gaussian":
            weight = np.exp(-(iou * iou) / np.float32(sigma))
        else:
            low = np.float32(0) if method == "naive" else np.float32(1) - iou
            weight = np.where(iou >= np.float32(iou_threshold), low, np.float32(1))
        s[rest] = s[rest] * weight
        keep = np.concatenate((np.arange(i + 1), rest[s[rest] >= np.float32(min_score)]))
        for a in (b, s, index):
            a[: len(keep)] = a[keep]
        n, i = len(keep), i + 1
    return torch.tensor(np.array(dets, np.float32)).reshape(-1, 5), torch.tensor(index[:n])


def batched_nms(boxes, scores, idxs, nms_cfg, class_agnostic=False):
    cfg = dict(nms_cfg)
    shift = 0 if cfg.pop("class_agnostic", class_agnostic) else idxs.to(boxes) * (boxes.max() + 1)
    run = globals()[cfg.pop("type", "nms")]  # looked up in this module, as mmcv's eval
    dets, keep = run(boxes + (shift if isinstance(shift, int) else shift[:, None]), scores, **cfg)
    return torch.cat((boxes[keep], dets[:, -1:]), 1), keep
""",
    "detector.py": """
import numpy as np
import torch
from mmcv.ops import batched_nms as mmcv_batched_nms
from mmcv.ops import nms as mmcv_nms
from mmcv.ops import soft_nms as mmcv_soft_nms
from torchvision.ops import batched_nms
from torchvision.ops import boxes as box_ops


def inputs(n=300):
    g = torch.Generator().manual_seed(0)
    centres = torch.randint(0, 2048, (n // 10, 2), generator=g) / 8
    xy = centres[torch.randint(0, n // 10, (n,), generator=g)]
    xy = xy + torch.randint(-32, 32, (n, 2), generator=g) / 8
    boxes = torch.cat((xy, xy + torch.randint(40, 300, (n, 2), generator=g) / 8), 1)
    return boxes, torch.rand(n, generator=g), torch.randint(0, 5, (n,), generator=g)


def postprocess(tv_batched, tv_nms, mm_batched, mm_nms, mm_soft):
    boxes, scores, labels = inputs()
    return {
        "tv batched": tv_batched(boxes, scores, labels, 0.5),
        "tv nms": tv_nms(boxes, scores, 0.6),
        "mm nms": mm_batched(boxes, scores, labels, dict(iou_threshold=0.5, score_threshold=0.2)),
        "mm soft": mm_batched(boxes, scores, labels, dict(type="soft_nms", method="gaussian")),
        "mm agnostic": mm_batched(boxes, scores, labels, dict(iou_threshold=0.4),
                                  class_agnostic=True),
        "mm offset": mm_nms(boxes.round(), scores, 0.3, offset=1, max_num=7),
        "mm numpy": mm_nms(boxes.numpy(), scores.numpy(), 0.3),
        "mm linear": mm_soft(boxes, scores, 0.3, min_score=0.05),
    }


def run_imported():
    return postprocess(batched_nms, box_ops.nms, mmcv_batched_nms, mmcv_nms, mmcv_soft_nms)
""",
}

_COMPARE = """
import mmcv.ops, torchvision
def same(a, b):
    a, b = (torch.as_tensor(t) for t in (a if isinstance(a, tuple) else (a,))), (
        torch.as_tensor(t) for t in (b if isinstance(b, tuple) else (b,)))
    return all(x.shape == y.shape and torch.allclose(x.double(), y.double(), atol=1e-6, rtol=0)
               for x, y in zip(a, b))
originals = detector.postprocess(torchvision.ops.batched_nms, torchvision.ops.boxes.nms,
                                 mmcv.ops.batched_nms, mmcv.ops.nms, mmcv.ops.soft_nms)
for name in got:
    print(name, same(got[name], originals[name]))
"""


def _stand_ins(tmp_path: Path) -> Path:
    return write_tree(tmp_path, _STAND_INS)


def _python(code: str, tmp_path: Path, **env: str) -> str:
    done = run_python("-c", textwrap.dedent(code), cwd=tmp_path, path=(tmp_path,), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


_ENABLE_THEN_IMPORT = """
import sys
from fusedops import hooks
hooks.enable_fused_nms()
assert "torch" not in sys.modules
import detector, fusedops, torch
import fusedops.integrations.mmcv.hooks as lib_mmcv
print("tv", detector.batched_nms is fusedops.batched_nms, detector.box_ops.nms is fusedops.nms)
print("mm", detector.mmcv_soft_nms is lib_mmcv.soft_nms,
      sys.modules["mmcv.ops.nms"].nms is lib_mmcv.nms, detector.mmcv_batched_nms.__module__)
got = detector.run_imported()
print("ran on", fusedops.dispatch.last_used)
hooks.disable_fused_nms()
"""


def test_detection_code_gets_fusedops_nms_when_enabled_before_import(tmp_path):
    restored = 'print("restored", torchvision.ops.nms.__module__, mmcv.ops.soft_nms.__module__)'
    out = _python(_ENABLE_THEN_IMPORT + _COMPARE + restored, _stand_ins(tmp_path))
    lines = out.splitlines()
    assert "tv True True" in lines
    assert "mm True True fusedops.integrations.mmcv.hooks" in lines
    assert "ran on {'nms': 'native', 'soft_nms': 'native'}" in lines
    for name in ("tv batched", "tv nms", "mm nms", "mm soft", "mm agnostic", "mm offset"):
        assert f"{name} True" in lines, out
    assert "mm numpy True" in lines and "mm linear True" in lines
    assert "restored torchvision.ops.boxes mmcv.ops.nms" in lines, out


def test_fusedops_hooks_env_enables_the_nms_hook(tmp_path):
    code = """
        import torchvision, mmcv.ops
        from fusedops import hooks
        print(hooks.enabled(), torchvision.ops.batched_nms.__module__,
              torchvision.ops.boxes.nms.__module__, mmcv.ops.batched_nms.__module__)
    """
    out = _python(code, _stand_ins(tmp_path), FUSEDOPS_HOOKS="nms")
    assert "['nms'] fusedops.ops.nms fusedops.ops.nms fusedops.integrations.mmcv.hooks" in out


def test_enable_warns_when_neither_library_is_installed(monkeypatch):
    monkeypatch.setattr(hooks.machinery, "installed", lambda package: False)
    with pytest.warns(UserWarning, match="neither torchvision nor mmcv is installed"):
        hooks.enable_fused_nms()
    assert hooks.enabled() == ["nms"]
    hooks.disable_fused_nms()
    assert hooks.enabled() == []
    monkeypatch.setattr(hooks.machinery, "installed", lambda package: package == "mmcv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hooks.enable_fused_nms()
        hooks.enable_fused_nms()  # idempotent
    assert hooks.enabled() == ["nms"]


def _boxes(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 50
    return torch.cat((xy, xy + 5 + 20 * torch.rand(n, 2, generator=g)), 1), torch.rand(
        n, generator=g
    )


def test_mmcv_batched_nms_falls_back_to_mmcv_for_what_fusedops_does_not_do():
    calls = []

    def original(*args):
        calls.append(args[3])
        return "mmcv"

    replaced = lib_mmcv.batched_nms_replacing(original)
    boxes, scores = _boxes()
    idxs = torch.zeros(60, dtype=torch.int64)
    assert replaced(boxes, scores, idxs, None) == "mmcv"
    assert replaced(boxes, scores, idxs, {"type": "nms_match", "iou_threshold": 0.5}) == "mmcv"
    rotated = torch.cat((boxes, scores[:, None]), 1)
    assert replaced(rotated, scores, idxs, {"iou_threshold": 0.5}) == "mmcv"
    assert len(calls) == 3
    dets, keep = replaced(boxes, scores, idxs, {"iou_threshold": 0.5, "max_num": 3})
    assert keep.tolist() == fusedops.nms(boxes, scores, 0.5)[:3].tolist() and dets.shape == (3, 5)


def test_mmcv_soft_nms_over_classes_exempts_only_the_overall_best_box():
    """mmcv's batched_nms runs one soft-NMS over all classes (below split_thr boxes), so only
    the overall best box escapes min_score; fusedops.batched_soft_nms is soft-NMS per class."""
    boxes, scores = _boxes(8)
    scores[4:] *= 1e-4  # class 1 scores all below min_score
    idxs = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    replaced = lib_mmcv.batched_nms_replacing(lambda *args: None)
    _, keep = replaced(boxes, scores, idxs, {"type": "soft_nms", "min_score": 0.01})
    assert set(keep.tolist()) <= {0, 1, 2, 3}
    _, per_class = fusedops.batched_soft_nms(boxes, scores, idxs, min_score=0.01)
    assert int(torch.argmax(scores[4:])) + 4 in per_class.tolist()
    options = {"type": "soft_nms", "min_score": 0.01, "split_thr": 4}
    _, split = replaced(boxes, scores, idxs, options)
    assert split.tolist() == per_class.tolist()


def test_mmcv_replacements_take_numpy_arrays():
    boxes, scores = _boxes()
    dets, inds = lib_mmcv.nms(boxes.numpy(), scores.numpy(), 0.3, max_num=5)
    assert isinstance(dets, np.ndarray) and isinstance(inds, np.ndarray)
    assert inds.tolist() == fusedops.nms(boxes, scores, 0.3)[:5].tolist()
    dets, inds = lib_mmcv.soft_nms(boxes.numpy(), scores.numpy(), method="naive")
    want_dets, want = fusedops.soft_nms(boxes, scores, method="naive")
    assert inds.tolist() == want.tolist() and np.allclose(dets, want_dets.numpy())


def test_mmcv_adapters_take_mmcvs_deprecated_iou_thr():
    boxes, scores = _boxes()
    deprecated = '"iou_thr" is deprecated in `nms`, please use "iou_threshold" instead'
    with pytest.warns(UserWarning, match=deprecated):
        _, inds = lib_mmcv.nms(boxes, scores, iou_thr=0.3)
    assert inds.tolist() == lib_mmcv.nms(boxes, scores, 0.3)[1].tolist()
    with pytest.warns(UserWarning, match="deprecated in `soft_nms`"):
        _, soft = lib_mmcv.soft_nms(boxes, scores, iou_thr=0.5, method="naive")
    assert soft.tolist() == lib_mmcv.soft_nms(boxes, scores, 0.5, method="naive")[1].tolist()
    replaced = lib_mmcv.batched_nms_replacing(lambda *args: None)
    idxs = torch.zeros(60, dtype=torch.int64)
    with pytest.warns(UserWarning, match="deprecated in `nms`"):
        _, keep = replaced(boxes, scores, idxs, {"iou_thr": 0.5})
    assert keep.tolist() == fusedops.nms(boxes, scores, 0.5).tolist()
    with pytest.raises(TypeError, match="both iou_thr and iou_threshold"):
        lib_mmcv.nms(boxes, scores, 0.3, iou_thr=0.3)
    with pytest.raises(TypeError, match="missing iou_threshold"):
        lib_mmcv.nms(boxes, scores)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sigma'"):
        lib_mmcv.nms(boxes, scores, 0.3, sigma=0.5)

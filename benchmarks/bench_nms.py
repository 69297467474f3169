"""NMS family: fusedops (cuda, triton, reference) vs torchvision.ops and CPU implementations.

Boxes are detection-like: jittered around a few hundred centres of a 1333x800 image (sides 24 to
256 px), scores uniform, classes uniform. NMS time is set by the O(N^2) IoU work and the
sequential picks, not by memory traffic, so rows report milliseconds and the speedup over the
baseline of each op (no GB/s).

GPU part (needs CUDA; default there):
- nms (1 class) and batched_nms (1 and 80 classes) for 1k, 10k and 100k boxes against
  ``torchvision.ops`` on the same GPU (when importable); baseline: torchvision.
- soft_nms (1 class) and batched_soft_nms (80 classes) for 1k, 5k and 20k boxes against the
  reference on the GPU and on the CPU and against mmcv-style CPU code (mmcv's loop in C++,
  compiled here with ``torch.utils.cpp_extension.load_inline`` when a compiler is present);
  baseline: the reference on the CPU.
CPU part (``--parts cpu``; default without a GPU): the CPU path (the reference) against a plain
Python loop, the mmcv/torchvision-style C++ loop, for nms and soft_nms.

Rows append to ``results/<gpu>_nms.csv`` (CPU part: ``results/cpu-nms.csv``); the CPU part's
printed output also goes to ``results/cpu-nms.log``. Run:
``python benchmarks/bench_nms.py [--parts gpu,cpu] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import RESULTS, append_rows, median_ms, print_rows, require_cuda, rotating

import fusedops

IMAGE = (1333.0, 800.0)
SOFT = {"iou_threshold": 0.3, "sigma": 0.5, "min_score": 1e-3}
IOU_THRESHOLD = 0.5
#: CPU providers slower than this (seconds per call) are timed once.
SLOW_CALL_S = 1.0


def detections(n: int, classes: int, device, seed: int = 0):
    """(boxes (n, 4) fp32, scores (n,), idxs (n,)) around min(300, n) centres."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(min(300, n), 2, generator=g) * torch.tensor(IMAGE)
    side = 24 + 232 * torch.rand(min(300, n), 2, generator=g)
    pick = torch.randint(0, centres.shape[0], (n,), generator=g)
    wh = side[pick] * (1 + 0.1 * torch.randn(n, 2, generator=g))
    xy = centres[pick] + 0.08 * side[pick] * torch.randn(n, 2, generator=g) - wh / 2
    boxes = torch.cat((xy, xy + wh.abs()), 1)
    scores = torch.rand(n, generator=g)
    idxs = torch.randint(0, classes, (n,), generator=g)
    return boxes.to(device), scores.to(device), idxs.to(device)


# ------------------------------------------------------------------------------------------
# Comparison implementations.


def python_nms(boxes, scores, iou_threshold):
    """Greedy NMS as a plain Python loop over lists (the code the CPU path replaces)."""
    b, s = boxes.tolist(), scores.tolist()
    order = sorted(range(len(b)), key=lambda i: -s[i])
    area = [(x2 - x1) * (y2 - y1) for x1, y1, x2, y2 in b]
    removed, keep = [False] * len(b), []
    for at, i in enumerate(order):
        if removed[i]:
            continue
        keep.append(i)
        x1, y1, x2, y2 = b[i]
        for j in order[at + 1 :]:
            if removed[j]:
                continue
            w = min(x2, b[j][2]) - max(x1, b[j][0])
            h = min(y2, b[j][3]) - max(y1, b[j][1])
            if w > 0 and h > 0 and w * h / (area[i] + area[j] - w * h) > iou_threshold:
                removed[j] = True
    return keep


def python_soft_nms(boxes, scores, iou_threshold, sigma, min_score, method="linear"):
    """Soft-NMS as a plain Python loop (one pick per step, every other box decayed)."""
    b, s = boxes.tolist(), scores.tolist()
    area = [(x2 - x1) * (y2 - y1) for x1, y1, x2, y2 in b]
    alive, picks = list(range(len(b))), []
    while alive:
        i = max(alive, key=lambda k: s[k])
        picks.append((i, s[i]))
        alive.remove(i)
        x1, y1, x2, y2 = b[i]
        for j in alive:
            w = max(0.0, min(x2, b[j][2]) - max(x1, b[j][0]))
            h = max(0.0, min(y2, b[j][3]) - max(y1, b[j][1]))
            union = area[i] + area[j] - w * h
            iou = w * h / union if union > 0 else 0.0
            if method == "gaussian":
                s[j] *= math.exp(-iou * iou / sigma)
            elif iou >= iou_threshold:
                s[j] *= 0.0 if method == "naive" else 1.0 - iou
        alive = [j for j in alive if s[j] >= min_score]
    return picks


_CPP = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

namespace {
float overlap(const float* a, const float* b) {
  const float w = std::max(0.f, std::min(a[2], b[2]) - std::max(a[0], b[0]));
  const float h = std::max(0.f, std::min(a[3], b[3]) - std::max(a[1], b[1]));
  return w * h;
}
float area(const float* a) { return (a[2] - a[0]) * (a[3] - a[1]); }
}  // namespace

// Greedy NMS one box at a time, as torchvision's and mmcv's CPU kernels do it.
torch::Tensor nms_cpu(torch::Tensor boxes, torch::Tensor scores, double threshold) {
  boxes = boxes.to(torch::kFloat).contiguous();
  const int64_t n = boxes.size(0);
  const torch::Tensor order = std::get<1>(scores.sort(true, 0, true));
  const int64_t* o = order.data_ptr<int64_t>();
  const float* b = boxes.data_ptr<float>();
  std::vector<char> removed(n, 0);
  std::vector<int64_t> keep;
  for (int64_t at = 0; at < n; ++at) {
    const int64_t i = o[at];
    if (removed[i]) continue;
    keep.push_back(i);
    for (int64_t k = at + 1; k < n; ++k) {
      const int64_t j = o[k];
      if (removed[j]) continue;
      const float inter = overlap(b + 4 * i, b + 4 * j);
      if (inter / (area(b + 4 * i) + area(b + 4 * j) - inter) > threshold) removed[j] = 1;
    }
  }
  return torch::tensor(keep, torch::kLong);
}

// Soft-NMS as mmcv's CPU kernel: the best remaining box is swapped to the front, every box
// after it decayed; boxes below min_score are swapped out with the last one.
std::vector<torch::Tensor> soft_nms_cpu(torch::Tensor boxes, torch::Tensor scores,
                                        double threshold, double sigma, double min_score,
                                        int64_t method) {
  torch::Tensor b = boxes.to(torch::kFloat).contiguous().clone();
  torch::Tensor s = scores.to(torch::kFloat).contiguous().clone();
  int64_t n = b.size(0);
  torch::Tensor index = torch::arange(n, torch::kLong);
  float* pb = b.data_ptr<float>();
  float* ps = s.data_ptr<float>();
  int64_t* pi = index.data_ptr<int64_t>();
  std::vector<float> picked;
  auto swap = [&](int64_t x, int64_t y) {
    for (int k = 0; k < 4; ++k) std::swap(pb[4 * x + k], pb[4 * y + k]);
    std::swap(ps[x], ps[y]);
    std::swap(pi[x], pi[y]);
  };
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = i;
    for (int64_t k = i + 1; k < n; ++k) best = ps[k] > ps[best] ? k : best;
    swap(i, best);
    picked.push_back(ps[i]);
    for (int64_t k = i + 1; k < n; ++k) {
      const float inter = overlap(pb + 4 * i, pb + 4 * k);
      const float iou = inter / (area(pb + 4 * i) + area(pb + 4 * k) - inter);
      float weight = 1.f;
      if (method == 2) {
        weight = std::exp(-(iou * iou) / sigma);
      } else if (iou >= threshold) {
        weight = method == 1 ? 1.f - iou : 0.f;
      }
      ps[k] *= weight;
      if (ps[k] < min_score) {
        swap(k, n - 1);
        --n;
        --k;
      }
    }
  }
  return {index.slice(0, 0, n), torch::tensor(picked)};
}
"""


def cpp_functions():
    """The C++ loops above, compiled (None, with the reason printed, if that fails)."""
    try:
        from torch.utils.cpp_extension import load_inline

        build = Path(tempfile.gettempdir()) / "fusedops_bench_nms_cpp"
        build.mkdir(exist_ok=True)
        return load_inline(
            name="fusedops_bench_nms_cpp",
            cpp_sources=_CPP,
            functions=["nms_cpu", "soft_nms_cpu"],
            extra_cflags=["-O3"],
            build_directory=str(build),
        )
    except Exception as exc:  # no compiler / headers: the provider is skipped, said once
        print(f"C++ comparison code not built ({str(exc).splitlines()[0][:120]}); skipped")
        return None


# ------------------------------------------------------------------------------------------
# Providers: (boxes, scores, idxs) -> kept indices.


def fused_nms(boxes, scores, idxs, backend):
    return fusedops.nms(boxes, scores, IOU_THRESHOLD, backend=backend)


def fused_batched_nms(boxes, scores, idxs, backend):
    return fusedops.batched_nms(boxes, scores, idxs, IOU_THRESHOLD, backend=backend)


def fused_soft_nms(boxes, scores, idxs, backend):
    return fusedops.soft_nms(boxes, scores, **SOFT, backend=backend)[1]


def fused_batched_soft_nms(boxes, scores, idxs, backend):
    return fusedops.batched_soft_nms(boxes, scores, idxs, **SOFT, backend=backend)[1]


def torchvision_nms(ops, boxes, scores, idxs):
    return ops.nms(boxes, scores, IOU_THRESHOLD)


def torchvision_batched_nms(ops, boxes, scores, idxs):
    return ops.batched_nms(boxes, scores, idxs, IOU_THRESHOLD)


def cpp_soft_nms(cpp, boxes, scores, idxs):
    """mmcv-style C++ soft-NMS; with classes as mmcv's batched_nms: over class-shifted boxes."""
    if int(idxs.max()) > 0:
        boxes = boxes + idxs[:, None].to(boxes) * (boxes.max() + 1)
    return cpp.soft_nms_cpu(boxes, scores, *SOFT.values(), 1)[0]


def python_nms_provider(boxes, scores, idxs):
    return python_nms(boxes, scores, IOU_THRESHOLD)


def python_soft_nms_provider(boxes, scores, idxs):
    return python_soft_nms(boxes, scores, **SOFT)


def cpp_nms(cpp, boxes, scores, idxs):
    return cpp.nms_cpu(boxes, scores, IOU_THRESHOLD)


# ------------------------------------------------------------------------------------------
# Timing.


def cpu_ms(fn) -> float:
    """Wall time of fn() in ms after a warm-up call: the median of up to 5 runs in ~2 s, or
    the warm-up itself when a call takes longer than SLOW_CALL_S."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    if first > 10 * SLOW_CALL_S:
        return first * 1e3
    times = []
    for _ in range(min(5, max(1, int(2 / max(first, 1e-6))))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if times[-1] > SLOW_CALL_S:
            break
    return sorted(times)[len(times) // 2] * 1e3


def _next(fn, inputs):
    return fn(*inputs())


def row(op, provider, n, classes, ms, baseline_ms, kept):
    speedup = f"{baseline_ms / ms:.2f}" if baseline_ms else ""
    return {
        "op": op,
        "provider": provider,
        "boxes": n,
        "classes": classes,
        "ms": f"{ms:.3f}",
        "x_baseline": speedup,
        "kept": kept,
    }


def measure(op, n, classes, providers, baseline) -> list[dict]:
    """Rows for ``providers`` (name -> (zero-argument call returning the kept indices, its
    timer: median_ms on the GPU, cpu_ms)); speedups against provider ``baseline``."""
    timed = {}
    for name, (call, time_it) in providers.items():
        timed[name] = (time_it(call), len(call()))
    base = timed[baseline][0] if baseline in timed else None
    rows = [row(op, name, n, classes, ms, base, kept) for name, (ms, kept) in timed.items()]
    print_rows(rows)
    return rows


# ------------------------------------------------------------------------------------------
# GPU part.


def _torchvision_ops():
    try:
        import torchvision

        return torchvision.ops
    except Exception as exc:  # not installed / broken build: compared without it
        print(f"torchvision not importable ({type(exc).__name__}); no torchvision rows")
        return None


def gpu_nms_rows(sizes) -> list[dict]:
    tv = _torchvision_ops()
    rows = []
    for n in sizes:
        for op, classes in (("nms", 1), ("batched_nms", 1), ("batched_nms", 80)):
            inputs = rotating(functools.partial(detections, n, classes, "cuda", n), n * 28)
            fused = fused_nms if op == "nms" else fused_batched_nms
            calls = {}
            if tv is not None:
                theirs = torchvision_nms if op == "nms" else torchvision_batched_nms
                calls["torchvision"] = functools.partial(theirs, tv)
            for backend in ("cuda", "triton"):
                calls[f"fusedops-{backend}"] = functools.partial(fused, backend=backend)
            providers = {
                name: (functools.partial(_next, call, inputs), median_ms)
                for name, call in calls.items()
            }
            rows += measure(op, n, classes, providers, "torchvision")
    return rows


def gpu_soft_rows(sizes, cpp) -> list[dict]:
    rows = []
    for n in sizes:
        for op, classes in (("soft_nms", 1), ("batched_soft_nms", 80)):
            gpu = detections(n, classes, "cuda", seed=n)
            cpu = tuple(t.cpu() for t in gpu)
            fused = fused_soft_nms if classes == 1 else fused_batched_soft_nms
            providers = {"reference-cpu": (functools.partial(fused, *cpu, "reference"), cpu_ms)}
            if cpp is not None:
                call = functools.partial(cpp_soft_nms, cpp, *cpu)
                providers["mmcv-style-cpp-cpu"] = (call, cpu_ms)
            for backend in ("cuda", "triton", "reference"):
                name = f"fusedops-{backend}" + ("-gpu" if backend == "reference" else "")
                providers[name] = (functools.partial(fused, *gpu, backend), median_ms)
            rows += measure(op, n, classes, providers, "reference-cpu")
    return rows


# ------------------------------------------------------------------------------------------
# CPU part.


def cpu_rows(nms_sizes, soft_sizes, cpp) -> list[dict]:
    rows = []
    for op, sizes, python_loop, fused, theirs in (
        ("nms", nms_sizes, python_nms_provider, fused_nms, cpp_nms),
        ("soft_nms", soft_sizes, python_soft_nms_provider, fused_soft_nms, cpp_soft_nms),
    ):
        for n in sizes:
            inputs = detections(n, 1, "cpu", seed=n)
            providers = {
                "python-loop": (functools.partial(python_loop, *inputs), cpu_ms),
                "fusedops-reference": (functools.partial(fused, *inputs, "reference"), cpu_ms),
            }
            if cpp is not None:
                providers["cpp-loop"] = (functools.partial(theirs, cpp, *inputs), cpu_ms)
            rows += measure(op, n, 1, providers, "python-loop")
    return rows


def write_cpu_results(rows: list[dict]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "cpu-nms.csv"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    machine = f"{os.cpu_count()}-core {platform.machine()}, torch {torch.__version__}"
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write(",".join(["date", "machine", *rows[0]]) + "\n")
        for r in rows:
            f.write(",".join([stamp, machine, *map(str, r.values())]) + "\n")
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        print_rows(rows)
    with path.with_suffix(".log").open("a") as log:
        log.write(f"{stamp} {machine}, {torch.get_num_threads()} threads\n{table.getvalue()}\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "gpu" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--parts", default=default, help="gpu, cpu or gpu,cpu")
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts == {"gpu"}:
        require_cuda("bench_nms (GPU part)")  # exits cleanly (status 0) without a GPU
    cpp = cpp_functions()
    if "gpu" in parts and not torch.cuda.is_available():
        print("bench_nms: no CUDA device here; GPU part skipped")
    elif "gpu" in parts:
        sizes = [1000] if args.quick else [1000, 10_000, 100_000]
        soft_sizes = [1000] if args.quick else [1000, 5000, 20_000]
        rows = gpu_nms_rows(sizes) + gpu_soft_rows(soft_sizes, cpp)
        print(f"appended to {append_rows(rows, 'nms')}")
    if "cpu" in parts:
        nms_sizes = [500] if args.quick else [500, 1000, 2000, 5000]
        soft_sizes = [500] if args.quick else [500, 1000, 2000]
        rows = cpu_rows(nms_sizes, soft_sizes, cpp)
        print(f"appended to {write_cpu_results(rows)}")


if __name__ == "__main__":
    sys.exit(main())

"""Runtime tools: multi_apply_multi_stream against multi_apply on an FPN-style head, and
Prefetcher against a plain loop over a loader with per-batch latency.

- FPN head: 5 levels (strides 8..128 of a 1024x1024 image, 256 channels, batch 2), per level a
  3x3 conv + ReLU and two 1x1 convs (classes, boxes), as an mmdet dense head. On CUDA the
  speed-up of spreading the levels over 2/3/5 side streams; on CPU the two are the same
  sequential apply (the row only shows the overhead), and the CUDA numbers are owed.
- Prefetcher: a synthetic loader that sleeps ``--load-ms`` per batch (I/O or decoding bound),
  a training step that sleeps ``--step-ms`` (a stand-in for GPU/CPU work that releases the GIL).
  A plain loop pays load + step per batch; the Prefetcher overlaps them (background thread
  without explicit calls; ``prefetch_CPU()`` after the step's first half with them), so the
  ideal is max(load, step) per batch. This overlap is real on CPU.

Run: ``python benchmarks/bench_runtime.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import print_rows
from torch import nn

from fusedops.io import Prefetcher
from fusedops.utils import multi_apply, multi_apply_multi_stream


class _LevelHead(nn.Module):
    def __init__(self, channels: int, classes: int = 80):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.cls = nn.Conv2d(channels, classes, 1)
        self.box = nn.Conv2d(channels, 4, 1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return self.cls(x), self.box(x)


def _time_ms(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` in ms (CUDA: synchronized around each call)."""
    times = []
    for _ in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times[2:])[len(times[2:]) // 2]


def bench_fpn(quick: bool) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    channels, image = (32, 256) if quick or device.type == "cpu" else (256, 1024)
    heads = [_LevelHead(channels).to(device) for _ in range(5)]
    feats = [
        torch.randn(2, channels, image // s, image // s, device=device)
        for s in (8, 16, 32, 64, 128)
    ]

    def apply(head, x):
        return head(x)

    repeats = 3 if quick else 20
    rows = []
    with torch.no_grad():
        for _ in range(3):  # warm-up (first conv calls pick their algorithms)
            multi_apply(apply, heads, feats)
        base = _time_ms(lambda: multi_apply(apply, heads, feats), device, repeats)
        rows.append(
            {
                "device": device.type,
                "variant": "multi_apply",
                "ms": f"{base:.2f}",
                "speedup": "1.00x",
            }
        )
        for n in (2, 3, 5):
            ms = _time_ms(
                lambda n=n: multi_apply_multi_stream(apply, n, heads, feats), device, repeats
            )
            rows.append(
                {
                    "device": device.type,
                    "variant": f"multi_stream x{n}",
                    "ms": f"{ms:.2f}",
                    "speedup": f"{base / ms:.2f}x",
                }
            )
    return rows


class _SlowLoader:
    """``batches`` batches of (64, 3, 32, 32) floats, each after ``load_ms`` of sleep."""

    def __init__(self, batches: int, load_ms: float):
        self.batches, self.load_s = batches, load_ms / 1e3

    def __iter__(self):
        for i in range(self.batches):
            time.sleep(self.load_s)
            yield torch.full((64, 3, 32, 32), float(i)), torch.tensor([i])


def bench_prefetch(batches: int, load_ms: float, step_ms: float) -> list[dict]:
    step_s = step_ms / 1e3
    device = torch.device("cpu")  # the loading overlap is what is measured; no copy on CPU
    loader = _SlowLoader(batches, load_ms)

    def plain():
        for _batch in loader:
            time.sleep(step_s)

    def automatic():
        for _batch in Prefetcher(loader, device=device):
            time.sleep(step_s)

    def explicit():
        prefetcher = Prefetcher(loader, device=device)
        for _batch in prefetcher:
            time.sleep(step_s / 2)  # forward + backward
            prefetcher.prefetch_CPU()  # (loads here, in this thread)
            time.sleep(step_s / 2)  # optimizer step
            prefetcher.prefetch_GPU()

    rows = []
    base = None
    for name, fn in (("plain loop", plain), ("Prefetcher", automatic), ("explicit", explicit)):
        start = time.perf_counter()
        fn()
        ms = (time.perf_counter() - start) * 1e3 / batches
        base = base or ms
        rows.append(
            {
                "variant": name,
                "ms/batch": f"{ms:.1f}",
                "ideal": f"{max(load_ms, step_ms):.1f}",
                "speedup": f"{base / ms:.2f}x",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--load-ms", type=float, default=20.0)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    print("FPN-style head, 5 levels: multi_apply vs multi_apply_multi_stream")
    print_rows(bench_fpn(args.quick))
    if not torch.cuda.is_available():
        print("(CPU: both are the same sequential apply, differences are noise; CUDA numbers owed)")
    print(f"\nPrefetcher: loader {args.load_ms} ms/batch, step {args.step_ms} ms/batch")
    print_rows(bench_prefetch(10 if args.quick else 40, args.load_ms, args.step_ms))
    print(
        "(explicit: prefetch_CPU() loads in the calling thread, so it overlaps only work queued "
        "asynchronously on a GPU; with this blocking CPU step it cannot, by design)"
    )


if __name__ == "__main__":
    main()

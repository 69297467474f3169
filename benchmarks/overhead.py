"""Host time per call (microseconds) of tiny op calls, where kernel time is negligible: what
Python, autograd, dispatch and the launchers cost per op, forward and backward.

``python benchmarks/overhead.py`` (a GPU machine): LayerNorm / QuickGELU through every path,
with a profile of where the time goes.

``python benchmarks/overhead.py --cpu`` (any machine, no GPU needed): every fused op, forward +
backward on tiny tensors, against the torch code it replaces: the native path (the automatic
pick on CPU), and the Triton path with its kernel launches stubbed out (``triton``'s
interpreter ``run`` does nothing), which leaves exactly the host code fusedops adds around a
kernel: argument checks, dispatch, the autograd.Function, output allocation, launch-argument
preparation (not Triton's own launcher, which a GPU run measures). The goal (issue 25): each
within 5 us of the torch code. Writes ``results/cpu-overhead.csv``. Timed by this thread's CPU
time by default (``--clock wall`` for wall time): on a shared machine that leaves out the waits
for a core. ``--only window_,layer`` keeps the rows starting so (the CSV is then left alone).
"""

from __future__ import annotations

import sys

if "--cpu" in sys.argv:  # before triton is imported: its kernels become interpreted functions
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import argparse
import contextlib
import cProfile
import csv
import datetime
import pstats
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import require_cuda

# This checkout's fusedops, not an installed one (an editable install of another checkout would
# otherwise be imported first, by main(), and measured instead).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "cpu-overhead.csv"


def host_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


class _Identity(torch.autograd.Function):
    """The cheapest Python autograd.Function: what autograd's Python backward costs."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def cases(dtype: torch.dtype, n: int = 512) -> dict:
    import fusedops
    from fusedops.kernels.cuda import layer_norm as cuda_ln
    from fusedops.kernels.triton import layer_norm as triton_ln
    from fusedops.ops.layer_norm import _layer_norm_backward_body

    x = torch.randn(8, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    dy = torch.randn_like(xd)
    _, mean, rstd = cuda_ln.layer_norm_forward(xd, wd, bd, 1e-5)
    fused = lambda backend: fusedops.layer_norm(x, n, w, b, backend=backend)  # noqa: E731
    return {
        "torch eager fwd": lambda: F.layer_norm(x, (n,), w, b),
        "torch eager fwd+bwd": lambda: F.layer_norm(x, (n,), w, b).backward(dy),
        "identity Function fwd+bwd": lambda: _Identity.apply(x).backward(dy),
        "fusedops auto fwd": lambda: fusedops.layer_norm(x, n, w, b),
        "fusedops cuda fwd": lambda: fused("cuda"),
        "fusedops triton fwd": lambda: fused("triton"),
        "fusedops auto fwd+bwd": lambda: fusedops.layer_norm(x, n, w, b).backward(dy),
        "fusedops cuda fwd+bwd": lambda: fused("cuda").backward(dy),
        "fusedops triton fwd+bwd": lambda: fused("triton").backward(dy),
        "fusedops no-grad cuda fwd": lambda: fusedops.layer_norm(xd, n, wd, bd, backend="cuda"),
        "backward body cuda": lambda: _layer_norm_backward_body(dy, xd, wd, bd, mean, rstd, "cuda"),
        "cuda launcher fwd": lambda: cuda_ln.layer_norm_forward(xd, wd, bd, 1e-5),
        "cuda launcher bwd": lambda: cuda_ln.layer_norm_backward(dy, xd, wd, bd, mean, rstd),
        "triton launcher fwd": lambda: triton_ln.layer_norm_forward(xd, wd, bd, 1e-5),
        "triton launcher bwd": lambda: triton_ln.layer_norm_backward(dy, xd, wd, bd, mean, rstd),
        "torch.empty x3": lambda: (
            torch.empty_like(xd),
            torch.empty(8, device="cuda"),
            torch.empty(8, device="cuda"),
        ),
        "quick_gelu cuda": lambda: fusedops.quick_gelu(xd, backend="cuda"),
        "torch sigmoid": lambda: torch.sigmoid(xd),
    }


def profile(name: str, fn) -> None:
    """cProfile (this thread: forward and launchers) and torch.profiler (every thread, so the
    autograd engine's backward too) of 200 calls."""
    print(f"--- cProfile: {name}")
    profiler = cProfile.Profile()
    profiler.runctx("for _ in range(200): fn()", {"fn": fn}, {})
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    print(f"--- torch.profiler: {name}")
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))


# ------------------------------------------------------------------------------------------
# CPU: every op, host code only.


def tiny_cases() -> dict:
    """Row name -> a builder of (fusedops fwd+bwd callable, torch fwd+bwd callable), on tiny
    tensors (bench_cpu_fallback's cases at small shapes)."""
    import bench_cpu_fallback as cases

    fp32, rows = torch.float32, (8, 64)
    adam_shapes = [(64, 64), (64,), (64, 64), (64,)]
    return {
        f"layer_norm fp32 {rows}": lambda: cases._norm_case("layer_norm", fp32, rows),
        f"rms_norm fp32 {rows}": lambda: cases._norm_case("rms_norm", fp32, rows),
        f"quick_gelu fp32 {rows}": lambda: cases._quick_gelu_case(fp32, rows),
        f"bias_dropout_add fp32 {rows} p=0.1": lambda: cases._bias_dropout_add_case(fp32, rows),
        "adamw step fp32, 4 tensors": lambda: cases._adam_case(fp32, adam_shapes),
        "window_attention 14x14, 1 head": lambda: cases._window_attention_case(0),
        "swin_attention_softmax 14x14, 1 head": lambda: cases._swin_softmax_case(0),
        "window_partition_roll 14x14, C 32": lambda: cases._window_process_case(0, "partition"),
        "window_reverse_roll 14x14, C 32": lambda: cases._window_process_case(0, "reverse"),
    }


@contextlib.contextmanager
def stubbed_triton_launches():
    """Triton kernels (interpreted functions) launch nothing inside: the outputs stay as
    allocated, every host step before the launch runs."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None
    try:
        yield
    finally:
        InterpretedFunction.run = original


#: Clocks for the CPU table: "cpu" (this thread's CPU time: on a shared, loaded machine it
#: leaves out the time the thread waits for a core, which wall time counts) or "wall".
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def per_call_us(
    fns: list, calls: int, repeats: int, contexts: list | None = None, clock: str = "wall"
) -> list[float]:
    """Median microseconds per call of each function, blocks of ``calls`` calls interleaved;
    ``contexts[i]`` (a context-manager factory, or None) is entered around each block of
    ``fns[i]`` (outside the timed calls); ``clock``: a key of ``CLOCKS``."""
    now = CLOCKS[clock]
    contexts = contexts or [None] * len(fns)
    blocks = [(fn, context or contextlib.nullcontext) for fn, context in zip(fns, contexts)]
    for fn, context in blocks:
        with context():
            for _ in range(10):
                fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for (fn, context), times in zip(blocks, samples):
            with context():
                start = now()
                for _ in range(calls):
                    fn()
                times.append((now() - start) / calls * 1e6)
    return [statistics.median(times) for times in samples]


@contextlib.contextmanager
def _triton_host_only():
    """The Triton backend forced, its launches stubbed out."""
    import fusedops

    with stubbed_triton_launches(), fusedops.use_backend("triton"):
        yield


def cpu_main(calls: int, repeats: int, only: list[str] | None = None, clock: str = "cpu") -> int:
    """Print and write the CPU table: torch, fusedops native (the automatic pick), fusedops
    Triton host code; ``only``: row-name prefixes to keep (None: every op); ``clock``: a key of
    ``CLOCKS``."""
    import fusedops

    torch.set_num_threads(1)  # host code is one thread; tiny ops gain nothing from a second
    rows = []
    print(
        f"Host time per fwd+bwd call ({clock} clock), CPU, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; median of {repeats} blocks of {calls} calls; "
        f"fusedops from {Path(fusedops.__file__).parent}"
    )
    print(f"{'op':40s} {'torch':>8s} {'native':>8s} {'triton host':>12s} {'+us':>7s}")
    for name, build in tiny_cases().items():
        if only and not any(name.startswith(prefix) for prefix in only):
            continue
        native, theirs = build()
        with _triton_host_only():
            triton_host, _ = build()
        # native outside the forced backend (its automatic pick), the Triton path inside
        torch_us, native_us, triton_us = per_call_us(
            [theirs, native, triton_host], calls, repeats, [None, None, _triton_host_only], clock
        )
        extra = triton_us - torch_us
        print(f"{name:40s} {torch_us:8.1f} {native_us:8.1f} {triton_us:12.1f} {extra:+7.1f}")
        rows.append(
            [name, f"{torch_us:.1f}", f"{native_us:.1f}", f"{triton_us:.1f}", f"{extra:.1f}"]
        )
    if only:
        print(f"--only: {RESULTS.name} not rewritten (it holds every op)")
        return 0
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with RESULTS.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "date",
                "op",
                "torch_us",
                "native_us",
                "triton_host_us",
                "extra_us",
                "threads",
                "torch",
                "clock",
            ]
        )
        for row in rows:
            writer.writerow([stamp, *row, torch.get_num_threads(), torch.__version__, clock])
    print(f"wrote {RESULTS}")
    return 0


def main() -> None:
    from fusedops.kernels.cuda import build

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="every op's host code, no GPU")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--only", default="", help="--cpu: comma-separated row-name prefixes (e.g. window_)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="--cpu: this thread's CPU time (default; steady on a shared machine) or wall time",
    )
    args = parser.parse_args()
    if args.cpu:
        only = [prefix for prefix in args.only.split(",") if prefix]
        sys.exit(cpu_main(args.calls, args.repeats, only or None, args.clock))
    require_cuda("overhead")
    build.ensure_built()
    for dtype in (torch.bfloat16, torch.float32):
        print(f"=== {dtype}, x (8, 512)")
        table = cases(dtype)
        for name, fn in table.items():
            print(f"{name:28s} {host_us(fn):8.1f} us")
    table = cases(torch.bfloat16)
    profile("fusedops cuda fwd+bwd (bf16)", table["fusedops cuda fwd+bwd"])
    profile("backward body cuda (bf16)", table["backward body cuda"])


if __name__ == "__main__":
    main()

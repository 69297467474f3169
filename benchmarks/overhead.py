"""Host time per call (microseconds) of tiny LayerNorm / QuickGELU calls, where GPU time is
negligible: what Python, autograd and the launchers cost per op, forward and backward, with a
profile of where the time goes. Run on a GPU machine: ``python benchmarks/overhead.py``."""

from __future__ import annotations

import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from common import require_cuda


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


def main() -> None:
    from fusedops.kernels.cuda import build

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

"""Host time per call (microseconds) of tiny LayerNorm / QuickGELU calls, where GPU time is
negligible: what Python, autograd and the launchers cost per op. Run on a GPU machine:
``python benchmarks/overhead.py``."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def host_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    import fusedops
    from fusedops.kernels.cuda import build
    from fusedops.kernels.cuda import layer_norm as cuda_ln
    from fusedops.kernels.triton import layer_norm as triton_ln

    build.ensure_built()
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    cases = {
        "torch eager fwd": lambda: F.layer_norm(x, (512,), w, b),
        "torch eager fwd+bwd": lambda: F.layer_norm(x, (512,), w, b).sum().backward(),
        "fusedops triton fwd": lambda: fusedops.layer_norm(x, 512, w, b, backend="triton"),
        "fusedops cuda fwd": lambda: fusedops.layer_norm(x, 512, w, b, backend="cuda"),
        "fusedops auto fwd": lambda: fusedops.layer_norm(x, 512, w, b),
        "fusedops cuda fwd+bwd": lambda: (
            fusedops.layer_norm(x, 512, w, b, backend="cuda").sum().backward()
        ),
        "fusedops no-grad cuda fwd": lambda: fusedops.layer_norm(xd, 512, wd, bd, backend="cuda"),
        "triton launcher fwd": lambda: triton_ln.layer_norm_forward(xd, wd, bd, 1e-5),
        "cuda launcher fwd": lambda: cuda_ln.layer_norm_forward(xd, wd, bd, 1e-5),
        "torch.empty x3": lambda: (
            torch.empty_like(xd),
            torch.empty(8, device="cuda"),
            torch.empty(8, device="cuda"),
        ),
        "quick_gelu cuda": lambda: fusedops.quick_gelu(xd, backend="cuda"),
        "torch sigmoid": lambda: torch.sigmoid(xd),
    }
    for name, fn in cases.items():
        print(f"{name:28s} {host_us(fn):8.1f} us")
    import cProfile
    import pstats

    fn = cases["fusedops cuda fwd"]
    cProfile.runctx("for _ in range(300): fn()", {"fn": fn}, {}, "/tmp/ln.prof")
    pstats.Stats("/tmp/ln.prof").sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()

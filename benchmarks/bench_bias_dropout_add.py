"""Bias-dropout-add: fusedops (cuda, triton) vs torch eager vs torch.compile of
``residual + F.dropout(x + bias, p)``, forward alone and forward+backward, with peak memory.

GB/s counts the bytes the op must move: the forward reads x and residual and writes out (3
passes; bias is negligible), forward+backward adds reading grad and writing grad_x (5 passes;
grad_residual is grad itself). ``peak_MB`` is the memory a forward+backward allocates beyond
its inputs (outputs, saved activations, masks, gradients), from torch's allocator.
Run: ``python benchmarks/bench_bias_dropout_add.py [--p 0.1] [--quick]`` (quick: 8192 x 1024 and
16384 x 4096).
"""

from __future__ import annotations

import argparse

import torch
from common import (
    add_quick_flag,
    append_rows,
    compiled,
    copy_bandwidth_gbps,
    median_ms,
    pick,
    print_rows,
    require_cuda,
    rotating,
    set_quick,
    timing_fields,
)
from torch.nn import functional as F

SHAPES = [(8192, 1024), (16384, 4096), (32768, 8192)]  # (tokens, hidden)
QUICK_SHAPES = SHAPES[:2]
DTYPES = [torch.bfloat16, torch.float32]


def eager(x, bias, residual, p):
    return residual + F.dropout(x + bias, p)


def providers(p: float) -> dict:
    import fusedops

    compiled_eager = compiled(eager)
    return {
        "fusedops-cuda": lambda x, b, r: fusedops.bias_dropout_add(x, b, r, p, backend="cuda"),
        "fusedops-triton": lambda x, b, r: fusedops.bias_dropout_add(x, b, r, p, backend="triton"),
        "torch-eager": lambda x, b, r: eager(x, b, r, p),
        "torch-compile": lambda x, b, r: compiled_eager(x, b, r, p),
    }


def forward_backward(fn, x, bias, residual, grad):
    out = fn(x, bias, residual)
    return torch.autograd.grad(out, (x, bias, residual), grad)


def peak_extra_mb(run) -> float:
    """MiB allocated at the peak of ``run()`` beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def make_inputs(tokens: int, hidden: int, dtype: torch.dtype):
    def make():
        x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
        bias = torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True)
        residual = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
        return x, bias, residual, grad

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=float, default=0.1, help="dropout probability")
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    require_cuda("bench_bias_dropout_add")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s; p = {args.p}")
    rows = []
    for dtype in DTYPES:
        for tokens, hidden in pick(SHAPES, QUICK_SHAPES):
            size = tokens * hidden * torch.finfo(dtype).bits // 8
            inputs = rotating(make_inputs(tokens, hidden, dtype), 3 * size)
            for name, fn in providers(args.p).items():
                with torch.no_grad():  # warm-up: compiles, autotunes, builds
                    fn(*inputs()[:3])
                forward_backward(fn, *inputs())
                with torch.no_grad():
                    fwd_ms = median_ms(lambda f=fn, i=inputs: f(*i()[:3]))
                both_ms = median_ms(lambda f=fn, i=inputs: forward_backward(f, *i()))
                peak = peak_extra_mb(lambda f=fn, i=inputs: forward_backward(f, *i()))
                for direction, ms, passes in (("fwd", fwd_ms, 3), ("fwd+bwd", both_ms, 5)):
                    rows.append(
                        {
                            "op": "bias_dropout_add",
                            "provider": name,
                            "dtype": str(dtype).removeprefix("torch."),
                            "tokens": tokens,
                            "hidden": hidden,
                            "p": args.p,
                            "direction": direction,
                            "peak_MB": f"{peak:.0f}" if direction == "fwd+bwd" else "",
                            **timing_fields(ms, passes * size, copy_bw),
                        }
                    )
            del inputs
            torch.cuda.empty_cache()
    print_rows(rows)
    print(f"appended to {append_rows(rows)}")


if __name__ == "__main__":
    main()

"""QuickGELU: fusedops (cuda, triton) vs torch eager vs torch.compile, forward and backward.

GB/s counts the bytes the op must move: forward reads x and writes y (2 passes), backward reads
grad and x and writes dx (3 passes). Run: ``python benchmarks/bench_quick_gelu.py [--quick]``
(quick: 2^20 and 2^26 elements).
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

SIZES = [2**20, 2**24, 2**26, 2**28]
QUICK_SIZES = [2**20, 2**26]
DTYPES = [torch.float32, torch.bfloat16]


def eager_forward(x):
    return x * torch.sigmoid(1.702 * x)


def eager_backward(grad, x):
    s = torch.sigmoid(1.702 * x)
    return grad * (s + 1.702 * x * s * (1 - s))


def providers():
    import fusedops
    from fusedops.ops.quick_gelu import _backward_body  # what eager autograd runs

    compiled_forward = compiled(eager_forward)
    compiled_backward = compiled(eager_backward)
    return {
        "fusedops-cuda": (
            lambda x: fusedops.quick_gelu(x, backend="cuda"),
            lambda g, x: _backward_body(g, x, "cuda"),
        ),
        "fusedops-triton": (
            lambda x: fusedops.quick_gelu(x, backend="triton"),
            lambda g, x: _backward_body(g, x, "triton"),
        ),
        "torch-eager": (eager_forward, eager_backward),
        "torch-compile": (compiled_forward, compiled_backward),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(parser)
    set_quick(parser.parse_args().quick)
    require_cuda("bench_quick_gelu")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    rows = []
    for dtype in DTYPES:
        for n in pick(SIZES, QUICK_SIZES):
            size = n * torch.finfo(dtype).bits // 8
            inputs = rotating(
                lambda n=n, dtype=dtype: (
                    torch.randn(n, device="cuda", dtype=dtype),
                    torch.randn(n, device="cuda", dtype=dtype),
                ),
                2 * size,
            )
            for name, (forward, backward) in providers().items():
                fwd_ms = median_ms(lambda f=forward, i=inputs: f(i()[0]))
                bwd_ms = median_ms(lambda b=backward, i=inputs: b(*i()))
                for direction, ms, passes in (("fwd", fwd_ms, 2), ("bwd", bwd_ms, 3)):
                    rows.append(
                        {
                            "op": "quick_gelu",
                            "provider": name,
                            "dtype": str(dtype).removeprefix("torch."),
                            "numel": n,
                            "direction": direction,
                            **timing_fields(ms, passes * size, copy_bw),
                        }
                    )
    print_rows(rows)
    print(f"appended to {append_rows(rows)}")


if __name__ == "__main__":
    main()

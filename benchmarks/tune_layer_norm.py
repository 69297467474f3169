"""LayerNorm kernel variants, kernels alone (no autograd, no dispatch): which register-path
threshold and warp count each row length wants. Used to set the defaults in
``fusedops/kernels/triton/layer_norm.py``; rows go to the same CSV as the benchmarks, with the
variant in the provider column. Run: ``python benchmarks/tune_layer_norm.py``.
The timed lambdas read the current loop's tensors on purpose (each is timed within its pass).
"""

# ruff: noqa: B023
from __future__ import annotations

import torch
from common import (
    append_rows,
    copy_bandwidth_gbps,
    median_ms,
    print_rows,
    require_cuda,
    timing_fields,
)

M = 4096
SIZES = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
DTYPES = [torch.float32, torch.bfloat16]
#: (name, MAX_FUSED_N_FORWARD): register path up to the limit (warps: see _register_tile). The
#: CSV of 2026-11-22 was taken when MAX_WARPS also capped wide rows: its "regs,w16" /
#: "regs,w32" rows are 16 / 32 warps.
FORWARD_VARIANTS = [("loop>8192", 8192), ("regs<=32768", 32768), ("regs<=65536", 65536)]
#: (name, MAX_FUSED_N, BACKWARD_WARPS_8192, SPLIT_ROWS): SPLIT_ROWS 2^62 sums the partial rows
#: of dweight/dbias in one stage (as before 2026-11-26), 64 in two (the default since).
BACKWARD_VARIANTS = [
    ("regs<=8192,w8@8192", 8192, 8, 64),
    ("regs<=8192,w16@8192", 8192, 16, 64),
    ("regs<=8192,w16@8192,sum1", 8192, 16, 2**62),
]
#: (name, VECTOR_ACCESS) of the CUDA kernels: one element per access, or 16 bytes (register path).
CUDA_VARIANTS = [("cuda", False), ("cuda vec16", True)]


def main() -> None:
    require_cuda("tune_layer_norm")
    from fusedops.kernels.cuda import build
    from fusedops.kernels.cuda import layer_norm as cuda_kernels
    from fusedops.kernels.triton import layer_norm as kernels

    build.ensure_built()

    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    rows = []

    def record(variant, dtype, n, direction, ms, passes):
        size = M * n * torch.finfo(dtype).bits // 8
        rows.append(
            {
                "op": "layer_norm_kernel",
                "provider": variant,
                "dtype": str(dtype).removeprefix("torch."),
                "M": M,
                "N": n,
                "direction": direction,
                **timing_fields(ms, passes * size, copy_bw),
            }
        )

    defaults = (
        kernels.MAX_FUSED_N,
        kernels.MAX_FUSED_N_FORWARD,
        kernels.BACKWARD_WARPS_8192,
        kernels.SPLIT_ROWS,
    )
    cuda_defaults = cuda_kernels.VECTOR_ACCESS
    for dtype in DTYPES:
        for n in SIZES:
            x = torch.randn(M, n, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            _, mean, rstd = kernels.layer_norm_forward(x, w, b, 1e-5)
            for name, limit in FORWARD_VARIANTS:
                kernels.MAX_FUSED_N_FORWARD = limit
                try:
                    ms = median_ms(lambda: kernels.layer_norm_forward(x, w, b, 1e-5))
                    record(f"triton {name}", dtype, n, "fwd", ms, 2)
                except Exception as exc:  # a variant that cannot compile is reported
                    print(f"fwd {name} {dtype} N={n}: {type(exc).__name__}: {exc}"[:300])
            for name, limit, warps, split_rows in BACKWARD_VARIANTS:
                kernels.MAX_FUSED_N, kernels.BACKWARD_WARPS_8192 = limit, warps
                kernels.SPLIT_ROWS = split_rows
                try:
                    ms = median_ms(lambda: kernels.layer_norm_backward(dy, x, w, b, mean, rstd))
                    record(f"triton {name}", dtype, n, "bwd", ms, 3)
                except Exception as exc:
                    print(f"bwd {name} {dtype} N={n}: {type(exc).__name__}: {exc}"[:300])
            (
                kernels.MAX_FUSED_N,
                kernels.MAX_FUSED_N_FORWARD,
                kernels.BACKWARD_WARPS_8192,
                kernels.SPLIT_ROWS,
            ) = defaults
            for name, vector_access in CUDA_VARIANTS:
                cuda_kernels.VECTOR_ACCESS = vector_access
                ms = median_ms(lambda: cuda_kernels.layer_norm_forward(x, w, b, 1e-5))
                record(name, dtype, n, "fwd", ms, 2)
                ms = median_ms(lambda: cuda_kernels.layer_norm_backward(dy, x, w, b, mean, rstd))
                record(name, dtype, n, "bwd", ms, 3)
            cuda_kernels.VECTOR_ACCESS = cuda_defaults
            torch.cuda.empty_cache()
            # each size's rows at once: a run cut by its time limit keeps what it measured
            print_rows(rows)
            print(f"appended to {append_rows(rows)}")
            rows.clear()


if __name__ == "__main__":
    main()

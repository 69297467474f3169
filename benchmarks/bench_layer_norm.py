"""LayerNorm and RMSNorm: fusedops (cuda, triton) vs Liger vs torch eager vs torch.compile.

M = 4096 rows, N in {512 ... 65536}, fp32 and bf16 (weight and bias in the input dtype), and the
LLM-shaped rows M = 16384, N in {2048, 4096, 8192} in bf16.
GB/s counts the bytes the op must move: forward reads x and writes y (2 passes of M*N), backward
reads dy and x and writes dx (3 passes); "both" is forward then backward (5 passes). Parameters,
statistics and the partial rows of dweight/dbias are not counted. % is of this device's measured
copy bandwidth. ``llama_rms_norm`` is transformers' LlamaRMSNorm math (xhat rounded to x's dtype
before the weight multiply; what the rms_norm hook swaps in for it): eager is that class's
forward, written out. ``liger`` is Liger-Kernel's Triton LayerNorm / RMSNorm (benchmark-only
peer, never a dependency): measured where ``liger_kernel`` imports (``gpu_check.sh`` installs
the wheels found in ``.whl/``, see ``benchmarks/fetch_peers.sh``), with the casting mode that
matches each op (``rms_norm``: all fp32 ("gemma" with offset 0), ``llama_rms_norm``: "llama")
and its default in-place backward. Run:
``python benchmarks/bench_layer_norm.py [--op layer_norm|rms_norm|llama_rms_norm|all] [--quick]``
(quick: M = 4096, N in {1024, 8192}, and the LLM row N = 4096 in bf16).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
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

M = 4096
SIZES = [512, 768, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
DTYPES = [torch.float32, torch.bfloat16]
#: Rows of LLM training (tokens of a batch x hidden size), bf16 only.
LLM_M = 16384
LLM_SIZES = [2048, 4096, 8192]
PASSES = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}
OPS = ["layer_norm", "rms_norm", "llama_rms_norm"]
LLAMA_EPS = 1e-6


def _llama_rms_norm(x, w, b):
    """LlamaRMSNorm's forward: fp32 statistics, xhat cast to x's dtype, then the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + LLAMA_EPS)
    return w * h.to(x.dtype)


def eager(op: str):
    """torch's own op: (x, w, b) -> y."""
    if op == "layer_norm":
        return lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b)
    if op == "llama_rms_norm":
        return _llama_rms_norm
    return lambda x, w, b: F.rms_norm(x, x.shape[-1:], w)


def fused(op: str, backend: str):
    import fusedops

    if op == "layer_norm":
        return lambda x, w, b: fusedops.layer_norm(x, x.shape[-1], w, b, backend=backend)
    if op == "llama_rms_norm":
        return lambda x, w, b: fusedops.rms_norm(
            x,
            x.shape[-1],
            w,
            LLAMA_EPS,
            backend=backend,
            out_dtype=torch.promote_types(x.dtype, w.dtype),
            xhat_dtype=x.dtype,
        )
    return lambda x, w, b: fusedops.rms_norm(x, x.shape[-1], w, backend=backend)


def liger(op: str):
    """Liger-Kernel's autograd function for ``op``, or None where liger_kernel is missing."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    if op == "layer_norm":
        return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5)
    if op == "llama_rms_norm":
        return lambda x, w, b: LigerRMSNormFunction.apply(x, w, LLAMA_EPS, 0.0, "llama")
    # fusedops.rms_norm / F.rms_norm with eps=None use finfo(x.dtype).eps
    return lambda x, w, b: LigerRMSNormFunction.apply(x, w, torch.finfo(x.dtype).eps, 0.0, "gemma")


def providers(op: str) -> dict:
    found = {
        "fusedops-cuda": fused(op, "cuda"),
        "fusedops-triton": fused(op, "triton"),
        "liger": liger(op),
        "torch-eager": eager(op),
        "torch-compile": compiled(eager(op)),
    }
    return {name: fn for name, fn in found.items() if fn is not None}


def time_directions(fn, inputs) -> dict[str, float]:
    """Median ms of the forward, the backward alone (graph kept) and forward + backward."""

    def forward():
        x, w, b, _ = inputs()
        return fn(x, w, b)

    def both():
        x, w, b, dy = inputs()
        torch.autograd.grad(fn(x, w, b), (x, w, b), dy, allow_unused=True)

    x, w, b, dy = inputs()
    y = fn(x, w, b)
    # autograd.grad: fresh gradients each call, no accumulation kernels into .grad
    backward = lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True, allow_unused=True)
    return {
        "fwd": median_ms(forward),
        "bwd": median_ms(backward),
        "fwd+bwd": median_ms(both),
    }


def shapes(dtype: torch.dtype) -> list[tuple[int, int]]:
    """(M, N) of the sweep for ``dtype``: M = 4096 over SIZES, then the LLM rows in bf16."""
    llm = [(LLM_M, n) for n in pick(LLM_SIZES, [4096])] if dtype == torch.bfloat16 else []
    return [(M, n) for n in pick(SIZES, [1024, 8192])] + llm


def make_inputs(m: int, n: int, dtype: torch.dtype):
    def make():
        x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        return x, w, b, dy

    size = m * n * torch.finfo(dtype).bits // 8
    return rotating(make, 2 * size), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=[*OPS, "all"], default="all")
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    require_cuda("bench_layer_norm")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    if liger("layer_norm") is None:
        print("liger_kernel not importable: no Liger rows (benchmarks/fetch_peers.sh)")
    ops = OPS if args.op == "all" else [args.op]
    rows = []
    for op in ops:
        for dtype in DTYPES:
            for m, n in shapes(dtype):
                inputs, size = make_inputs(m, n, dtype)
                measured = []
                for name, fn in providers(op).items():
                    try:
                        times = time_directions(fn, inputs)
                    except Exception as exc:  # a provider that cannot run is reported, not fatal
                        why = f"{type(exc).__name__}: {exc}"
                        print(f"{op} {name} {dtype} M={m} N={n}: skipped ({why})")
                        continue
                    for direction, ms in times.items():
                        measured.append(
                            {
                                "op": op,
                                "provider": name,
                                "dtype": str(dtype).removeprefix("torch."),
                                "M": m,
                                "N": n,
                                "direction": direction,
                                **timing_fields(ms, PASSES[direction] * size, copy_bw),
                            }
                        )
                # written per size: a sweep cut off by a time limit keeps what it measured
                if measured:
                    append_rows(measured)
                    print_rows(measured)
                rows.extend(measured)
                torch.cuda.empty_cache()
    print_rows(rows)


if __name__ == "__main__":
    main()

"""Window attention: fusedops (triton, cuda) vs eager, SDPA with the combined float mask and
torch.compile, on Swin-T's four stages (batch 128, 7x7 windows: N = 49, d = 32) and a 12x12
window case (N = 144); forward and forward+backward, bf16 and fp32; time and peak memory.

Providers (all compute softmax(q k^T * scale + bias + mask[z % nW]) v):
- fusedops-triton / fusedops-cuda: ``fusedops.window_attention`` (bias (H, N, N) and mask
  (nW, N, N) read as they are);
- fusedops-native: ``fusedops.window_attention(backend="native")``, the automatic pick until a
  kernel passes the GPU suite: torch's matmuls around ``aten._safe_softmax`` (fully masked
  rows give zeros), which on CUDA makes more passes over the scores than torch-eager's softmax
  (the promise: no slower than torch-eager);
- torch-eager: Swin's own code: matmul, add bias, add mask through a (B, nW, H, N, N) view,
  softmax, matmul;
- torch-sdpa: ``F.scaled_dot_product_attention`` with the combined (B*nW, H, N, N) float mask,
  built in the timed region as Hugging Face Swin builds it each call;
- torch-compile: ``torch.compile`` of torch-eager.
fwd+bwd times one forward and ``torch.autograd.grad`` of q, k, v and the bias. GB/s counts the
bytes the fused op must move: forward reads q, k, v and writes out (plus bias and mask);
backward reads q, k, v, out, dout and writes dq, dk, dv. Peak memory is the increase of
``torch.cuda.max_memory_allocated`` over the inputs during one call.

Run: ``python benchmarks/bench_window_attention.py [--cases stage1,n144] [--dtypes bfloat16]
[--quick]`` (quick: cases swin_t_stage1 and window12_n144 unless --cases is given).
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

#: name -> (batch, windows per image nW, heads, N, d)
CASES = {
    "swin_t_stage1": (128, 64, 3, 49, 32),
    "swin_t_stage2": (128, 16, 6, 49, 32),
    "swin_t_stage3": (128, 4, 12, 49, 32),
    "swin_t_stage4": (128, 1, 24, 49, 32),
    "window12_n144": (32, 64, 4, 144, 32),  # Swin-B at 384 px, stage 1 (12x12 windows)
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DIRECTIONS = ("fwd", "fwd+bwd")
PROVIDERS = (
    "fusedops-triton",
    "fusedops-cuda",
    "fusedops-native",
    "torch-eager",
    "torch-sdpa",
    "torch-compile",
)


def eager_attention(q, k, v, bias, mask):
    """Swin's attention as written in its reference code."""
    windows, heads, n, d = q.shape
    attn = (q * d**-0.5) @ k.transpose(-2, -1)
    attn = attn + bias.to(attn.dtype).unsqueeze(0)
    nw = mask.shape[0]
    attn = attn.view(windows // nw, nw, heads, n, n) + mask.to(attn.dtype).unsqueeze(1).unsqueeze(0)
    attn = torch.softmax(attn.view(-1, heads, n, n), dim=-1)
    return attn @ v


def sdpa_attention(q, k, v, bias, mask):
    """SDPA with the combined float mask, built as Hugging Face Swin builds it."""
    windows, heads, n, _ = q.shape
    nw = mask.shape[0]
    expanded = mask.unsqueeze(1).unsqueeze(0).expand(windows // nw, -1, -1, -1, -1)
    combined = bias.unsqueeze(0) + expanded.reshape(-1, 1, n, n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=combined.to(q.dtype))


def providers() -> dict:
    import fusedops

    return {
        "fusedops-triton": lambda *a: fusedops.window_attention(*a, backend="triton"),
        "fusedops-cuda": lambda *a: fusedops.window_attention(*a, backend="cuda"),
        "fusedops-native": lambda *a: fusedops.window_attention(*a, backend="native"),
        "torch-eager": eager_attention,
        "torch-sdpa": sdpa_attention,
        "torch-compile": compiled(eager_attention),
    }


def make_inputs(batch, nw, heads, n, d, dtype, grad):
    """q, k, v, a learned bias and a -100 shift-style mask, plus dout."""
    windows = batch * nw
    q, k, v = (
        torch.randn(windows, heads, n, d, device="cuda", dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    )
    bias = torch.randn(heads, n, n, device="cuda", dtype=torch.float32).requires_grad_(grad)
    keep = torch.rand(nw, n, n, device="cuda") > 0.3
    keep[:, :, 0] = True
    mask = torch.zeros(nw, n, n, device="cuda").masked_fill(~keep, -100.0)
    dout = torch.randn(windows, heads, n, d, device="cuda", dtype=dtype)
    return q, k, v, bias, mask, dout


def step(fn, direction):
    """A callable running one timed call of ``fn`` on an input set."""
    if direction == "fwd":

        def run(q, k, v, bias, mask, dout):
            with torch.no_grad():
                return fn(q, k, v, bias, mask)

        return run

    def run_with_backward(q, k, v, bias, mask, dout):
        out = fn(q, k, v, bias, mask)
        return torch.autograd.grad(out, (q, k, v, bias), dout)

    return run_with_backward


def peak_mb(run, inputs) -> float:
    """Peak memory (MB) one call allocates above what is allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run(*inputs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def bytes_moved(shape, dtype, direction) -> int:
    windows, heads, n, d = shape
    element = torch.finfo(dtype).bits // 8
    tensor = windows * heads * n * d * element
    params = heads * n * n * 4 + n * n * 4
    return (4 * tensor if direction == "fwd" else 12 * tensor) + params


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=None, help="comma-separated CASES names (all)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="bfloat16,float32")
    parser.add_argument("--providers", default=None, help="comma-separated (default: all)")
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    args.cases = args.cases or pick(",".join(CASES), "swin_t_stage1,window12_n144")
    for name in args.cases.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    for name in args.dtypes.split(","):
        if name not in DTYPES:
            parser.error(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    for name in (args.providers or "").split(",") if args.providers else []:
        if name not in PROVIDERS:
            parser.error(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")
    return args


def summary(rows: list[dict]) -> None:
    """fusedops' speed-up and memory ratio over SDPA and eager, per case, dtype and direction."""
    by_key = {(r["case"], r["dtype"], r["direction"], r["provider"]): r for r in rows}
    print("\nspeed-up (time of other / time of fusedops) and peak memory ratio:")
    for (case, dtype, direction, provider), row in by_key.items():
        if not provider.startswith("fusedops") or row["ms"] == "error":
            continue
        parts = []
        for other in ("torch-sdpa", "torch-eager", "torch-compile"):
            ref = by_key.get((case, dtype, direction, other))
            if ref and ref["ms"] != "error":
                speed = float(ref["ms"]) / float(row["ms"])
                memory = float(row["peak_MB"]) / max(float(ref["peak_MB"]), 1e-9)
                parts.append(f"{other[6:]} {speed:.2f}x (mem {memory:.2f})")
        print(f"  {case:15s} {dtype:8s} {direction:7s} {provider:16s} " + ", ".join(parts))


def main() -> None:
    args = parse_args()
    require_cuda("bench_window_attention")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    chosen = providers()
    if args.providers:
        chosen = {name: chosen[name] for name in args.providers.split(",")}
    rows = []
    for case in args.cases.split(","):
        batch, nw, heads, n, d = CASES[case]
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            for direction in DIRECTIONS:
                grad = direction != "fwd"
                shape = (batch * nw, heads, n, d)
                moved = bytes_moved(shape, dtype, direction)
                inputs = rotating(
                    lambda b=batch, w=nw, h=heads, n=n, d=d, t=dtype, g=grad: make_inputs(
                        b, w, h, n, d, t, g
                    ),
                    moved,
                )
                for name, fn in chosen.items():
                    run = step(fn, direction)
                    row = {
                        "op": "window_attention",
                        "case": case,
                        "shape": "x".join(map(str, shape)),
                        "windows_nW": nw,
                        "dtype": dtype_name,
                        "direction": direction,
                        "provider": name,
                    }
                    try:
                        run(*inputs())  # compile / build / warm up outside the timing
                        memory = peak_mb(run, inputs())
                        ms = median_ms(lambda r=run, i=inputs: r(*i()))
                        row.update(timing_fields(ms, moved, copy_bw), peak_MB=f"{memory:.1f}")
                    except Exception as exc:  # one provider failing must not hide the others
                        print(
                            f"{case} {dtype_name} {direction} {name}: {type(exc).__name__}: {exc}"
                        )
                        row.update({"ms": "error", "GB/s": "", "pct_copy_bw": "", "peak_MB": ""})
                    rows.append(row)
                torch.cuda.empty_cache()
    print_rows(rows)
    summary(rows)
    print(f"appended to {append_rows(rows)}")


if __name__ == "__main__":
    main()

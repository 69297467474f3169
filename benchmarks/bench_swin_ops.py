"""Swin window ops and the Swin attention softmax at Swin-T's four stages (batch 128, 224 px,
window 7, shift 3): fusedops (cuda, triton, and native: the automatic pick until a kernel passes
the GPU suite) vs torch eager vs torch.compile of the eager code.

Window ops: ``window_partition_roll`` (eager: roll + partition) and ``window_reverse_roll``
(eager: reverse + roll) on the (128, H, W, C) maps 56x56x96, 28x28x192, 14x14x384, 7x7x768;
each direction's backward is the other gather. GB/s counts one read and one write of the map.
Softmax: (128*nW, heads, 49, 49) scores with the (heads, 49, 49) bias and the (nW, 49, 49) shift
mask; eager is add + add + softmax. Forward GB/s counts reading the scores and writing the
probabilities; backward (d_scores and the bias gradient) reading the gradient and the
probabilities and writing d_scores. Backward times are ``torch.autograd.grad`` of a recorded
forward. Run: ``python benchmarks/bench_swin_ops.py [--dtypes bfloat16,float32] [--quick]`` (quick:
stages 1 and 4, bfloat16 unless --dtypes is given).
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

BATCH, WINDOW, SHIFT, N = 128, 7, 3, 49
DEVICE = "cuda"
STAGES = [(56, 96, 3), (28, 192, 6), (14, 384, 12), (7, 768, 24)]  # (H = W, C, heads)
QUICK_STAGES = [STAGES[0], STAGES[-1]]


def eager_partition(x):
    b, h, w, c = x.shape
    x = torch.roll(x, (-SHIFT, -SHIFT), dims=(1, 2))
    x = x.view(b, h // WINDOW, WINDOW, w // WINDOW, WINDOW, c).permute(0, 1, 3, 2, 4, 5)
    return x.contiguous().view(-1, WINDOW, WINDOW, c)


def eager_reverse(windows, h, w):
    c = windows.shape[-1]
    x = windows.view(-1, h // WINDOW, w // WINDOW, WINDOW, WINDOW, c).permute(0, 1, 3, 2, 4, 5)
    return torch.roll(x.contiguous().view(-1, h, w, c), (SHIFT, SHIFT), dims=(1, 2))


def eager_softmax(attn, bias, mask):
    nw, heads = mask.shape[0], attn.shape[1]
    z = (
        attn.view(-1, nw, heads, N, N)
        + bias.to(attn.dtype)[None, None]
        + mask.to(attn.dtype)[None, :, None]
    )
    return z.view(-1, heads, N, N).softmax(dim=-1)


def window_providers():
    import fusedops

    def fused(backend):
        return (
            lambda x: fusedops.window_partition_roll(x, WINDOW, -SHIFT, backend=backend),
            lambda win, h, w: fusedops.window_reverse_roll(
                win, WINDOW, h, w, SHIFT, backend=backend
            ),
        )

    return {
        "fusedops-cuda": fused("cuda"),
        "fusedops-triton": fused("triton"),
        "fusedops-native": fused("native"),
        "torch-eager": (eager_partition, eager_reverse),
        "torch-compile": (compiled(eager_partition), compiled(eager_reverse)),
    }


def softmax_providers():
    import fusedops

    def fused(backend):
        return lambda a, b, m: fusedops.swin_attention_softmax(a, b, m, backend=backend)

    return {
        "fusedops-cuda": fused("cuda"),
        "fusedops-triton": fused("triton"),
        "fusedops-native": fused("native"),
        "torch-eager": eager_softmax,
        "torch-compile": compiled(eager_softmax),
    }


def _grad_timer(fn, make_inputs, grad_index, bytes_per_set):
    """ms of ``torch.autograd.grad`` through ``fn`` (graphs recorded once per input set)."""

    def record():
        inputs = make_inputs()
        for i in grad_index:
            inputs[i].requires_grad_(True)
        out = fn(*inputs)
        return out, [inputs[i] for i in grad_index], torch.randn_like(out)

    graphs = rotating(record, bytes_per_set)
    return median_ms(lambda: torch.autograd.grad(*graphs(), retain_graph=True))


def _row(op, provider, dtype, shape, direction, ms, bytes_moved, copy_bw):
    return {
        "op": op,
        "provider": provider,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": "x".join(map(str, shape)),
        "direction": direction,
        **timing_fields(ms, bytes_moved, copy_bw),
    }


def bench_window_ops(dtype, copy_bw) -> list[dict]:
    rows = []
    for size, channels, _ in pick(STAGES, QUICK_STAGES):
        shape = (BATCH, size, size, channels)
        count = BATCH * (size // WINDOW) ** 2
        nbytes = BATCH * size * size * channels * torch.finfo(dtype).bits // 8

        def maps(shape=shape):
            return [torch.randn(shape, device=DEVICE, dtype=dtype)]

        def windows(count=count, channels=channels):
            return [torch.randn((count, WINDOW, WINDOW, channels), device=DEVICE, dtype=dtype)]

        for name, (partition, reverse) in window_providers().items():
            reverse_map = lambda win, r=reverse, s=size: r(win, s, s)  # noqa: E731
            for op, fn, make in (("partition", partition, maps), ("reverse", reverse_map, windows)):
                next_inputs = rotating(make, nbytes)
                fwd_ms = median_ms(lambda f=fn, n=next_inputs: f(*n()))
                bwd_ms = _grad_timer(fn, make, [0], 2 * nbytes)
                for direction, ms in (("fwd", fwd_ms), ("bwd", bwd_ms)):
                    row = _row(
                        f"window_{op}", name, dtype, shape, direction, ms, 2 * nbytes, copy_bw
                    )
                    rows.append(row)
    return rows


def bench_softmax(dtype, copy_bw) -> list[dict]:
    rows = []
    for size, _, heads in pick(STAGES, QUICK_STAGES):
        windows = (size // WINDOW) ** 2
        shape = (BATCH * windows, heads, N, N)
        nbytes = BATCH * windows * heads * N * N * torch.finfo(dtype).bits // 8
        mask = torch.where(torch.rand(windows, N, N, device=DEVICE) < 0.3, -100.0, 0.0)

        def inputs(shape=shape, heads=heads, mask=mask):
            attn = torch.randn(shape, device=DEVICE, dtype=dtype)
            return [attn, torch.randn(heads, N, N, device=DEVICE), mask]

        for name, fn in softmax_providers().items():
            next_inputs = rotating(inputs, nbytes)
            fwd_ms = median_ms(lambda f=fn, n=next_inputs: f(*n()))
            bwd_ms = _grad_timer(fn, inputs, [0, 1], 2 * nbytes)
            rows.append(
                _row("swin_softmax", name, dtype, shape, "fwd", fwd_ms, 2 * nbytes, copy_bw)
            )
            rows.append(
                _row("swin_softmax", name, dtype, shape, "bwd", bwd_ms, 3 * nbytes, copy_bw)
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default=None, help="default: bfloat16,float32")
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    require_cuda("bench_swin_ops")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    rows = []
    dtypes = args.dtypes or pick("bfloat16,float32", "bfloat16")
    for dtype in (getattr(torch, d) for d in dtypes.split(",")):
        rows += bench_window_ops(dtype, copy_bw)
        rows += bench_softmax(dtype, copy_bw)
    print_rows(rows)
    print(f"appended to {append_rows(rows)}")


if __name__ == "__main__":
    main()

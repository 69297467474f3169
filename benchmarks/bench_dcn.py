"""deform_conv2d (DCNv2, with mask): fusedops (triton and cuda, atomic / deterministic) vs
torchvision's deform_conv2d ("native") and the reference, fwd and fwd+bwd, on CenterNet/DLA-34
and ResNet-50-DCN layer shapes, fp32 and bf16.

On CUDA: every provider at the full shapes (the cuda rows where the extension builds; goal:
triton fwd+bwd >= 1.5x torchvision, deterministic within 1.2x of it). On CPU (no GPU): the
reference and native rows only, at the layer shapes with the batch cut to 1 and the image to a
quarter (``--cpu-scale``), time.perf_counter medians. Run:
``python benchmarks/bench_dcn.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools

import torch

#: (name, batch, C_in, C_out, H, W, stride): 3x3 DCNv2 layers, 1 offset group
SHAPES = [
    ("centernet-dla34-up1", 32, 256, 128, 32, 32, 1),  # DLA-34 IDA-up deformable layers, 512 px
    ("centernet-dla34-up2", 32, 128, 64, 64, 64, 1),
    ("centernet-dla34-up3", 32, 64, 64, 128, 128, 1),
    ("r50-dcn-c3", 16, 128, 128, 100, 152, 1),  # ResNet-50-DCN 3x3 convs, 800x1216 input
    ("r50-dcn-c4", 16, 256, 256, 50, 76, 1),
    ("r50-dcn-c5", 16, 512, 512, 25, 38, 1),
]
DTYPES = [torch.float32, torch.bfloat16]


def inputs(batch, cin, cout, h, w, stride, dtype, device):
    """input, offset, weight, bias, mask for a 3x3 padding-1 DCNv2 layer."""
    h_out, w_out = (h - 1) // stride + 1, (w - 1) // stride + 1
    x = torch.randn(batch, cin, h, w, device=device, dtype=dtype)
    offset = torch.randn(batch, 18, h_out, w_out, device=device, dtype=dtype) * 2
    mask = torch.rand(batch, 9, h_out, w_out, device=device, dtype=dtype)
    weight = torch.randn(cout, cin, 3, 3, device=device, dtype=dtype) * 0.05
    bias = torch.randn(cout, device=device, dtype=dtype)
    return [x, offset, weight, bias, mask]


def providers(device):
    """name -> (backend, deterministic) runnable on ``device``."""
    rows = {"reference": ("reference", False), "native": ("native", False)}
    if device.type == "cuda":
        rows["fusedops-triton"] = ("triton", False)
        rows["fusedops-triton-det"] = ("triton", True)
        from fusedops.kernels.cuda import build

        if build.unavailable_reason() is None:  # builds the extension on first use
            rows["fusedops-cuda"] = ("cuda", False)
            rows["fusedops-cuda-det"] = ("cuda", True)
    return rows


def _timer(device):
    if device.type == "cuda":
        from common import median_ms

        return median_ms

    from common import cpu_median_ms

    return cpu_median_ms


def _forward_backward(forward, leaves, grad):
    torch.autograd.grad(forward(), leaves, grad)


def run(device, quick=False, cpu_scale=4):
    """Benchmark rows (dicts) on ``device``."""
    import fusedops

    median_ms = _timer(device)
    rows = []
    shapes = SHAPES[:2] if quick else SHAPES
    for name, batch, cin, cout, h, w, stride in shapes:
        if device.type != "cuda":
            batch, h, w = 1, max(h // cpu_scale, 4), max(w // cpu_scale, 4)
        for dtype in DTYPES:
            args = inputs(batch, cin, cout, h, w, stride, dtype, device)
            leaves = [a.requires_grad_() for a in args]
            grad = torch.randn(batch, cout, (h - 1) // stride + 1, (w - 1) // stride + 1,
                               device=device, dtype=dtype)  # fmt: skip
            for provider, (backend, deterministic) in providers(device).items():
                forward = functools.partial(
                    fusedops.deform_conv2d, *leaves[:4], stride, 1, 1, leaves[4],
                    backend=backend, deterministic=deterministic,
                )  # fmt: skip
                fwd_bwd = functools.partial(_forward_backward, forward, leaves, grad)
                with torch.no_grad():
                    fwd_ms = median_ms(forward)
                both_ms = median_ms(fwd_bwd)
                for direction, ms in (("fwd", fwd_ms), ("fwd+bwd", both_ms)):
                    rows.append({
                        "op": "deform_conv2d", "shape": name, "provider": provider,
                        "dtype": str(dtype).removeprefix("torch."), "batch": batch,
                        "hw": f"{h}x{w}", "direction": direction, "ms": round(ms, 4),
                    })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    parser.add_argument("--cpu-scale", type=int, default=4, help="image size divisor on CPU")
    options = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = run(device, options.quick, options.cpu_scale)
    from common import append_rows, print_rows

    print_rows(rows)
    if device.type == "cuda":
        print(f"appended to {append_rows(rows)}")


if __name__ == "__main__":
    main()

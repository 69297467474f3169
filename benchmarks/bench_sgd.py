"""SGD (momentum) step time: fusedops' FusedSGD (cuda, triton) vs torch's foreach and
fused=True SGD, on the ~1.1B-parameter LLaMA-like list of bench_adam.py (and its ViT-B/16 list),
fp32 and bf16.

GB/s counts the bytes a step must move: params and momentum buffers read and written, grads
read (5 passes over the params' bytes with momentum; 3 without: ``--no-momentum``). % of copy
bandwidth as bench_adam.py reports it. Goal on a GPU (stated, not measured): FusedSGD at least
as fast as torch's fused=True, at 90% of copy bandwidth or more on the 1.1B list.

Run: ``python benchmarks/bench_sgd.py [llama_1b|vit_b|small ...] [--dtypes bfloat16,...]
[--providers ...] [--no-momentum] [--quick]`` (default: llama_1b in fp32 and bf16; quick:
llama_1b in bf16). Without a GPU it runs on the CPU with the ``small`` list (~4M parameters):
fusedops' native backend (the CPU path) against torch's foreach and fused SGD (fused only in
fp32: torch's CPU fused SGD skips the vectorised part of fp16/bf16 tensors, pytorch#191763),
against this machine's memcpy bandwidth; rows are printed, not written.
"""

from __future__ import annotations

import argparse
import gc

import torch
from bench_adam import MODELS, make_params
from common import (
    add_quick_flag,
    append_rows,
    copy_bandwidth_gbps,
    cpu_median_ms,
    median_ms,
    pick,
    print_rows,
    set_quick,
    timing_fields,
)

#: Passes over the params' bytes a step moves: with momentum (p, b read and written, g read)
#: and without (p read and written, g read).
PASSES = {True: 5, False: 3}
LR = 1e-3


def optimizers(params, device: str, momentum: float) -> dict:
    """name -> a zero-argument callable making one optimizer's step (state built on first
    call)."""
    from fusedops.optim import FusedSGD

    options = dict(lr=LR, momentum=momentum)
    fused = {"cuda": ["cuda", "triton"], "cpu": ["native"]}[device]
    made = {
        f"fusedops-{backend}": (lambda b=backend: FusedSGD(params, backend=b, **options).step)
        for backend in fused
    }
    made["torch-foreach"] = lambda: torch.optim.SGD(params, foreach=True, **options).step
    if device == "cuda" or params[0].dtype in (torch.float32, torch.float64):
        made["torch-fused"] = lambda: torch.optim.SGD(params, fused=True, **options).step
    return made


def cpu_copy_bandwidth_gbps() -> float:
    """This host's copy bandwidth (GB/s, read + write bytes), from a 256 MiB copy."""
    src = torch.empty(2**26, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = cpu_median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(MODELS)}")
    parser.add_argument("--dtypes", default=None, help="comma-separated (float32,bfloat16)")
    parser.add_argument("--providers", default="", help="comma-separated (default: all)")
    parser.add_argument(
        "--no-momentum", action="store_true", help="momentum 0 (3 passes) instead of 0.9"
    )
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = args.models or pick(["llama_1b"], ["llama_1b"])
    dtypes = args.dtypes or pick("float32,bfloat16", "bfloat16")
    if device == "cpu":
        print("bench_sgd: no CUDA device, CPU run of the small list (fusedops' native backend)")
        models = args.models or ["small"]
        dtypes = args.dtypes or "float32,bfloat16"
    dtypes = [getattr(torch, name) for name in dtypes.split(",")]
    wanted = set(filter(None, args.providers.split(",")))
    momentum = 0.0 if args.no_momentum else 0.9
    copy_bw = copy_bandwidth_gbps() if device == "cuda" else cpu_copy_bandwidth_gbps()
    print(f"{device} copy bandwidth: {copy_bw:.0f} GB/s")
    time_ms = median_ms if device == "cuda" else cpu_median_ms
    rows = []
    for model in models:
        shapes = MODELS[model]()
        for dtype in dtypes:
            params = make_params(shapes, dtype, device)
            numel = sum(p.numel() for p in params)
            moved = PASSES[momentum != 0] * numel * params[0].element_size()
            for name, make_step in optimizers(params, device, momentum).items():
                if wanted and name not in wanted:
                    continue
                step = None
                try:
                    step = make_step()
                    step()  # builds the state
                    ms = time_ms(step)
                except Exception as exc:  # one provider failing must not hide the others
                    print(f"{model} {dtype} {name}: failed: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    step = None  # frees this provider's optimizer state
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
                row = {
                    "op": "sgd_step",
                    "provider": name,
                    "device": device,
                    "model": model,
                    "dtype": str(dtype).removeprefix("torch."),
                    "momentum": momentum,
                    "tensors": len(params),
                    "numel": numel,
                    **timing_fields(ms, moved, copy_bw),
                }
                rows.append(row)
                if device == "cuda":  # one row at a time: a cut run keeps what it measured
                    append_rows([row])
                print(row, flush=True)
            del params
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    print_rows(rows)


if __name__ == "__main__":
    main()

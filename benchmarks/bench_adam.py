"""AdamW step time: fusedops (cuda, triton) vs torch foreach, torch fused=True and torch.compile
of the foreach step, on the parameter shapes of a ViT-B/16 and of a ~1.1B-parameter LLaMA-like
model (many small norms + large matrices), fp32 and bf16.

GB/s counts the bytes a step must move: params, exp_avg and exp_avg_sq read and written, grads
read (7 passes over the params' bytes; moments in the param dtype). Run:
``python benchmarks/bench_adam.py [vit_b|llama_1b ...] [--dtypes bfloat16,...] [--providers ...]
[--quick]`` (quick: vit_b in bfloat16 unless models / dtypes are named).

``--clip`` (issue 28) times AMP unscale + gradient clipping + step instead: torch's sequence
(``scaler.unscale_``, ``clip_grad_norm_``, ``scaler.step`` of AdamW(fused=True), ``update``)
against ``scaler.step`` of FusedAdamW(max_grad_norm=...) (+ ``update``), and each optimizer's
step alone; a row's ``vs_step`` is its time over that of the same optimizer's step alone, and
``vs_torch`` torch's sequence time over its own. Goals on the GPU (llama_1b): fusedops' sequence
within 1.3x of its step alone and >= 1.5x faster than torch's sequence. The scale is 1 and the
max norm large, so repeated timing runs never shrink the gradients (the same work is done:
torch multiplies them by a coefficient of 1). Without a GPU, ``--clip`` runs on the CPU with
the ``small`` list (Triton's providers need a GPU there).
"""

from __future__ import annotations

import argparse
import gc

import torch
from common import (
    add_quick_flag,
    append_rows,
    compiled,
    copy_bandwidth_gbps,
    cpu_median_ms,
    median_ms,
    pick,
    print_rows,
    require_cuda,
    set_quick,
    timing_fields,
)

PASSES = 7


def vit_b_shapes() -> list[tuple[int, ...]]:
    """ViT-B/16 (224px, 1000 classes): 86M parameters in 152 tensors."""
    d, mlp = 768, 3072
    shapes = [(d, 3, 16, 16), (d,), (1, 1, d), (1, 197, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,)]  # norm1, qkv, proj
        shapes += [(d,), (d,), (mlp, d), (mlp,), (d, mlp), (d,)]  # norm2, fc1, fc2
    return shapes + [(d,), (d,), (1000, d), (1000,)]


def llama_1b_shapes() -> list[tuple[int, ...]]:
    """A TinyLlama-1.1B-like list: 22 layers of attention (GQA) + SwiGLU MLP + two norms."""
    d, kv, mlp, vocab = 2048, 256, 5632, 32000
    shapes = [(vocab, d)]
    for _ in range(22):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d)]
        shapes += [(d,), (mlp, d), (mlp, d), (d, mlp)]
    return shapes + [(d,), (vocab, d)]


def small_shapes() -> list[tuple[int, ...]]:
    """A 4-layer, d=256 version of the LLaMA-like list (~4M parameters): the CPU run."""
    d, kv, mlp, vocab = 256, 64, 704, 4000
    shapes = [(vocab, d)]
    for _ in range(4):
        shapes += [(d,), (d, d), (kv, d), (kv, d), (d, d), (d,), (mlp, d), (mlp, d), (d, mlp)]
    return shapes + [(d,), (vocab, d)]


MODELS = {"vit_b": vit_b_shapes, "llama_1b": llama_1b_shapes, "small": small_shapes}


def make_params(shapes, dtype, device="cuda") -> list[torch.nn.Parameter]:
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, device=device, dtype=dtype) * 0.02)
        p.grad = torch.randn_like(p) * 1e-3
        params.append(p)
    return params


#: clip_grad_norm_'s max norm in the --clip rows: above any norm here (coefficient 1)
CLIP_MAX_NORM = 1e6


def clip_sequences(params, device: str):
    """name -> a zero-argument callable doing unscale + clip + step (or the step alone) as a
    training loop does after backward, GradScaler's update included (state built on first
    call). Providers whose name ends in "-step" are the baselines of ``vs_step``."""
    from fusedops.optim import FusedAdamW

    def scaler():
        amp = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=2**30)
        amp.scale(torch.ones((), device=device))  # creates the scale (a backward would)
        return amp

    def torch_sequence():
        opt, amp = torch.optim.AdamW(params, lr=1e-3, fused=True), scaler()

        def run():
            amp.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, CLIP_MAX_NORM)
            amp.step(opt)
            amp.update()

        return run

    def fused_sequence(backend):
        opt = FusedAdamW(params, lr=1e-3, backend=backend, max_grad_norm=CLIP_MAX_NORM)
        amp = scaler()

        def run():
            amp.step(opt)
            amp.update()

        return run

    backends = ["cuda", "triton"] if device == "cuda" else ["reference"]
    sequences = {
        "torch-fused-step": lambda: torch.optim.AdamW(params, lr=1e-3, fused=True).step,
        "torch-fused-sequence": torch_sequence,
    }
    for backend in backends:
        sequences[f"fusedops-{backend}-step"] = lambda b=backend: (
            FusedAdamW(params, lr=1e-3, backend=b).step
        )
        sequences[f"fusedops-{backend}-sequence"] = lambda b=backend: fused_sequence(b)
    return sequences


def run_clip(models, dtypes, wanted) -> list[dict]:
    """The --clip rows (GPU: every model asked for; CPU: the ``small`` list, fp32)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("bench_adam --clip: no CUDA device, CPU run of the small list (reference backend)")
        models, dtypes = ["small"], [torch.float32]
    rows = []
    for model in models:
        for dtype in dtypes:
            params = make_params(MODELS[model](), dtype, device)
            numel = sum(p.numel() for p in params)
            times = {}
            for name, make in clip_sequences(params, device).items():
                if wanted and name not in wanted:
                    continue
                try:
                    run = make()
                    run()  # builds the state
                    times[name] = median_ms(run) if device == "cuda" else cpu_median_ms(run)
                except Exception as exc:  # one provider failing must not hide the others
                    print(f"{model} {dtype} {name}: failed: {type(exc).__name__}: {exc}")
                finally:
                    run = None
                    gc.collect()
            for name, ms in times.items():
                optimizer = name.rsplit("-", 1)[0]
                step_ms = times.get(f"{optimizer}-step")
                torch_ms = times.get("torch-fused-sequence")
                row = {
                    "op": "adamw_unscale_clip_step",
                    "provider": name,
                    "device": device,
                    "model": model,
                    "dtype": str(dtype).removeprefix("torch."),
                    "tensors": len(params),
                    "numel": numel,
                    "ms": round(ms, 4),
                    "vs_step": round(ms / step_ms, 3) if step_ms else "",
                    "vs_torch": round(torch_ms / ms, 3) if torch_ms else "",
                }
                rows.append(row)
                print(row, flush=True)
            if device == "cuda" and times:
                append_rows(rows[-len(times) :], "adam_clip")
            del params
            gc.collect()
    return rows


def optimizers(params):
    """name -> a zero-argument callable doing one optimizer step (state built on first call)."""
    from fusedops.optim import FusedAdamW

    def compiled_step():
        opt = torch.optim.AdamW(params, lr=torch.tensor(1e-3, device="cuda"), capturable=True)
        return compiled(opt.step)

    return {
        "fusedops-cuda": lambda: FusedAdamW(params, lr=1e-3, backend="cuda").step,
        "fusedops-triton": lambda: FusedAdamW(params, lr=1e-3, backend="triton").step,
        "torch-foreach": lambda: torch.optim.AdamW(params, lr=1e-3, foreach=True).step,
        "torch-fused": lambda: torch.optim.AdamW(params, lr=1e-3, fused=True).step,
        "torch-compile": compiled_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--dtypes", default=None, help="comma-separated (float32,bfloat16)")
    parser.add_argument("--providers", default="", help="comma-separated (default: all)")
    parser.add_argument(
        "--clip", action="store_true", help="unscale + clip + step sequences (issue 28)"
    )
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    dtypes = args.dtypes or pick("float32,bfloat16", "bfloat16")
    dtypes = [getattr(torch, name) for name in dtypes.split(",")]
    wanted = set(filter(None, args.providers.split(",")))
    if args.clip:
        print_rows(run_clip(args.models or ["llama_1b"], dtypes, wanted))
        return
    require_cuda("bench_adam")
    copy_bw = copy_bandwidth_gbps()
    print(f"device copy bandwidth: {copy_bw:.0f} GB/s")
    rows = []
    for model in args.models or pick(list(MODELS), ["vit_b"]):
        shapes = MODELS[model]()
        for dtype in dtypes:
            params = make_params(shapes, dtype)
            numel = sum(p.numel() for p in params)
            moved = PASSES * numel * params[0].element_size()
            for name, make_step in optimizers(params).items():
                if wanted and name not in wanted:
                    continue
                step = None
                try:
                    step = make_step()
                    step()  # builds the state (and compiles)
                    ms = median_ms(step)
                except Exception as exc:  # one provider failing must not hide the others
                    print(f"{model} {dtype} {name}: failed: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    step = None  # frees this provider's optimizer state
                    gc.collect()
                    torch.cuda.empty_cache()
                row = {
                    "op": "adamw_step",
                    "provider": name,
                    "model": model,
                    "dtype": str(dtype).removeprefix("torch."),
                    "tensors": len(params),
                    "numel": numel,
                    **timing_fields(ms, moved, copy_bw),
                }
                # one row at a time: a slow provider (torch.compile of a long list) cut off by a
                # time limit keeps the rows already measured
                rows.append(row)
                append_rows([row])
                print(row, flush=True)
            del params
            gc.collect()
            torch.cuda.empty_cache()
    print_rows(rows)


if __name__ == "__main__":
    main()

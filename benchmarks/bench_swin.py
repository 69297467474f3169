"""Swin-T training step end to end: images/s, peak memory and the loss curve of a Hugging Face
``SwinForImageClassification`` (swin-tiny's config, random init, no download) at 224 px, batch
128, bf16 autocast, AdamW, in four configurations:

- eager: the model as transformers builds it (its default attention implementation);
- fusedops: ``FUSEDOPS_HOOKS=all`` at interpreter start (LayerNorm, the Swin ops and window
  attention through the swin hook, FusedAdamW for ``torch.optim.AdamW``...);
- compile: ``torch.compile(model)``;
- compile+fusedops: both.

Each configuration runs in its own interpreter (hooks must be on before the model is built) on
the same fixed synthetic stream (seeded images and labels) from the same seeded init; the
losses of all steps are compared with eager's. Stochastic depth (swin-tiny's
drop_path_rate 0.1) is off so the four runs see the same computation; dropout rates are 0 in
swin-tiny's config. Images/s and peak memory cover the steps after the warm-up (which holds
compilation).

On a GPU: ``python benchmarks/bench_swin.py`` (CSV under benchmarks/results/; ``--quick``: eager
and fusedops only, batch 64, 10 steps of which 3 warm-up, unless given; rows in
``<gpu>_swin_quick.csv``). Without one it runs a smoke test: a tiny Swin on the CPU, a few
steps, the same four configurations and the same comparison, no speed claim and no CSV.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
CONFIGS = ("eager", "fusedops", "compile", "compile+fusedops")

#: swin-tiny (microsoft/swin-tiny-patch4-window7-224) without stochastic depth.
SWIN_TINY = dict(
    image_size=224,
    patch_size=4,
    num_channels=3,
    embed_dim=96,
    depths=[2, 2, 6, 2],
    num_heads=[3, 6, 12, 24],
    window_size=7,
    mlp_ratio=4.0,
    drop_path_rate=0.0,
    num_labels=1000,
)
#: The CPU smoke run's model (7 blocks of 2-4 heads of dim 16; shifted windows included).
SWIN_SMOKE = dict(
    image_size=32,
    patch_size=2,
    num_channels=3,
    embed_dim=32,
    depths=[2, 2],
    num_heads=[2, 4],
    window_size=4,
    drop_path_rate=0.0,
    num_labels=10,
)


# ------------------------------------------------------------------------------------------
# Worker: one configuration in this interpreter.


def worker(options: dict) -> None:
    """Train ``options["steps"]`` steps and print one ``RESULT {json}`` line."""
    import torch
    import torch.nn.functional as F
    from transformers import SwinConfig, SwinForImageClassification

    from fusedops import hooks

    config_name, device = options["config"], options["device"]
    torch.manual_seed(0)
    config = SwinConfig(**(SWIN_SMOKE if options["smoke"] else SWIN_TINY))
    model = SwinForImageClassification(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    forward = torch.compile(model) if config_name.startswith("compile") else model
    batch, steps, warmup = options["batch"], options["steps"], options["warmup"]
    stream = torch.Generator(device=device).manual_seed(1234)
    shape = (batch, 3, config.image_size, config.image_size)
    images = [torch.randn(shape, device=device, generator=stream) for _ in range(steps)]
    labels = [
        torch.randint(config.num_labels, (batch,), device=device, generator=stream)
        for _ in range(steps)
    ]
    losses = []
    cuda = device == "cuda"
    start = None
    for i in range(steps):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = forward(pixel_values=images[i]).logits
        loss = F.cross_entropy(logits.float(), labels[i])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {
        "config": config_name,
        "images_per_s": batch * (steps - warmup) / seconds,
        "step_ms": 1000 * seconds / (steps - warmup),
        "peak_MB": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "losses": [float(x) for x in torch.stack(losses).cpu()],
        "hooks": hooks.enabled(),
        "attn_implementation": model.config._attn_implementation,
        "optimizer": type(optimizer).__module__ + "." + type(optimizer).__name__,
        "attention_modules": sorted(
            {type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__}
        ),
    }
    print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------
# Parent: the four configurations in subprocesses, the table and the loss comparison.


def run_config(name: str, options: dict, timeout: float) -> dict | None:
    from fusedops.testing import run_python

    env = {"FUSEDOPS_HOOKS": "all"} if name.endswith("fusedops") else {}
    code = f"import bench_swin\nbench_swin.worker({ {**options, 'config': name}!r})\n"
    done = run_python("-c", code, cwd=BENCH_DIR, path=(BENCH_DIR,), env=env, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    print(f"{name}: failed (exit {done.returncode})\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return None


def compare(results: dict[str, dict]) -> list[str]:
    """Lines comparing each configuration's losses and speed with eager's."""
    eager = results.get("eager")
    lines = []
    for name, result in results.items():
        if eager is None or name == "eager":
            continue
        diffs = [abs(a - b) for a, b in zip(result["losses"], eager["losses"])]
        speed = result["images_per_s"] / eager["images_per_s"]
        lines.append(
            f"{name:17s} vs eager: {speed:.2f}x images/s; loss max |diff| {max(diffs):.4f} "
            f"(final loss {result['losses'][-1]:.4f} vs {eager['losses'][-1]:.4f})"
        )
    if "compile" in results and "compile+fusedops" in results:
        speed = results["compile+fusedops"]["images_per_s"] / results["compile"]["images_per_s"]
        lines.append(f"compile+fusedops vs compile: {speed:.2f}x images/s")
    if "compile" in results and "fusedops" in results:
        speed = results["fusedops"]["images_per_s"] / results["compile"]["images_per_s"]
        lines.append(f"fusedops vs compile: {speed:.2f}x images/s")
    return lines


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=None, help=f"default {','.join(CONFIGS)}")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--batch", type=int, default=None, help="default 128 (smoke: 4)")
    parser.add_argument("--steps", type=int, default=None, help="default 30 (smoke: 4)")
    parser.add_argument("--warmup", type=int, default=None, help="default 5 (smoke: 1)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per configuration")
    parser.add_argument(
        "--quick", action="store_true", help="eager,fusedops, batch 64, 10 steps (3 warm-up)"
    )
    args = parser.parse_args()
    args.configs = args.configs or ("eager,fusedops" if args.quick else ",".join(CONFIGS))
    for name in args.configs.split(","):
        if name not in CONFIGS:
            parser.error(f"unknown configuration {name!r}; choose from {', '.join(CONFIGS)}")
    return args


def main() -> None:
    import torch

    args = parse_args()
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke and not args.smoke:
        print("bench_swin: no CUDA device here: smoke run (tiny Swin on the CPU, no speed claim)")
    options = {
        "smoke": smoke,
        "device": "cpu" if smoke else "cuda",
        "batch": args.batch or (4 if smoke else 64 if args.quick else 128),
        "steps": args.steps or (4 if smoke else 10 if args.quick else 30),
        "warmup": args.warmup
        if args.warmup is not None
        else (1 if smoke else 3 if args.quick else 5),
    }
    if not 0 <= options["warmup"] < options["steps"]:
        sys.exit("bench_swin: --warmup must be below --steps")
    print(f"bench_swin: {json.dumps(options)}")
    results = {}
    for name in args.configs.split(","):
        began = time.time()
        result = run_config(name, options, args.timeout)
        if result is None:
            continue
        results[name] = result
        peak = f"{result['peak_MB']:.0f} MB" if result["peak_MB"] is not None else "-"
        print(
            f"{name:17s} {result['images_per_s']:9.1f} images/s  {result['step_ms']:8.1f} ms/step"
            f"  peak {peak}  hooks={','.join(result['hooks']) or '-'}"
            f"  attention={result['attention_modules']} ({result['attn_implementation']})"
            f"  optimizer={result['optimizer']}  [{time.time() - began:.0f} s]"
        )
    for line in compare(results):
        print(line)
    if not smoke and results:
        sys.path.insert(0, str(BENCH_DIR))
        from common import append_rows, set_quick

        set_quick(args.quick)

        rows = [
            {
                "model": "swin-tiny",
                "batch": options["batch"],
                "steps": options["steps"],
                "config": r["config"],
                "images_per_s": f"{r['images_per_s']:.1f}",
                "step_ms": f"{r['step_ms']:.2f}",
                "peak_MB": f"{r['peak_MB']:.0f}",
                "final_loss": f"{r['losses'][-1]:.4f}",
                "losses": " ".join(f"{x:.4f}" for x in r["losses"]),
                "hooks": ",".join(r["hooks"]),
            }
            for r in results.values()
        ]
        print(f"appended to {append_rows(rows, 'swin')}")
    if len(results) != len(args.configs.split(",")):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

"""fusedops.xla on CPU: eager vs partial_trace(xla) vs torch.compile (inductor).

Models: (a) MLP, 4 Linear layers of width 1024, batch 256; (b) ViT-style stack, dim 256, 4 heads,
sequence 196, batch 8, 4 blocks. For each backend: median forward+backward step time, first-call
(compile) time. Each backend runs in its own process (twice, mirrored order), so thread pools of
different runtimes (OpenMP for eager/inductor, Eigen for XLA) never compete. Also the bridge's
cost per tensor crossing (cached parameter torch->JAX, activation torch->JAX, JAX->torch).
Prints a table, appends rows to ``benchmarks/results/cpu-xla.csv`` and the printed output to
``benchmarks/results/cpu-xla.log``.

Run: ``.venv/bin/python benchmarks/bench_xla.py [--steps N] [--backends eager,xla,inductor]``
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
FIELDS = ["date", "device", "model", "backend", "step_ms_median", "compile_s", "notes"]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def mlp_case():
    layers = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return "mlp-4x1024-b256", nn.Sequential(*layers[:-1]), torch.randn(256, 1024)


def vit_case():
    model = nn.Sequential(*[Block(256, 4) for _ in range(4)])
    return "vit-d256-h4-s196-b8-4blk", model, torch.randn(8, 196, 256)


def make_forward(backend: str, model: nn.Module):
    if backend == "eager":
        return model
    if backend == "xla":
        from fusedops.xla import partial_trace

        return partial_trace(model, backend="xla")
    return torch.compile(model, dynamic=False)


def time_backend(backend: str, model: nn.Module, x: torch.Tensor, steps: int):
    """Median forward+backward ms and first-call seconds of one backend."""
    forward = make_forward(backend, model)

    def step():
        model.zero_grad(set_to_none=True)
        forward(x).square().mean().backward()

    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), compile_s


def run_worker(backend: str, case: str, steps: int, wait_policy: str) -> dict:
    """Time one backend on one model in a fresh process (so that OpenMP / XLA thread pools of
    different backends never run side by side), with OMP_WAIT_POLICY=wait_policy ("" leaves
    OpenMP's default); returns {"ms", "compile_s"}."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import torch; "
        "from benchmarks import bench_xla as b; torch.manual_seed(0); "
        "name, model, x = getattr(b, sys.argv[3])(); "
        "ms, c = b.time_backend(sys.argv[2], model, x, int(sys.argv[4])); "
        "print('RESULT', json.dumps({'ms': ms, 'compile_s': c}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), backend, case, str(steps)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{backend} on {case} failed:\n{done.stderr[-2000:]}")


def bridge_overhead_us(n: int = 2000) -> dict[str, float]:
    """Median-of-5 mean cost (µs) of one crossing, per kind."""
    import jax.numpy as jnp

    from fusedops.xla import bridge

    param = nn.Parameter(torch.randn(1024, 1024))
    act = torch.randn(256, 1024)
    bridge.to_jax(param)
    array = jnp.asarray(act.numpy()) + 0

    def per_call(fn):
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - start) / n * 1e6)
        return statistics.median(runs)

    return {
        "param_cached_to_jax_us": per_call(lambda: bridge.to_jax(param)),
        "activation_to_jax_us": per_call(lambda: bridge.to_jax(act)),
        "jax_to_torch_us": per_call(lambda: bridge.to_torch(array)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--backends", default="eager,xla,inductor")
    parser.add_argument(
        "--omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY of every backend's process ('' = OpenMP's default). PASSIVE: "
        "torch's OpenMP threads sleep instead of spinning between ops, leaving the cores to "
        "XLA's threads (on 2 cores the spinning costs partial_trace about 30%%)",
    )
    args = parser.parse_args()
    backends = args.backends.split(",")
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    device = f"cpu-{os.cpu_count()}core-{platform.machine()}"
    today = datetime.date.today().isoformat()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    say(
        f"fusedops.xla CPU benchmark  {datetime.datetime.now():%Y-%m-%d %H:%M}  {device}  "
        f"torch {torch.__version__}  load average at start {load:.2f}  "
        f"OMP_WAIT_POLICY={args.omp_wait_policy or '(default)'} for every backend"
    )
    bridge = bridge_overhead_us()
    say("bridge crossing cost: " + ", ".join(f"{k}={v:.1f}" for k, v in bridge.items()))
    rows = []
    header = f"{'model':28} {'backend':10} {'step_ms':>9} {'compile_s':>9} {'vs eager':>9}"
    say(header)
    say("-" * len(header))
    for case in ("mlp_case", "vit_case"):
        name = getattr(sys.modules[__name__], case)()[0]
        # each backend in its own process, twice, in mirrored order (load drifts hit all alike)
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        for backend in backends + backends[::-1]:
            runs[backend].append(run_worker(backend, case, args.steps, args.omp_wait_policy))
        eager_ms = statistics.median(r["ms"] for r in runs["eager"]) if "eager" in runs else None
        for backend in backends:
            ms = statistics.median(r["ms"] for r in runs[backend])
            compile_s = runs[backend][0]["compile_s"]
            ratio = f"{ms / eager_ms:.2f}x" if eager_ms else "-"
            say(f"{name:28} {backend:10} {ms:9.2f} {compile_s:9.2f} {ratio:>9}")
            spread = "/".join(f"{r['ms']:.1f}" for r in runs[backend])
            notes = (
                f"fwd+bwd; median of {args.steps} steps per process, 2 processes ({spread} ms); "
                f"time/eager={ratio}; OMP_WAIT_POLICY={args.omp_wait_policy or 'default'}"
            )
            if backend == "xla":
                notes += "; " + "; ".join(f"{k}={v:.1f}" for k, v in bridge.items())
            rows.append([today, device, name, backend, f"{ms:.3f}", f"{compile_s:.2f}", notes])
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "cpu-xla.csv"
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(FIELDS)
        writer.writerows(rows)
    with (RESULTS / "cpu-xla.log").open("a") as log:  # every run kept, like the CSV
        log.write("\n".join(lines) + "\n\n")
    say(f"appended {len(rows)} rows to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

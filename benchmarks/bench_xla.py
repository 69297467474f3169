"""fusedops.xla: eager vs partial_trace(xla) vs torch.compile (inductor), forward+backward steps.

CPU models (the default without a GPU): (a) MLP, 4 Linear layers of width 1024, batch 256; (b)
ViT-style stack, dim 256, 4 heads, sequence 196, batch 8, 4 blocks. GPU (``--device cuda``, the
default where CUDA is present): a ViT-B/16 (224x224 images, 12 blocks of width 768, batch 64).
For each backend: median and 20th percentile of the forward+backward step times pooled over all
its processes, first-call (compile) time. Each backend runs alone in a fresh process (2 x
--rounds times, mirrored order) in its default settings: no ``OMP_WAIT_POLICY`` for any (eager
and inductor as users run them; partial_trace with what it sets up itself, ``fusedops.xla.omp``),
so load drifts of a shared machine hit every backend alike; the 20th percentile shows speed
with bursts of load (the 2-core CPU machine has steps 1.9x the fastest) left out. Backend
``xla_jax_first`` is partial_trace in a process that imports jax before torch (``xla``:
torch first); partial_trace's rows say how many of its regions ran as eager torch and as XLA
in its first process (on the CPU each region picks the faster on its first call,
``fusedops.xla.pick``). Also the bridge's cost per tensor crossing (cached parameter
torch->JAX, activation torch->JAX, JAX->torch, on the CPU). Prints a table, appends rows to
``benchmarks/results/cpu-xla.csv`` (GPU: ``<gpu>_xla.csv``) and the printed output to the
``.log`` beside it.

Run: ``.venv/bin/python benchmarks/bench_xla.py [--steps N] [--rounds R] [--device cpu|cuda]
[--models mlp,vit,vit_b16] [--batch B] [--dtype float32|bfloat16]
[--backends eager,xla,inductor,xla_jax_first,optimize] [--omp-wait-policy P] [--quick]``
(``optimize``: fusedops.optimize, its trials in each process's first step; quick: 1 round
of 6 steps, eager and xla, unless given; rows in ``..._xla_quick.csv``)
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
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import hf_models  # noqa: E402
from benchmarks.common import add_quick_flag, gpu_name, pick, set_quick  # noqa: E402

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


class ViTB16(nn.Module):
    """ViT-B/16 backbone and classifier: 16x16 patches of a 224x224 image, 12 blocks of width
    768 with 12 heads, mean pooling, 1000 classes (86M parameters)."""

    def __init__(self, dim: int = 768, depth: int = 12, heads: int = 12):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, 16, stride=16)
        self.position = nn.Parameter(torch.randn(1, 196, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1000)

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.blocks(x)).mean(1))


def mlp_case(batch: int):
    layers = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers[:-1]), torch.randn(batch, 1024)


def vit_case(batch: int):
    return nn.Sequential(*[Block(256, 4) for _ in range(4)]), torch.randn(batch, 196, 256)


def vit_b16_case(batch: int):
    return ViTB16(), torch.randn(batch, 3, 224, 224)


def hf_case(model: str):
    """The (LossOf(model), batch) builder of ``hf_models``' model ``model`` at the benchmark's
    size (``hf_models.Size``) with the given batch size."""

    def build(batch: int):
        return hf_models.build(model, hf_models.Size(batch=batch))

    return build


#: --models names -> (name pattern, (model, input) builder, default batch); a model whose
#: forward returns a 0-dim tensor (the HF set's) returns its loss
CASES = {
    "mlp": ("mlp-4x1024-b{batch}", mlp_case, 256),
    "vit": ("vit-d256-h4-s196-b{batch}-4blk", vit_case, 8),
    "vit_b16": ("vit-b16-224-b{batch}", vit_b16_case, 64),
}
#: ``--hf``: the Hugging Face set (``hf_models``), hidden 256, 4 layers, seq 128 / 64 px images
HF_MODELS = [f"hf_{name}" for name in hf_models.NAMES]
for _name in hf_models.NAMES:
    CASES[f"hf_{_name}"] = (f"hf-{_name}-h256-l4-b{{batch}}", hf_case(_name), hf_models.Size.batch)


def case_name(model: str, batch: int | None, dtype: str) -> str:
    """The name results carry for ``CASES[model]`` (dtype suffix unless float32)."""
    pattern, _, default_batch = CASES[model]
    suffix = "" if dtype == "float32" else f"-{dtype}"
    return pattern.format(batch=batch or default_batch) + suffix


def _to(x, device: str, kind: torch.dtype):
    """A model input (a tensor or a dict of them) on ``device``, floating tensors in ``kind``."""
    if isinstance(x, dict):
        return {k: _to(v, device, kind) for k, v in x.items()}
    return x.to(device, kind) if x.is_floating_point() else x.to(device)


def build_case(model: str, batch: int | None, device: str, dtype: str):
    """(name, model, input) of ``CASES[model]`` on ``device`` in ``dtype`` (a torch.dtype
    name); the input is a tensor or (the HF set) a dict of tensors."""
    _, build, default_batch = CASES[model]
    module, x = build(batch or default_batch)
    kind = getattr(torch, dtype)
    return case_name(model, batch, dtype), module.to(device, kind), _to(x, device, kind)


#: backends of ``--backends``: partial_trace(xla) twice, torch imported first or jax first;
#: ``optimize``: fusedops.optimize(model), its decisions in a cache of the process's own (each
#: process times its candidates on its first step)
BACKENDS = ("eager", "xla", "inductor", "xla_jax_first", "optimize")


def make_forward(backend: str, model: nn.Module):
    """``model`` run by ``backend`` (one of ``BACKENDS``): as is, under
    ``partial_trace(backend="xla")`` or under ``torch.compile``."""
    if backend == "eager":
        return model
    if backend == "optimize":
        import fusedops

        return fusedops.optimize(model)
    if backend in ("xla", "xla_jax_first"):
        from fusedops.xla import partial_trace

        return partial_trace(model, backend="xla")
    return torch.compile(model, dynamic=False)


def time_backend(backend: str, model: nn.Module, x, steps: int, record: dict | None = None):
    """Forward+backward ms of each of ``steps`` steps (after 2 warm-up steps) and the first
    call's seconds, for one backend. The loss is the model's output where that is 0-dim, else
    mean(output**2). ``record`` (a dict) gets ``"picks"``: under partial_trace on the CPU, how
    each region runs (``"xla"`` or ``"eager"``, ``fusedops.xla.pick``), else empty."""
    forward = make_forward(backend, model)
    cuda = next(model.parameters()).device.type == "cuda"

    def step():
        model.zero_grad(set_to_none=True)
        out = forward(x)
        (out if out.dim() == 0 else out.float().square().mean()).backward()
        if cuda:  # eager and inductor queue their work; XLA's results are already ready
            torch.cuda.synchronize()

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
    if record is not None:
        stats = getattr(forward, "stats", None)
        record["picks"] = [p["pick"] for p in stats.picks] if stats is not None else []
    return times, compile_s


def run_worker(backend: str, case: list[str], steps: int, wait_policy: str) -> dict:
    """Time one backend on one model (``case``: model, batch, device, dtype as strings) in a
    fresh process (so that OpenMP / XLA thread pools of different backends never run side by
    side), with OMP_WAIT_POLICY=wait_policy ("" leaves OpenMP's default, as the caller's
    environment has it or not); ``xla_jax_first`` imports jax before torch. Returns
    {"ms": [per-step ms], "compile_s", "picks": [each region's "xla" or "eager"]}."""
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch on a GPU
    if backend == "optimize":  # its trials in every process: no decision from an earlier one
        env["FUSEDOPS_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusedops-bench-")
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        + ("import jax; " if backend == "xla_jax_first" else "")
        + "import torch; "
        "from benchmarks import bench_xla as b; torch.manual_seed(0); "
        "m, batch, device, dtype = sys.argv[4:8]; "
        "name, model, x = b.build_case(m, int(batch), device, dtype); "
        "record = {}; ms, c = b.time_backend(sys.argv[2], model, x, int(sys.argv[3]), record); "
        "print('RESULT', json.dumps({'ms': ms, 'compile_s': c, **record}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), backend, str(steps), *case],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{backend} on {case} failed:\n{done.stderr[-2000:]}")


def _percentile20(sorted_ms: list[float]) -> float:
    return sorted_ms[len(sorted_ms) // 5]


def bridge_overhead_us(n: int = 2000) -> dict[str, float]:
    """Median-of-5 mean cost (µs) of one crossing, per kind."""
    import jax

    from fusedops.xla import bridge

    param = nn.Parameter(torch.randn(1024, 1024))
    act = torch.randn(256, 1024)
    bridge.to_jax(param)
    array = jax.device_put(act.numpy(), jax.devices("cpu")[0]) + 0  # on the CPU whatever JAX's
    # default backend

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
    parser.add_argument("--steps", type=int, default=None, help="default 21 (quick: 6)")
    parser.add_argument(
        "--backends", default=None, help=f"of {BACKENDS}, default eager,xla,inductor"
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        choices=["cpu", "cuda"],
        help="default: cuda where there is one",
    )
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, of {sorted(CASES)} (default: mlp,vit on cpu, vit_b16 on cuda)",
    )
    parser.add_argument(
        "--hf",
        action="store_true",
        help="the Hugging Face model set (benchmarks/hf_models.py), after any --models",
    )
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: per model)")
    parser.add_argument("--dtype", default="float32", help="parameters' and input's dtype")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="each round runs every backend twice (mirrored order), each in a new process "
        "(default 2, quick: 1)",
    )
    parser.add_argument(
        "--omp-wait-policy",
        default="",
        help="OMP_WAIT_POLICY of every backend's process (default '': OpenMP's default, as "
        "users run; PASSIVE makes torch's threads sleep between ops, which slows eager)",
    )
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    args.steps = args.steps or pick(21, 6)
    args.rounds = args.rounds or pick(2, 1)
    backends = (args.backends or pick("eager,xla,inductor", "eager,xla")).split(",")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("bench_xla --device cuda: no CUDA device here (skipped)")
        return
    models = args.models.split(",") if args.models else []
    if args.hf:
        models += HF_MODELS
    models = models or (["vit_b16"] if cuda else ["mlp", "vit"])
    unknown = sorted(set(models) - set(CASES))
    if unknown or args.rounds < 1 or args.steps < 1:
        parser.error(f"--models from {sorted(CASES)} (not {unknown}), --rounds and --steps >= 1")
    if set(backends) - set(BACKENDS):
        parser.error(f"--backends from {BACKENDS}, not {sorted(set(backends) - set(BACKENDS))}")
    if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        parser.error(f"--dtype {args.dtype!r} is not a torch dtype")
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    device = gpu_name() if cuda else f"cpu-{os.cpu_count()}core-{platform.machine()}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ((f"{device}_xla" if cuda else "cpu-xla") + pick("", "_quick") + ".csv")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    say(
        f"fusedops.xla {args.device.upper()} benchmark  {datetime.datetime.now():%Y-%m-%d %H:%M}"
        f"  {device}  torch {torch.__version__}  load average at start {load:.2f}  "
        f"OMP_WAIT_POLICY={args.omp_wait_policy or '(default)'} for every backend, "
        f"{os.environ.get('FUSEDOPS_XLA_PARK_OMP') or 'default'} FUSEDOPS_XLA_PARK_OMP, "
        f"{os.environ.get('FUSEDOPS_XLA_CPU_PICK') or 'default'} FUSEDOPS_XLA_CPU_PICK"
    )
    bridge = bridge_overhead_us()
    say("bridge crossing cost: " + ", ".join(f"{k}={v:.1f}" for k, v in bridge.items()))
    header = (
        f"{'model':28} {'backend':14} {'step_ms':>9} {'compile_s':>9} {'vs eager':>9} "
        f"{'p20_ms':>9} {'vs eager':>9}"
    )
    say(header)
    say("-" * len(header))
    try:
        written = _run_models(args, backends, models, device, path, bridge, say)
    finally:  # the log keeps what was printed, even when a worker failed
        with path.with_suffix(".log").open("a") as log:
            log.write("\n".join(lines) + "\n\n")
    print(f"appended {written} rows to {path.relative_to(ROOT)}")


def _run_models(args, backends, models, device, path, bridge, say) -> int:
    """Time every backend on every model; append each model's rows to ``path`` when done;
    return the number of rows."""
    today = datetime.date.today().isoformat()
    written = 0
    for model in models:
        rows = []
        case = [model, str(args.batch or CASES[model][2]), args.device, args.dtype]
        name = case_name(model, args.batch, args.dtype)
        # each backend in its own process, 2 x rounds times, in mirrored order, so that load
        # drifts of this shared machine hit every backend alike
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        for backend in (backends + backends[::-1]) * args.rounds:
            runs[backend].append(run_worker(backend, case, args.steps, args.omp_wait_policy))
        pooled = {b: sorted(t for r in runs[b] for t in r["ms"]) for b in backends}
        median = {b: statistics.median(pooled[b]) for b in backends}
        eager_ms = median.get("eager")
        for backend in backends:
            ms, steps = median[backend], pooled[backend]
            p20 = _percentile20(steps)
            compile_s = runs[backend][0]["compile_s"]
            ratio = f"{ms / eager_ms:.2f}x" if eager_ms else "-"
            p20_ratio = f"{p20 / _percentile20(pooled['eager']):.2f}x" if eager_ms else "-"
            say(
                f"{name:28} {backend:14} {ms:9.2f} {compile_s:9.2f} {ratio:>9} {p20:9.2f} "
                f"{p20_ratio:>9}"
            )
            spread = "/".join(f"{statistics.median(r['ms']):.1f}" for r in runs[backend])
            notes = (
                f"fwd+bwd; median of {len(steps)} steps pooled from {len(runs[backend])} "
                f"processes of {args.steps} (per-process medians {spread} ms); "
                f"time/eager={ratio}; 20th percentile {p20:.1f} ms ({p20_ratio} eager's); "
                f"OMP_WAIT_POLICY={args.omp_wait_policy or 'default'}"
            )
            if backend.startswith("xla"):
                notes += "; " + "; ".join(f"{k}={v:.1f}" for k, v in bridge.items())
                picks = runs[backend][0].get("picks", [])
                regions = f"regions run as eager/xla: {picks.count('eager')}/{picks.count('xla')}"
                notes += f"; {regions} (first process; fusedops.xla.pick)"
                say(f"{'':28} {backend:14} {regions}")
            rows.append([today, device, name, backend, f"{ms:.3f}", f"{compile_s:.2f}", notes])
        _append(path, rows)  # each model's rows as soon as they exist (a later one may fail)
        written += len(rows)
    return written


def _append(path: Path, rows: list[list]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(FIELDS)
        writer.writerows(rows)


if __name__ == "__main__":
    main()

"""A data-parallel training step: eager DDP vs partial_trace inside DDP vs xla_trace of the step.

Runs ``examples/ddp_train.py`` under ``torchrun --nproc_per_node=N`` (default 2 ranks, gloo on
the CPU; NCCL on GPUs where CUDA is present) once per mode and round: each mode in its own
fresh process group, in the thread settings torchrun gives (``OMP_NUM_THREADS=1`` per rank
unless set), rounds in mirrored order so that load drifts of a shared machine hit every mode
alike. The model: an MLP backbone (``--depth`` Linear+GELU of ``--width``) and a head, AdamW,
``--batch`` rows per rank. Per mode: the median over rounds of each run's median ms/step (steps
after the first 3), the first step's time (compiles), and whether the ranks ended in sync. Prints
a table and appends rows to ``benchmarks/results/cpu-ddp.csv`` (GPU: ``<gpu>_ddp.csv``).

Run: ``.venv/bin/python benchmarks/bench_ddp.py [--ranks N] [--steps S] [--rounds R]
[--modes eager,partial_trace,xla_trace] [--width W] [--depth D] [--batch B] [--quick]``
(quick: 1 round of 8 steps; rows in ``..._ddp_quick.csv``)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import add_quick_flag, append_csv, gpu_name, pick, set_quick  # noqa: E402
from fusedops.testing import free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODES = ("eager", "partial_trace", "xla_trace")


def run_mode(mode: str, args, attempts: int = 3) -> dict:
    """One torchrun of the example in ``mode``; its rank 0's JSON result. A run whose rank
    aborts is retried (up to ``attempts`` runs): about 1 run in 40 on the 2-core machine, a
    gloo rank aborts at interpreter shutdown, after its work ("terminate called without an
    active exception"; see fusedops.testing.run_gloo)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}",
        f"--master_port={free_port()}", str(ROOT / "examples" / "ddp_train.py"),
        f"--mode={mode}", f"--steps={args.steps}", f"--batch={args.batch}",
        f"--width={args.width}", f"--depth={args.depth}",
    ]  # fmt: skip
    for attempt in range(attempts):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])
        print(f"{mode}: torchrun failed ({done.returncode}), attempt {attempt + 1}/{attempts}")
    raise RuntimeError(f"{mode}: torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    add_quick_flag(parser)
    args = parser.parse_args()
    set_quick(args.quick)
    args.steps = args.steps or pick(40, 8)
    args.rounds = args.rounds or pick(3, 1)
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {MODES}")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            results[mode].append(run_mode(mode, args))
    cuda = torch.cuda.is_available()
    device = gpu_name() if cuda else f"cpu-{os.cpu_count()}core-{platform.machine()}"
    model = f"mlp-{args.depth}x{args.width}-b{args.batch}x{args.ranks}ranks"
    stamp = datetime.date.today().isoformat()
    eager_ms = (
        statistics.median(r["step_ms_median"] for r in results["eager"])
        if "eager" in results
        else None
    )
    rows = []
    for mode, runs in results.items():
        ms = statistics.median(r["step_ms_median"] for r in runs)
        ratio = f"; time/eager={ms / eager_ms:.2f}x" if eager_ms else ""
        rows.append(
            {
                "date": stamp,
                "device": device,
                "model": model,
                "backend": f"ddp-{mode}",
                "step_ms_median": f"{ms:.3f}",
                "compile_s": f"{statistics.median(r['first_step_s'] for r in runs):.2f}",
                "notes": (
                    f"fwd+bwd+all-reduce+AdamW, median of {len(runs)} torchrun runs' medians of "
                    f"{args.steps - 3} steps{ratio}; "
                    f"ranks_agree={all(r['ranks_agree'] for r in runs)}; "
                    f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'torchrun default (1)')}"
                ),
            }
        )
    for row in rows:
        print(f"{row['backend']:20s} {row['step_ms_median']:>10s} ms  {row['notes']}")
    name = f"{gpu_name()}_ddp" if cuda else "cpu-ddp"
    path = append_csv(RESULTS / f"{name}{pick('', '_quick')}.csv", rows)
    print(f"rows appended to {path}")


if __name__ == "__main__":
    main()

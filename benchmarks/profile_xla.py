"""Where a partial_trace training step spends its time: per XLA program (calls, ms inside the
program's call: inputs crossing to JAX, the XLA run, results crossing back) and the rest of the
step (eager ops between programs, autograd, Dynamo's guards), for ``bench_xla``'s models.

Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/profile_xla.py [--models hf_bert,...]
[--steps N]``. One process for all the models named; numbers are medians over the steps.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import bench_xla  # noqa: E402
from fusedops.xla import program  # noqa: E402


def profile(model_name: str, steps: int) -> None:
    """Print the step's split for ``model_name`` (a ``bench_xla.CASES`` key)."""
    name, model, x = bench_xla.build_case(model_name, None, "cpu", "float32")
    forward = bench_xla.make_forward("xla", model)
    spent: dict[int, list[float]] = collections.defaultdict(list)
    shapes: dict[int, tuple[str, int, int]] = {}
    original = program.JaxProgram.__call__

    def timed(self, args):
        start = time.perf_counter()
        outs = original(self, args)
        spent[id(self)].append((time.perf_counter() - start) * 1e3)
        shapes[id(self)] = (self.name, len(self.placeholders), len(self._computed))
        return outs

    def step() -> None:
        model.zero_grad(set_to_none=True)
        forward(x).backward()

    program.JaxProgram.__call__ = timed
    try:
        for _ in range(3):
            step()
        spent.clear()
        totals = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            totals.append((time.perf_counter() - start) * 1e3)
    finally:
        program.JaxProgram.__call__ = original
    step_ms = statistics.median(totals)
    inside = 0.0
    print(f"{name}: step {step_ms:.2f} ms (median of {steps}), {len(spent)} programs")
    for key, times in spent.items():
        label, n_in, n_out = shapes[key]
        per_step = sum(times) / steps
        inside += per_step
        print(
            f"  {label:<24} {len(times) // steps} call(s)/step  {per_step:8.2f} ms/step  "
            f"{n_in} inputs, {n_out} outputs"
        )
    print(f"  outside programs (eager ops, autograd, guards): {step_ms - inside:.2f} ms/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(bench_xla.HF_MODELS))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for model_name in args.models.split(","):
        profile(model_name, args.steps)


if __name__ == "__main__":
    main()

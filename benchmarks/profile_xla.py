"""Where a partial_trace training step spends its time: per XLA program (calls, ms inside the
program's call: inputs crossing to JAX, the XLA run, results crossing back) and the rest of the
step (eager ops between programs, autograd, Dynamo's guards), for ``bench_xla``'s models; with
``--eager`` also eager's forward and backward timed apart, to set beside the programs. With
``--gemm``: the weight- and input-gradient matrix products of a BERT layer (hidden 256, 1024
tokens) in torch and in XLA with each CPU dot library of ``fusedops.xla.tune``.

Run: ``.venv/bin/python benchmarks/profile_xla.py [--models hf_bert,...]
[--steps N] [--eager] [--gemm]``. One process for all the models named; numbers are medians
over the steps.
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


def eager_split(model_name: str, steps: int) -> None:
    """Print eager's forward and backward medians for ``model_name``."""
    name, model, x = bench_xla.build_case(model_name, None, "cpu", "float32")
    forward, backward = [], []
    for i in range(steps + 3):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = model(x)
        middle = time.perf_counter()
        loss.backward()
        if i >= 3:
            forward.append((middle - start) * 1e3)
            backward.append((time.perf_counter() - middle) * 1e3)
    print(
        f"{name} eager: forward {statistics.median(forward):.2f} ms, backward "
        f"{statistics.median(backward):.2f} ms (medians of {steps})"
    )


def gemm() -> None:
    """Print torch's and XLA's times of a BERT layer's gradient products (median of 30)."""
    import jax
    import jax.numpy as jnp
    import torch

    from fusedops.xla import tune

    def median_ms(fn, *args) -> float:
        times = []
        for i in range(33):
            start = time.perf_counter()
            out = fn(*args)
            if hasattr(out, "block_until_ready"):
                out.block_until_ready()
            if i >= 3:
                times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    # (label, a's shape, b's shape, contracted dim of a, of b)
    cases = [
        ("weight grad [1024,1024]^T [1024,256]", (1024, 1024), (1024, 256), 0, 0),
        ("weight grad [1024,256]^T [1024,1024]", (1024, 256), (1024, 1024), 0, 0),
        ("input grad [1024,1024] [1024,256]", (1024, 1024), (1024, 256), 1, 0),
        ("input grad [1024,256] [256,256]", (1024, 256), (256, 256), 1, 0),
    ]
    for label, a_shape, b_shape, ca, cb in cases:
        a, b = torch.rand(a_shape), torch.rand(b_shape)
        lhs = a.t() if ca == 0 else a
        row = [f"{label:38s} torch {median_ms(torch.matmul, lhs, b):.3f} ms"]
        for library, options in tune.CANDIDATES.items():
            dims = (((ca,), (cb,)), ((), ()))
            product = jax.jit(
                lambda x, y, d=dims: jax.lax.dot_general(x, y, d, precision="highest"),
                compiler_options=options or None,
            )
            ms = median_ms(product, jnp.asarray(a.numpy()), jnp.asarray(b.numpy()))
            row.append(f"{library} {ms:.3f} ms")
        print("  ".join(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(bench_xla.HF_MODELS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eager", action="store_true", help="also eager's forward / backward")
    parser.add_argument("--gemm", action="store_true", help="BERT's gradient products alone")
    args = parser.parse_args()
    for model_name in args.models.split(",") if args.models else []:
        if args.eager:
            eager_split(model_name, args.steps)
        profile(model_name, args.steps)
    if args.gemm:
        gemm()


if __name__ == "__main__":
    main()

"""Coverage of PyTorch's OpInfo database by fusedops.xla (partial_trace(fullgraph=True)).

Every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db``: up to
``--samples`` float32 samples on the CPU, forward and backward, through
``fusedops.xla.opinfo.check`` (eager vs ``partial_trace(fn, fullgraph=True)``). Writes
``benchmarks/results/cpu-opinfo-coverage.csv`` (one row per OpInfo: status, samples run, missing
ops, the first difference or error) and ``cpu-opinfo-coverage.md`` (totals and the table), and
prints the totals. In scope: float32, capturable by aot_eager as one graph, deterministic, not
data-dependent (``fusedops.xla.opinfo`` says how each is decided).

    nice python benchmarks/opinfo_coverage.py [--samples 3] [--only add,mul] [--jobs 2]
    python benchmarks/opinfo_coverage.py --from-csv     # rewrite the .md from the .csv
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import multiprocessing
import os
import signal
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("opinfo", "status", "samples", "backward", "missing_ops", "detail")


def _timeout(signum, frame):
    raise TimeoutError("took longer than the per-OpInfo limit")


def _check_slice(task: tuple) -> list[dict]:
    """Run ``check`` on the OpInfos at the given positions of op_db (in a worker process)."""
    positions, samples, limit = task
    os.environ.setdefault("FUSEDOPS_XLA_CPU_TUNE", "0")
    import warnings

    import torch

    from fusedops.xla import opinfo

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    db = opinfo.op_db()
    rows = []
    signal.signal(signal.SIGALRM, _timeout)
    for i in positions:
        info = db[i]
        signal.alarm(limit)
        try:
            result = opinfo.check(info, samples)
        except Exception as error:  # noqa: BLE001 - the sweep reports and goes on
            detail = f"{type(error).__name__} in the sweep: {str(error)[:150]}"
            result = opinfo.Result(opinfo.opinfo_id(info), "error", detail=detail)
        finally:
            signal.alarm(0)
        rows.append(
            {
                "opinfo": result.name,
                "status": result.status,
                "samples": result.samples,
                "backward": int(result.backward),
                "missing_ops": " ".join(result.missing_ops),
                "detail": result.detail.replace("\n", " "),
            }
        )
        print(f"{result.name:45s} {result.status:15s} {result.detail[:90]}", flush=True)
    return rows


def totals(rows: list[dict]) -> dict[str, int]:
    """Counts per status, plus ``in_scope``."""
    from fusedops.xla.opinfo import IN_SCOPE

    counts = collections.Counter(r["status"] for r in rows)
    out = dict(sorted(counts.items()))
    out["in_scope"] = sum(counts[s] for s in IN_SCOPE)
    out["total"] = len(rows)
    return out


def write(rows: list[dict], samples: int, stem: str = "cpu-opinfo-coverage", when=None):
    """The CSV and the Markdown table under benchmarks/results/; returns the totals. ``when``:
    the run's time (default now)."""
    import jax
    import torch

    RESULTS.mkdir(exist_ok=True)
    rows = sorted(rows, key=lambda r: r["opinfo"])
    with open(RESULTS / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    t = totals(rows)
    in_scope = max(t["in_scope"], 1)
    when = (when or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# fusedops.xla OpInfo coverage ({when}; torch {torch.__version__}, jax "
        f"{jax.__version__})",
        "",
        f"op_db OpInfos: {t['total']}; up to {samples} float32 samples each, forward and "
        "backward, eager vs partial_trace(fullgraph=True) on the CPU.",
        "In scope (float32, capturable by aot_eager as one graph, deterministic, not "
        f"data-dependent): {t['in_scope']}. "
        f"Pass: {t.get('pass', 0)} ({100 * t.get('pass', 0) / in_scope:.1f}%), missing "
        f"lowering: {t.get('missing', 0)}, error: {t.get('error', 0)}, wrong numbers: "
        f"{t.get('wrong', 0)}.",
        "Out of scope: "
        + ", ".join(
            f"{k} {v}"
            for k, v in t.items()
            if k not in ("pass", "missing", "error", "wrong", "in_scope", "total")
        )
        + ".",
        "",
        "| OpInfo | status | samples | missing ops / first difference or error |",
        "|---|---|---|---|",
    ]
    for r in rows:
        note = r["missing_ops"] or r["detail"]
        lines.append(f"| {r['opinfo']} | {r['status']} | {r['samples']} | {note} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return t


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3, help="samples per OpInfo (3)")
    parser.add_argument("--only", default="", help="comma-separated OpInfo names (default all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (1)")
    parser.add_argument("--limit", type=int, default=300, help="seconds per OpInfo (300)")
    parser.add_argument("--stem", default="cpu-opinfo-coverage", help="result file names")
    parser.add_argument(
        "--from-csv", action="store_true", help="rewrite the .md from the existing .csv (no run)"
    )
    args = parser.parse_args(argv)
    if args.samples < 1 or args.jobs < 1 or args.limit < 1:
        parser.error("--samples, --jobs and --limit must be at least 1")
    if args.from_csv:
        path = RESULTS / f"{args.stem}.csv"
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
        t = write(rows, args.samples, args.stem, when=stamp)
        print(" ".join(f"{k}={v}" for k, v in t.items()))
        return 0
    from fusedops.xla import opinfo

    db = opinfo.op_db()
    wanted = set(filter(None, args.only.split(",")))
    positions = [
        i for i, info in enumerate(db) if not wanted or info.name in wanted or
        opinfo.opinfo_id(info) in wanted
    ]  # fmt: skip
    if not positions:
        parser.error(f"no OpInfo named {sorted(wanted)}")
    slices = [(positions[j :: args.jobs], args.samples, args.limit) for j in range(args.jobs)]
    if args.jobs == 1:
        rows = _check_slice(slices[0])
    else:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            rows = [r for part in pool.map(_check_slice, slices) for r in part]
    t = write(rows, args.samples, args.stem)
    print(" ".join(f"{k}={v}" for k, v in t.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

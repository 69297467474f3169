"""One PNG per op from the benchmark CSVs: % of the device's copy bandwidth against the size,
one line per provider (fusedops cuda/triton, Liger, torch eager, torch.compile, ...).

Each CSV under ``benchmarks/results/`` holding a ``pct_copy_bw`` column is read (or the CSVs
named on the command line). The x axis is the first size column the CSV has (``N``, ``model``,
``numel``, ``hidden``, ``shape``); the panels are one per direction (rows) and per value of the
remaining descriptive columns such as dtype and M (columns), leaving out the columns that the
size decides (Adam's ``numel`` and ``tensors`` given its ``model``). CSVs are appended to by
every run: for each point the newest row is drawn, and the title gives the dates the drawn rows
were measured on.
Rows without a figure (a provider that failed: ``error``) are left out.

Run: ``python benchmarks/plot.py [CSV ...] [--out benchmarks/plots]`` (needs matplotlib, the
``bench`` extra); writes ``<out>/<gpu>_<op>.png``.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from common import number, slug

RESULTS = Path(__file__).resolve().parent / "results"
PLOTS = Path(__file__).resolve().parent / "plots"
#: Size columns, in order of preference for the x axis.
X_COLUMNS = ("N", "model", "numel", "hidden", "shape")
#: Columns that are measurements or labels, never a panel of their own.
VALUE_COLUMNS = {"date", "gpu", "op", "provider", "ms", "GB/s", "pct_copy_bw", "peak_MB"}
#: Fixed colours so a provider looks the same in every PNG.
PROVIDER_COLORS = {
    "fusedops-cuda": "tab:red",
    "fusedops-triton": "tab:orange",
    "liger": "tab:green",
    "torch-eager": "tab:blue",
    "torch-compile": "tab:purple",
}
#: Colours of the other providers, in order of first appearance.
OTHER_COLORS = ("tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan", "black")
DIRECTION_ORDER = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}


def read_rows(path: Path) -> list[dict]:
    """The rows of one results CSV that carry a % of copy bandwidth."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [row for row in rows if number(row.get("pct_copy_bw")) is not None]


def x_column(rows: list[dict]) -> str:
    """The size column of these rows (see X_COLUMNS)."""
    for name in X_COLUMNS:
        if rows and name in rows[0]:
            return name
    raise ValueError(f"rows have none of the size columns {X_COLUMNS}: {list(rows[0])}")


def series(rows: list[dict]) -> dict[str, dict[tuple, dict[str, dict[str, float]]]]:
    """{op: {panel: {provider: {x: pct_copy_bw}}}} from result rows, the newest row per point.

    A panel is a tuple of (column, value) pairs of the descriptive columns (direction, dtype,
    M, ...). Rows are taken in date order, so a later run overwrites an earlier one."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    xcol = x_column(rows)
    by_op = defaultdict(list)
    for row in rows:
        by_op[row["op"]].append(row)
    for op, op_rows in by_op.items():
        keys = [k for k in op_rows[0] if k not in VALUE_COLUMNS and k != xcol and k is not None]
        keys = [k for k in keys if not _decided_by(k, xcol, op_rows)]
        for row in sorted(op_rows, key=lambda r: r.get("date", "")):
            panel = tuple((k, row[k]) for k in keys)
            out[op][panel][row["provider"]][row[xcol]] = float(row["pct_copy_bw"])
    return out


def _decided_by(column: str, xcol: str, rows: list[dict]) -> bool:
    """Whether ``column`` takes several values, each size having one (a label of the size)."""
    seen: dict[str, set] = defaultdict(set)
    for row in rows:
        seen[row[xcol]].add(row[column])
    values = set().union(*seen.values())
    return len(values) > 1 and all(len(v) == 1 for v in seen.values())


def _panel_grid(panels: list[tuple]) -> tuple[list[str], list[tuple], dict]:
    """Directions (grid rows), the other panel keys (grid columns) and each panel's cell."""

    def direction(panel):
        return dict(panel).get("direction", "")

    def rest(panel):
        return tuple((k, v) for k, v in panel if k != "direction")

    directions = sorted({direction(p) for p in panels}, key=lambda d: DIRECTION_ORDER.get(d, 9))
    others = sorted({rest(p) for p in panels})
    cells = {p: (directions.index(direction(p)), others.index(rest(p))) for p in panels}
    return directions, others, cells


def _x_positions(values: list[str]) -> tuple[list[float], bool]:
    """Numeric sizes as numbers (drawn on a log2 axis); other labels as 0, 1, 2, ..."""
    numbers = [number(v) for v in values]
    if all(n is not None and n > 0 for n in numbers):
        return numbers, True
    return list(range(len(values))), False


def draw(op: str, panels: dict, gpu: str, dates: list[str], xcol: str, order: list[str] = ()):
    """A matplotlib Figure of one op: a panel per direction x (dtype, M, ...), a line per
    provider, % of copy bandwidth against the size. Numeric sizes are drawn in increasing order,
    others in ``order`` (the CSV's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directions, others, cells = _panel_grid(list(panels))
    fig, axes = plt.subplots(
        len(directions),
        len(others),
        figsize=(4.2 * len(others), 3.2 * len(directions)),
        squeeze=False,
        sharey=True,
    )
    extra = iter(OTHER_COLORS)
    colors = dict(PROVIDER_COLORS)
    for panel, by_provider in panels.items():
        ax = axes[cells[panel]]
        labels = _ordered({x for points in by_provider.values() for x in points}, order)
        positions, numeric = _x_positions(labels)
        where = dict(zip(labels, positions))
        for provider in sorted(by_provider):
            points = sorted(by_provider[provider].items(), key=lambda item: labels.index(item[0]))
            color = colors.setdefault(provider, next(extra, None))
            style = "-" if provider.startswith("fusedops") else "--"
            ax.plot(
                [where[x] for x, _ in points],
                [pct for _, pct in points],
                style,
                marker="o",
                markersize=3,
                color=color,
                label=provider,
            )
        if numeric:
            ax.set_xscale("log", base=2)
        ax.set_xticks(positions, labels, rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(", ".join(f"{k}={v}" for k, v in panel), fontsize=8)
        ax.set_xlabel(xcol, fontsize=8)
        ax.set_ylabel("% of copy bandwidth", fontsize=8)
    handles = {}
    for ax in axes.flat:
        for line in ax.get_lines():
            handles.setdefault(line.get_label(), line)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles))
    when = dates[0] if len(set(dates)) == 1 else f"{min(dates)} .. {max(dates)}"
    fig.suptitle(f"{op} on {gpu} (measured {when})")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


def _ordered(labels: set[str], order: list[str]) -> list[str]:
    """Sizes in increasing order where all are numbers, else in ``order`` (then by name)."""
    if all(number(x) is not None for x in labels):
        return sorted(labels, key=float)
    rank = {x: i for i, x in reversed(list(enumerate(order)))}
    return sorted(labels, key=lambda x: (rank.get(x, len(rank)), x))


def plot_csv(path: Path, out: Path) -> list[Path]:
    """Write one PNG per op of the CSV at ``path`` into ``out``; returns the paths written."""
    rows = read_rows(path)
    if not rows:
        return []
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    xcol = x_column(rows)
    written = []
    for op, panels in series(rows).items():
        drawn = [r for r in rows if r["op"] == op]
        gpu = drawn[-1].get("gpu") or path.stem
        dates = sorted({r.get("date", "")[:10] for r in drawn})
        fig = draw(op, panels, gpu, dates, xcol, [r[xcol] for r in drawn])
        target = out / f"{slug(gpu)}_{op}.png"
        fig.savefig(target, dpi=110)
        plt.close(fig)
        written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", nargs="*", type=Path, help="default: benchmarks/results/*.csv")
    parser.add_argument("--out", type=Path, default=PLOTS)
    args = parser.parse_args()
    for path in args.csvs or sorted(RESULTS.glob("*.csv")):
        for target in plot_csv(path, args.out):
            print(target)


if __name__ == "__main__":
    main()

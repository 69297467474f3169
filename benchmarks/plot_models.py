"""The plot of ``bench_models.py``'s CSV: per model, each way's training-step speed against
eager's (eager's step time over the way's: above 1 is faster), with a line at 1.

For each (model, way) the newest row is drawn; the title gives the device and the dates of the
rows drawn. Writes ``benchmarks/plots/<device>_models[_quick].png``.

Run: ``python benchmarks/plot_models.py [CSV] [--out benchmarks/plots]`` (needs matplotlib, the
``bench`` extra; default CSV: every ``benchmarks/results/*_models*.csv``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PLOTS = Path(__file__).resolve().parent / "plots"
WAY_COLORS = {
    "eager": "tab:blue",
    "compile": "tab:purple",
    "hooks": "tab:orange",
    "partial_trace": "tab:green",
    "optimize": "tab:red",
}


def newest(path: Path) -> list[dict]:
    """The newest row of each (model, way) in the CSV at ``path``, in first-seen order."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    kept: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["model"], row["way"])
        if key not in kept or row["date"] >= kept[key]["date"]:
            kept[key] = row
    return list(kept.values())


def plot(path: Path, out: Path) -> Path | None:
    """Draw the CSV at ``path`` into ``out``; returns the PNG's path (None: no rows)."""
    rows = [r for r in newest(path) if r.get("vs_eager")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    ways = [w for w in WAY_COLORS if any(r["way"] == w for r in rows)]
    width = 0.8 / max(len(ways), 1)
    fig, axis = plt.subplots(figsize=(max(6.0, 1.1 * len(models) + 2), 4.0))
    for index, way in enumerate(ways):
        speeds = {r["model"]: float(r["vs_eager"]) for r in rows if r["way"] == way}
        xs = [m + (index - (len(ways) - 1) / 2) * width for m in range(len(models))]
        axis.bar(
            [x for x, name in zip(xs, models) if name in speeds],
            [speeds[name] for name in models if name in speeds],
            width,
            label=way,
            color=WAY_COLORS[way],
        )
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks(range(len(models)), models)
    axis.set_ylabel("step speed vs eager (x)")
    device = rows[-1]["device"]
    dates = sorted({r["date"][:10] for r in rows})
    axis.set_title(f"One training step, {device} ({', '.join(dates)})")
    axis.legend(fontsize="small", ncol=len(ways))
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{path.stem}.png"
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=PLOTS)
    args = parser.parse_args()
    for path in args.csvs or sorted(RESULTS.glob("*_models*.csv")):
        target = plot(path, args.out)
        if target is not None:
            print(target)


if __name__ == "__main__":
    main()

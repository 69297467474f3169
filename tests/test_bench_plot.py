"""benchmarks/plot.py: the newest row per point, one PNG per op, a line per provider."""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import plot  # noqa: E402

FIELDS = ["date", "gpu", "op", "provider", "dtype", "M", "N", "direction", "ms", "GB/s"]
PROVIDERS = ["fusedops-cuda", "fusedops-triton", "liger", "torch-eager", "torch-compile"]
SIZES = ["512", "1024", "65536"]


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _sweep(date: str, ops=("layer_norm", "rms_norm")) -> list[dict]:
    rows = []
    for op in ops:
        for provider in PROVIDERS:
            for dtype in ("float32", "bfloat16"):
                for n in SIZES:
                    for direction in ("fwd", "bwd"):
                        row = dict(zip(FIELDS, [date, "NVIDIA H100 80GB HBM3", op, provider]))
                        row.update(dtype=dtype, M="4096", N=n, direction=direction)
                        row.update({"ms": "0.1", "GB/s": "1", "pct_copy_bw": random_pct()})
                        rows.append(row)
    return rows


def random_pct() -> str:
    return f"{random.uniform(1, 100):.1f}"


def test_newest_row_wins_and_failed_rows_are_left_out(tmp_path):
    old, new = _sweep("2026-11-22T20:00:00Z"), _sweep("2026-11-25T10:00:00Z")
    new[0]["pct_copy_bw"] = ""  # a provider that failed in the newer run
    new[1]["ms"] = new[1]["pct_copy_bw"] = "error"
    path = tmp_path / "gpu_layer_norm.csv"
    _write(path, new[5:] + old + new[:5])  # the file's order is not the date order
    got = plot.series(plot.read_rows(path))
    assert set(got) == {"layer_norm", "rms_norm"}
    for i, row in enumerate(new):
        panel = (("dtype", row["dtype"]), ("M", "4096"), ("direction", row["direction"]))
        value = got[row["op"]][panel][row["provider"]][row["N"]]
        expected = old[i] if i < 2 else row  # failed newer rows leave the older figure
        assert value == float(expected["pct_copy_bw"])


def test_columns_the_size_decides_are_not_panels():
    rows = []
    for model, numel, tensors in (("vit_b", "86567656", "152"), ("llama_1b", "1100048384", "201")):
        for dtype in ("float32", "bfloat16"):
            rows.append(
                {"date": "d", "gpu": "g", "op": "adamw_step", "provider": "fusedops-triton"}
                | {"model": model, "dtype": dtype, "tensors": tensors, "numel": numel}
                | {"pct_copy_bw": random_pct()}
            )
    got = plot.series(rows)["adamw_step"]
    assert sorted(got) == [(("dtype", "bfloat16"),), (("dtype", "float32"),)]
    assert list(got[(("dtype", "float32"),)]["fusedops-triton"]) == ["vit_b", "llama_1b"]


def test_one_png_per_op_with_a_line_per_provider(tmp_path):
    rows = _sweep("2026-11-25T10:00:00Z")
    path = tmp_path / "NVIDIA_H100_80GB_HBM3_layer_norm.csv"
    _write(path, rows)
    written = plot.plot_csv(path, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "NVIDIA_H100_80GB_HBM3_layer_norm.png",
        "NVIDIA_H100_80GB_HBM3_rms_norm.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)

    panels = plot.series(rows)["layer_norm"]
    fig = plot.draw("layer_norm", panels, "H100", ["2026-11-25"], "N")
    assert len(fig.axes) == 4  # fwd/bwd x fp32/bf16
    for ax in fig.axes:
        dtype, direction = (part.split("=")[1] for part in ax.get_title().split(", ")[::2])
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(PROVIDERS)
        for provider, line in lines.items():
            expected = [
                float(r["pct_copy_bw"])
                for r in rows
                if (r["op"], r["provider"], r["dtype"], r["direction"])
                == ("layer_norm", provider, dtype, direction)
            ]  # rows are written in increasing N
            assert list(line.get_ydata()) == expected
            assert list(line.get_xdata()) == [float(n) for n in SIZES]

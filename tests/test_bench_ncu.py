"""benchmarks/ncu_layer_norm.py's table from ncu's raw CSV (the profiling itself needs a GPU)."""

from __future__ import annotations

import csv
import io
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ncu_layer_norm as ncu  # noqa: E402

HEAD = ["ID", "Process ID", "Process Name", "Kernel Name", "Block Size", "Grid Size", "Device"]


def _raw(rows: list[list], path: Path) -> None:
    """An ``ncu --csv --page raw --log-file`` file: ncu's lines, header, units, kernels."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(HEAD + list(ncu.METRICS))
    writer.writerow([""] * len(HEAD) + ["ns", "byte", "byte", "%", "%", "%", "", "", "", "", "%"])
    writer.writerows(rows)
    path.write_text("==PROF== Connected to process 4242\n" + out.getvalue() + "==PROF== Done\n")


def test_kernels_are_joined_to_their_case_and_summed(tmp_path):
    case = ncu.case_name("triton", "layer_norm", "bwd", "float32", 4096, 1024)
    size = 4096 * 1024 * 4
    kernels = [
        ("void fusedops::_backward_rows_kernel<float, 1>(float*, int)", 3.2 * size),
        ("_column_sum_kernel", 0.1 * size),
        ("_column_sum_kernel", 0.1 * size),
    ]
    durations = [random.uniform(10_000, 20_000) for _ in kernels]
    cases_rows, kernel_rows = [], []
    for i, ((name, dram), ns) in enumerate(zip(kernels, durations)):
        metrics = [ns, 0.6 * dram, 0.4 * dram, 70.5, 40.0, 50.0, 64, 1, 132, 256, 12.5]
        cases_rows.append([str(i), "4242", "python", case, "256", "132", "0", *metrics])
        kernel_rows.append([str(i), "4242", "python", name, "256", "132", "0", *metrics])
    # a launch outside the named cases (e.g. a poisoning fill) is left out
    cases_rows.append(["3", "4242", "python", "fill_kernel", "1", "1", "0", *[1] * 11])
    kernel_rows.append(["3", "4242", "python", "fill_kernel", "1", "1", "0", *[1] * 11])
    _raw(cases_rows, tmp_path / "cases.csv")
    _raw(kernel_rows, tmp_path / "kernels.csv")

    raw_cases, raw_kernels = (ncu.read_raw(tmp_path / f) for f in ("cases.csv", "kernels.csv"))
    rows = ncu.summarize(raw_cases, raw_kernels)
    assert [r["kernel"] for r in rows] == [
        "_backward_rows_kernel",
        "_column_sum_kernel",
        "_column_sum_kernel",
        "(all 3 kernels)",
    ]
    first, total = rows[0], rows[-1]
    assert first["backend"] == "triton" and first["N"] == 1024
    assert first["dram_passes"] == pytest.approx(3.2, abs=0.01)
    assert first["registers"] == 64 and first["ideal_passes"] == 3
    assert total["dram_passes"] == pytest.approx(3.4, abs=0.01)
    assert total["duration_ns"] == pytest.approx(sum(durations))
    assert total["ideal_GB/s"] == pytest.approx(round(3 * size / sum(durations), 1))
    assert total["occupancy_pct"] is None  # not summed across kernels

    ncu.write_table(rows, tmp_path / "table.csv")
    with (tmp_path / "table.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4


def test_every_case_name_parses_back():
    for backend in ncu.BACKENDS:
        for op, direction, dtype, m, n in ncu.CASES:
            name = ncu.case_name(backend, op, direction, dtype, m, n)
            assert ncu.parse_case(name) == dict(
                backend=backend, op=op, direction=direction, dtype=dtype, M=m, N=n
            )

"""Where LayerNorm/RMSNorm kernels lose bandwidth: Nsight Compute counters per kernel.

Runs this script's ``--child`` (each case warmed up, then launched once inside the profiled
range, in an NVTX range named after the case) under ``ncu`` twice: once with kernels renamed to
their NVTX case, once with their own names, joined on ncu's launch ID. For every kernel it
writes the DRAM bytes read and written, the passes over the M x N data those bytes make (the
ideal is 2 for a forward, 3 for a backward), achieved and theoretical occupancy, registers per
thread, the L2 hit rate (a looped path's second read of a row hits L2 or not) and the duration;
then one line per case with its kernels together.

Output in ``--out`` (default benchmarks/results): ``<gpu>_ncu_layer_norm.csv`` (the table) and
the two raw ncu CSVs (``ncu_layer_norm_raw_*.csv``), from which ``--parse`` rebuilds the
table as ``ncu_layer_norm.csv``. Run on a GPU machine: ``python benchmarks/ncu_layer_norm.py``
(gpu_check.sh stage ``ncu-layer_norm``); needs ncu and access to the GPU's counters.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common import number, print_rows, slug

RESULTS = Path(__file__).resolve().parent / "results"
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "blocks_per_sm_by_registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
}
#: Ideal passes over the M x N data: forward reads x, writes y; backward reads dy, x, writes dx.
PASSES = {"fwd": 2, "bwd": 3}
#: (op, direction, dtype name, M, N) profiled on each backend.
CASES = [
    (op, direction, dtype, 4096, n)
    for op in ("layer_norm",)
    for direction in ("fwd", "bwd")
    for dtype in ("float32", "bfloat16")
    for n in (1024, 4096, 8192, 16384, 32768, 65536)
] + [
    ("rms_norm", direction, "bfloat16", 16384, n)
    for direction in ("fwd", "bwd")
    for n in (2048, 4096, 8192)
]
BACKENDS = ("triton", "cuda")


def case_name(backend: str, op: str, direction: str, dtype: str, m: int, n: int) -> str:
    """The NVTX range (and case column) of one case: ``triton layer_norm bwd float32 4096x1024``."""
    return f"{backend} {op} {direction} {dtype} {m}x{n}"


def parse_case(name: str) -> dict:
    """The fields of a case name (see case_name)."""
    backend, op, direction, dtype, shape = name.split()
    m, n = (int(v) for v in shape.split("x"))
    return {"backend": backend, "op": op, "direction": direction, "dtype": dtype, "M": m, "N": n}


def case_call(kernels, op: str, direction: str, m: int, n: int, dtype):
    """A no-argument call of one case's kernels (``kernels``: the triton or cuda module) on
    fresh random inputs; the forward's statistics for the backward are computed here."""
    import torch

    x = torch.randn(m, n, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    if op == "layer_norm":
        _, mean, rstd = kernels.layer_norm_forward(x, w, b, 1e-5)
        if direction == "fwd":
            return lambda: kernels.layer_norm_forward(x, w, b, 1e-5)
        return lambda: kernels.layer_norm_backward(dy, x, w, b, mean, rstd)
    _, rstd = kernels.rms_norm_forward(x, w, 1e-6)
    if direction == "fwd":
        return lambda: kernels.rms_norm_forward(x, w, 1e-6)
    return lambda: kernels.rms_norm_backward(dy, x, w, rstd)


def child() -> None:
    """The profiled program: every case once inside cudaProfilerStart/Stop, warmed up before."""
    import torch

    from fusedops.kernels.cuda import build
    from fusedops.kernels.cuda import layer_norm as cuda_kernels
    from fusedops.kernels.triton import layer_norm as triton_kernels

    build.ensure_built()
    modules = {"triton": triton_kernels, "cuda": cuda_kernels}
    runs = []
    for backend in BACKENDS:
        for op, direction, dtype_name, m, n in CASES:
            fn = case_call(modules[backend], op, direction, m, n, getattr(torch, dtype_name))
            fn()  # compile and warm up outside the profiled range
            runs.append((case_name(backend, op, direction, dtype_name, m, n), fn))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in runs:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()


def read_raw(path: Path) -> list[dict]:
    """The kernel rows of an ``ncu --csv --page raw`` log: the header row, then a units row,
    then a row per kernel; ncu's own ``==PROF==`` lines are skipped."""
    lines = [line for line in path.read_text().splitlines() if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    return [row for row in rows if (row.get("ID") or "").strip().isdigit()]


def summarize(cases_raw: list[dict], kernels_raw: list[dict]) -> list[dict]:
    """One row per kernel (cases_raw: kernels renamed to their NVTX case; kernels_raw: the
    same launches under their own names), then one ``(all kernels)`` row per case."""
    own_names = {row["ID"]: row["Kernel Name"] for row in kernels_raw}
    rows = []
    for raw in cases_raw:
        case = raw["Kernel Name"].strip().split("/")[-1]
        if len(case.split()) != 5:
            continue  # a launch outside the named cases
        fields = parse_case(case)
        row = {"case": case, "kernel": _short(own_names.get(raw["ID"], "?")), **fields}
        for metric, column in METRICS.items():
            row[column] = number(raw.get(metric))
        rows.append(row)
    summed = ("duration_ns", "dram_read_bytes", "dram_write_bytes")
    out = []
    for case in dict.fromkeys(row["case"] for row in rows):
        kernels = [row for row in rows if row["case"] == case]
        total = {**kernels[0], **dict.fromkeys(METRICS.values())}
        total["kernel"] = f"(all {len(kernels)} kernels)"
        for column in summed:
            values = [k[column] for k in kernels]
            total[column] = None if None in values else sum(values)
        out.extend(_with_passes(row) for row in [*kernels, total])
    return out


def _with_passes(row: dict) -> dict:
    """Adds passes over the data (DRAM bytes / (M*N*element size)) and the GB/s of the ideal
    bytes in the measured time."""
    size = row["M"] * row["N"] * (4 if row["dtype"] == "float32" else 2)
    read, write, ns = row["dram_read_bytes"], row["dram_write_bytes"], row["duration_ns"]
    row = dict(row)
    row["dram_passes"] = None if None in (read, write) else round((read + write) / size, 2)
    row["ideal_passes"] = PASSES[row["direction"]]
    row["ideal_GB/s"] = round(PASSES[row["direction"]] * size / ns, 1) if ns else None
    return row


def _short(name: str) -> str:
    """A kernel's name without its template arguments and parameter list."""
    name = re.sub(r"\(.*\)$", "", name.strip())
    depth, out = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    return "".join(out).split("::")[-1].strip() or name


def write_table(rows: list[dict], path: Path) -> None:
    """The summary rows as CSV (floats rounded)."""
    if not rows:
        raise SystemExit("no profiled kernels: see the ncu logs beside the raw CSVs")
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})


#: The columns printed at the end of a run (the CSV has them all).
PRINTED = ["case", "kernel", "grid", "block", "registers", "occupancy_pct", "dram_passes"]
PRINTED += ["ideal_passes", "l2_hit_pct", "dram_pct_of_peak", "duration_ns", "ideal_GB/s"]


def profile(out: Path) -> tuple[Path, Path]:
    """Runs ncu over ``--child`` twice (case names, kernel names); returns the raw CSV paths."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    paths = []
    for label, rename in (("cases", ["--print-nvtx-rename", "kernel"]), ("kernels", [])):
        raw = out / f"ncu_layer_norm_raw_{label}.csv"
        command = [ncu, "--target-processes", "all", "--profile-from-start", "off", "--nvtx"]
        command += [*rename, "--csv", "--page", "raw", "--print-units", "base"]
        command += ["--metrics", ",".join(METRICS), "--log-file", str(raw), "--force-overwrite"]
        command += [sys.executable, __file__, "--child"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, env=os.environ)
        paths.append(raw)
    return paths[0], paths[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="the profiled program (under ncu)")
    parser.add_argument("--parse", action="store_true", help="rebuild the table from raw CSVs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.parse:
        raw_cases = args.out / "ncu_layer_norm_raw_cases.csv"
        raw_kernels = args.out / "ncu_layer_norm_raw_kernels.csv"
    else:
        import torch

        if not torch.cuda.is_available():
            print("ncu_layer_norm: no CUDA device here; runs on a GPU machine (skipped)")
            return
        raw_cases, raw_kernels = profile(args.out)
    rows = summarize(read_raw(raw_cases), read_raw(raw_kernels))
    prefix = "" if args.parse else slug(torch.cuda.get_device_name()) + "_"
    table = args.out / f"{prefix}ncu_layer_norm.csv"
    write_table(rows, table)
    print_rows([{k: row[k] for k in PRINTED} for row in rows])
    print(f"written: {table}")


if __name__ == "__main__":
    main()

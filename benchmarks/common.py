"""Shared benchmark helpers: timing, copy bandwidth, rotating inputs, CSV results.

Every GPU benchmark reports GB/s from the bytes the op must move and the fraction of this
device's measured copy bandwidth, beside torch eager and torch.compile. Results append to
``benchmarks/results/<gpu>_<benchmark>.csv``.
"""

from __future__ import annotations

import csv
import datetime
import functools
import itertools
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
L2_BYTES = 64 * 2**20  # larger than any H100/H200 L2 (50-60 MB)
#: Brief mode (``--quick``, gpu_check.sh's bench-brief stage): a few representative sizes,
#: short timing, rows in ``<gpu>_<benchmark>_quick.csv`` apart from the full runs' files.
QUICK = False


def add_quick_flag(parser) -> None:
    """Give an argparse ``parser`` the ``--quick`` flag (brief mode; see ``set_quick``)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="brief: a few representative sizes, short timing, rows in <gpu>_<name>_quick.csv",
    )


def set_quick(enabled: bool) -> bool:
    """Turn brief mode on or off (median_ms times fewer repeats, append_rows writes the
    ``_quick`` file); returns ``enabled``."""
    global QUICK
    QUICK = bool(enabled)
    return QUICK


def pick(full, quick):
    """``quick`` in brief mode, else ``full`` (e.g. the sizes of a sweep)."""
    return quick if QUICK else full


def require_cuda(name: str) -> None:
    """Exit cleanly (status 0) with a message on a machine without a CUDA device."""
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device here; this benchmark runs on a GPU machine (skipped)")
        sys.exit(0)


def slug(text: str) -> str:
    """``text`` file-name safe: runs of other characters than letters and digits as ``_``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def gpu_name() -> str:
    """The device name, file-name safe (e.g. NVIDIA_H100_80GB_HBM3)."""
    return slug(torch.cuda.get_device_name())


def number(text: str | None) -> float | None:
    """A CSV cell as a float (thousands separators dropped), None where it holds no number."""
    try:
        return float((text or "").replace(",", ""))
    except ValueError:
        return None


def median_ms(fn: Callable[[], object]) -> float:
    """Median time of ``fn`` in milliseconds (triton.testing.do_bench: warm-up, L2 flushed;
    25 ms of warm-up and 100 ms of repeats, 5 and 20 in brief mode)."""
    import triton.testing

    warmup, rep = pick((25, 100), (5, 20))
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


@functools.cache
def copy_bandwidth_gbps() -> float:
    """This device's measured copy bandwidth (GB/s, read + write bytes), from a 1 GiB copy."""
    src = torch.empty(2**28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def rotating(make_inputs: Callable[[], tuple], bytes_per_set: int) -> Callable[[], tuple]:
    """A callable returning the next of enough input sets that together exceed the L2 cache,
    so a timed call never finds its inputs cached by the previous one."""
    count = max(1, -(-2 * L2_BYTES // max(bytes_per_set, 1)))
    cycle = itertools.cycle([make_inputs() for _ in range(min(count, 64))])
    return lambda: next(cycle)


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` with static shapes and room for one graph per benchmarked shape
    (a sweep would otherwise hit Dynamo's recompile limit and silently time eager code)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 1024))
    return torch.compile(fn, dynamic=False)


def gbps(bytes_moved: int, ms: float) -> float:
    """GB/s for ``bytes_moved`` in ``ms`` milliseconds."""
    return bytes_moved / ms / 1e6


def timing_fields(ms: float, bytes_moved: int, copy_bw: float) -> dict:
    """The timing columns every result row ends with: ms, GB/s and % of copy bandwidth."""
    rate = gbps(bytes_moved, ms)
    return {"ms": f"{ms:.4f}", "GB/s": f"{rate:.0f}", "pct_copy_bw": f"{100 * rate / copy_bw:.1f}"}


def append_rows(rows: list[dict], name: str | None = None) -> Path:
    """Append result rows (dicts with the same keys) to results/<gpu>_<name>.csv, one file per
    benchmark so every file has one header (name: the calling script's, bench_ dropped;
    ``_quick`` added in brief mode)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = (name or Path(sys.argv[0]).stem.removeprefix("bench_")) + pick("", "_quick")
    path = RESULTS / f"{gpu_name()}_{name}.csv"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [{"date": stamp, "gpu": torch.cuda.get_device_name(), **row} for row in rows]
    return append_csv(path, rows)


def append_csv(path: Path, rows: list[dict]) -> Path:
    """Append ``rows`` (dicts with the same keys) to the CSV file ``path``, with a header
    first when the file is new; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return path


def print_rows(rows: list[dict]) -> None:
    """Print result rows as an aligned table."""
    if not rows:
        return
    keys = list(rows[0])
    cells = [[str(row[k]) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def cpu_median_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median wall time of ``fn`` in milliseconds on the CPU (after one warm-up call)."""
    import time

    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]

"""Run every benchmarks/bench_*.py in turn (``make bench``); each prints its table and appends
its CSV rows under benchmarks/results/. GPU benchmarks exit cleanly on a CPU machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    only = set(argv)
    failures = []
    for script in sorted(HERE.glob("bench_*.py")):
        if only and script.stem not in only and script.stem.removeprefix("bench_") not in only:
            continue
        print(f"=== {script.name}", flush=True)
        if subprocess.call([sys.executable, str(script)], cwd=HERE) != 0:
            failures.append(script.name)
    if failures:
        print(f"failed: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m fusedops info | build | demo | bench``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def info() -> int:
    """Print versions, the device, the op x backend availability table with reasons, and
    the hooks' report when hooks are enabled (``fusedops.info()``)."""
    from fusedops._info import info as print_info

    print_info()
    return 0


def build_extension() -> int:
    """Build the CUDA extension now (it is otherwise built on first use)."""
    import torch

    from fusedops.kernels.cuda import build

    if torch.version.cuda is None or not torch.cuda.is_available():
        print("fusedops build: no CUDA device or CPU-only torch; nothing to build")
        return 1
    build.ensure_built(verbose=True)
    print(f"fusedops CUDA extension built in {build.cache_dir()}")
    return 0


def bench(args: list[str]) -> int:
    """Run every benchmark (benchmarks/run_all.py of the source tree)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"
    if not script.exists():
        print("fusedops bench: benchmarks/ is part of the source tree, not the installed package")
        return 1
    return subprocess.call([sys.executable, str(script), *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusedops")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device, op x backend availability and GPU verification")
    sub.add_parser("build", help="build the CUDA extension ahead of time")
    demo_parser = sub.add_parser("demo", help="train a small ViT with and without fusedops")
    from fusedops import demo

    demo.add_arguments(demo_parser)
    bench_parser = sub.add_parser("bench", help="run the benchmarks")
    bench_parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "build":
        return build_extension()
    if args.command == "demo":
        return demo.main(args)
    return bench(args.rest)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m fusedops info | build | demo | bench``."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _verified_cell(name: str, backend: str) -> str:
    from fusedops import dispatch

    entry = dispatch.verified_entry(name, backend)
    if entry is None:
        return "unverified"
    return f"verified ({entry['gpu']}, {entry['date']})"


def info() -> int:
    """Print versions, the device, the op x backend availability table with reasons, and
    the hooks' report when hooks are enabled."""
    import torch

    from fusedops import __version__, dispatch, ops
    from fusedops.kernels.cuda import build

    ops.load_all()
    has_cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if has_cuda else "CPU only (no CUDA device)"
    print(f"fusedops {__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"triton {_version('triton')}, jax {_version('jax')}, jaxlib {_version('jaxlib')}")
    print(f"CUDA toolkit of torch: {torch.version.cuda or 'none (CPU build)'}")
    print(f"device: {device}")
    print(f"TRITON_INTERPRET={'1' if dispatch.triton_interpreter() else '0'}")
    cuda_state = build.known_state() or ("loaded" if build.is_loaded() else "built on first use")
    print(f"CUDA extension: {cuda_state}")
    print()
    rows = []
    for name, row in dispatch.availability().items():
        cells = dict(row)
        if not has_cuda:
            if cells["cuda"] == "available":
                cells["cuda"] = "no CUDA device"
            if cells["triton"] == "available" and not dispatch.triton_interpreter():
                cells["triton"] = "no CUDA device (TRITON_INTERPRET=1 runs it on CPU)"
        for backend in dispatch.KERNEL_BACKENDS:
            cells[backend] = f"{_verified_cell(name, backend)}; {cells[backend]}"
        rows.append((name, cells["cuda"], cells["triton"], cells["native"]))
    header = ("op", "cuda", "triton", "native")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    print()
    print(
        "verified: passed the GPU suite at its current sources (fusedops/kernels/verified.json);"
        " on CUDA tensors the automatic pick takes only verified kernels, else PyTorch's native"
        " op (FUSEDOPS_UNVERIFIED=1 allows unverified ones; backend=... forces any)."
    )
    from fusedops import hooks

    if hooks.enabled():
        print()
        print("hooks (what each patched; what waits for an import):")
        print(hooks.report())
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

"""Shared memory, registers and spills of the Triton window-attention kernels, compiled for an
H100 (sm_90) on any machine, no GPU needed (fusedops/kernels/triton/_static.py).

Every distinct launch the dispatch can make (windows of 1..256 tokens, head dims 16/32/64/128,
fp32/fp16/bf16; forward, backward and the backward's dq kernel) is compiled once; the table
(``results/triton_static_window_attention_sm90.json``) records the Triton version, a hash of the
kernels' source and per launch its bytes of shared memory, registers and spill bytes.
tests/test_window_attention_static.py checks every launch against it (each within
``SHARED_LIMIT``) and recompiles a sample. Compiling them all takes minutes (fp32 products
unroll into long FMA code): run it after changing the kernels or their block choices,
``python benchmarks/triton_static.py --write``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedops.kernels.triton import _static  # noqa: E402
from fusedops.kernels.triton import window_attention as kernels  # noqa: E402
from fusedops.ops.window_attention import HEAD_DIMS, MAX_TOKENS  # noqa: E402

TABLE = ROOT / "benchmarks" / "results" / "triton_static_window_attention_sm90.json"
#: Shared memory a launch may take: under an H100 block's 232,448 B with a margin for the
#: GPU machine's older Triton (3.6), which may lay out its buffers differently.
SHARED_LIMIT = 220 * 1024
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALARS = {"scale": "fp32"}


def launches() -> list[tuple]:
    """Every distinct launch of the window-attention kernels the dispatch can make."""
    return kernels.static_launches(range(1, MAX_TOKENS + 1), HEAD_DIMS, DTYPES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE.name}")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability")
    args = parser.parse_args()
    todo = launches()
    print(f"{len(todo)} launches, Triton {_static.triton.__version__}, sm_{args.arch}", flush=True)

    def progress(key, info):
        flag = "  OVER THE LIMIT" if info.shared > SHARED_LIMIT else ""
        print(
            f"{info.shared:7d} B shared {info.registers:4d} registers "
            f"{info.spill_stores:5d} B spilled  {key}{flag}",
            flush=True,
        )

    table = _static.table(kernels, todo, args.arch, SCALARS, progress=progress)
    over = [key for key, row in table["launches"].items() if row["shared"] > SHARED_LIMIT]
    if args.write:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {TABLE}")
    if over:
        sys.exit(f"{len(over)} launches over {SHARED_LIMIT} B of shared memory")


if __name__ == "__main__":
    main()

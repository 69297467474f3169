"""Write the verified-dispatch table (fusedops/kernels/verified.json) from a GPU run's junit.

    python benchmarks/record_verified.py --gpu "NVIDIA H100 80GB HBM3" --commit SHA \\
        --junit OUT/junit-suite.xml [--junit OUT/junit-big.xml ...] --out OUT/verified.json

Run by ``gpu_check.sh``'s suite stage on the GPU machine, from the tree that was tested (the
source hashes are taken there). A kernel (op, backend) is recorded as verified when:

- the op's test files (``OP_TEST_FILES``) ran in the junit results with no failure and no error
  in any of their cases (a crash that kills a worker shows up as an error), and
- at least one passed case of those files carries the backend in its parameter id
  (``test_x[cuda-float32]``), and at least one passed case needed CUDA (the run was on a GPU:
  ``--gpu`` names it, and a junit without CUDA cases records nothing).

Entries for other kernels already in ``--base`` (default: the package's verified.json) are kept,
so partial runs accumulate; a kernel that failed in this run loses its entry. Prints one line
per kernel with its state.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusedops import dispatch, ops  # noqa: E402
from fusedops.kernels import verified  # noqa: E402

#: op -> the test files (stems under tests/) that check its kernels.
OP_TEST_FILES: dict[str, tuple[str, ...]] = {
    "quick_gelu": ("test_quick_gelu",),
    "layer_norm": ("test_layer_norm", "test_layer_norm_hooks"),
    "rms_norm": ("test_layer_norm", "test_rms_norm_variants"),
    "adam": ("test_adam",),
    "bias_dropout_add": ("test_bias_dropout_add",),
    "window_attention": ("test_window_attention", "test_window_attention_transformers"),
    "swin_attention_softmax": ("test_swin_softmax",),
    "window_partition_roll": ("test_window_process",),
    "window_reverse_roll": ("test_window_process",),
    "nms": ("test_nms",),  # nms, batched_nms, nms_normal
    "soft_nms": ("test_nms",),  # soft_nms, batched_soft_nms
    "deform_conv2d": ("test_deform_conv2d", "test_dcn_hooks"),
}


@dataclass
class FileResult:
    """Outcomes of one test file's cases: passed case names, and failed/errored ones."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def read_junit(paths: list[Path]) -> dict[str, FileResult]:
    """Test-file stem -> its cases' outcomes, over every junit file (skipped cases ignored)."""
    results: dict[str, FileResult] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            stem = case.get("classname", "").split(".")[-1]
            if not stem.startswith("test_"):
                # classname "tests.test_x.TestClass": the module is the last test_ component
                parts = [p for p in case.get("classname", "").split(".") if p.startswith("test_")]
                stem = parts[-1] if parts else stem
            outcome = results.setdefault(stem, FileResult())
            tags = {child.tag for child in case}
            if tags & {"failure", "error"}:
                outcome.failed.append(case.get("name", ""))
            elif "skipped" not in tags:
                outcome.passed.append(case.get("name", ""))
    return results


def _mentions(name: str, backend: str) -> bool:
    """Whether a test name's parameter id names ``backend`` as one of its '-'-separated parts."""
    params = name.partition("[")[2].rstrip("]")
    return backend in re.split(r"[-_,]", params)


def verdicts(results: dict[str, FileResult]) -> dict[tuple[str, str], str]:
    """(op, backend) -> "verified" or why not, from the junit outcomes."""
    out = {}
    ran_cuda = any(_mentions(n, "cuda") for r in results.values() for n in r.passed)
    for op, stems in OP_TEST_FILES.items():
        for backend in dispatch.KERNEL_BACKENDS:
            files = [results[s] for s in stems if s in results]
            failed = [n for f in files for n in f.failed]
            passed = [n for f in files for n in f.passed if _mentions(n, backend)]
            if len(files) < len(stems):
                out[op, backend] = (
                    "not run (" + ", ".join(s for s in stems if s not in results) + ")"
                )
            elif failed:
                out[op, backend] = f"{len(failed)} failed, e.g. {failed[0]}"
            elif not ran_cuda:
                out[op, backend] = "no CUDA case passed in this run (not a GPU run?)"
            elif not passed:
                out[op, backend] = f"no passed case names {backend}"
            else:
                out[op, backend] = "verified"
    return out


def record(
    table: dict, found: dict[tuple[str, str], str], gpu: str, commit: str, date: str, evidence: str
) -> dict:
    """``table`` (op -> backend -> entry) updated with this run's verdicts."""
    registered = dispatch.registered_ops()
    for (op, backend), verdict in found.items():
        module = {"triton": registered[op].triton_module, "cuda": registered[op].cuda_module}[
            backend
        ]
        if module is None:
            continue
        if verdict == "verified":
            table.setdefault(op, {})[backend] = {
                "sources": verified.sources_hash(backend, module),
                "gpu": gpu,
                "date": date,
                "commit": commit,
                "evidence": evidence,
            }
        elif not verdict.startswith("not run"):
            table.get(op, {}).pop(backend, None)
    return {op: backends for op, backends in sorted(table.items()) if backends}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", action="append", type=Path, required=True)
    parser.add_argument("--gpu", required=True, help="the GPU's name (nvidia-smi)")
    parser.add_argument("--commit", required=True, help="the commit of the tested tree")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--evidence", default="gpu_check.sh suite stage (junit)")
    parser.add_argument("--base", type=Path, default=verified.VERIFIED_FILE)
    parser.add_argument("--out", type=Path, default=verified.VERIFIED_FILE)
    args = parser.parse_args(argv)
    ops.load_all()
    base = json.loads(args.base.read_text()) if args.base.exists() else {}
    found = verdicts(read_junit(args.junit))
    for (op, backend), verdict in sorted(found.items()):
        print(f"{op:24s} {backend:7s} {verdict}")
    table = record(base.get("kernels", {}), found, args.gpu, args.commit, args.date, args.evidence)
    document = {"format": 1, "kernels": table}
    args.out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

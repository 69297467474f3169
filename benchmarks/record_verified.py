"""Write the verified-dispatch table (fusedops/kernels/verified.json) from a GPU run's junit.

    python benchmarks/record_verified.py --gpu "NVIDIA H100 80GB HBM3" --commit SHA \\
        --collected OUT/ops.txt --junit OUT/ops.xml [--collected ... --junit ...] --out OUT/v.json

Run by ``gpu_check.sh``'s suite stages on the GPU machine, from the tree that was tested (the
source hashes are taken there). ``--collected`` names a file of the node ids pytest collected
for one part of the run (``pytest --collect-only -q`` over the part's paths and markers, on
that machine: which cases exist depends on the GPU); nothing is recorded without one. A kernel
(op, backend) is recorded as verified when:

- every collected case of the op's test files (``OP_TEST_FILES``) is in the junit results,
  passed or skipped: a file cut by a time limit is "incomplete: k of n cases ran", a file with
  no collected case "not run";
- none of those files' cases failed or errored (a crash that kills a worker, and a file that
  could not be collected, show up as errors), and
- at least one passed case of those files carries the backend in its parameter id
  (``test_x[cuda-float32]``), and at least one passed case needed CUDA (the run was on a GPU:
  ``--gpu`` names it, and a junit without CUDA cases records nothing).

Entries already in ``--base`` (default: the package's verified.json) are kept for kernels this
run did not settle (files not run, or run in part without a failure), so partial runs
accumulate; a kernel that failed in this run loses its entry. Prints one line per kernel with
its state. A run that collected none of the op test files (the rest of the suite) writes
nothing.
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

from fusedops import _layout, dispatch, ops  # noqa: E402
from fusedops.kernels import verified  # noqa: E402

TESTS = REPO / "tests"

#: Test files named like an op's (``test_<op>_*.py``) that do not verify its kernels on a GPU
#: (CPU-only checks: processes on gloo, a compile-only sweep, the hooks on stand-in libraries);
#: ``gpu_check.sh suite-rest`` runs them.
NOT_KERNEL_TESTS = frozenset(
    {"test_adam_distributed", "test_nms_hooks", "test_window_attention_static"}
)
#: Test files of an op that its names do not give (``op_test_files``' convention).
EXTRA_TEST_FILES: dict[str, tuple[str, ...]] = {"deform_conv2d": ("test_dcn_hooks",)}


def op_test_files(
    registered: list[_layout.Registration], tests: Path = TESTS
) -> dict[str, tuple[str, ...]]:
    """op -> the test files (stems under ``tests``) that check its kernels, by the convention:
    for an op registered with ``kernels="K"`` (K: the op's name where none), ``test_K.py``,
    ``test_<op>.py`` and the ``test_<op>_*.py`` (sorted) that exist, less ``NOT_KERNEL_TESTS``,
    then the op's ``EXTRA_TEST_FILES``. Ops in ``registered``'s order."""
    table = {}
    for registration in registered:
        op, kernels = registration.op, registration.kernels or registration.op
        named = [f"test_{kernels}", f"test_{op}"]
        stems = [stem for stem in named if (tests / f"{stem}.py").exists()]
        stems += sorted(path.stem for path in tests.glob(f"test_{op}_*.py"))
        stems = [stem for stem in stems if stem not in NOT_KERNEL_TESTS]
        table[op] = tuple(dict.fromkeys([*stems, *EXTRA_TEST_FILES.get(op, ())]))
    return table


#: op -> the test files (stems under tests/) that check its kernels (``op_test_files``), for
#: every op the op modules register (read from their sources: ``fusedops._layout``), in
#: ``ops.OP_MODULES`` order (module names sorted) and each module's order of registration.
OP_TEST_FILES: dict[str, tuple[str, ...]] = op_test_files(_layout.registrations())

#: A line of ``pytest --collect-only -q`` that is a node id: ``tests/test_x.py::test_f[p]``.
_NODE_ID = re.compile(r"^(\S+\.py)::(.+?)\s*$")

#: pytest's last line of a whole collection: "12 tests collected in 1.0s", "3/9 tests collected
#: (6 deselected) in 1.0s", "2 tests collected, 1 error in 1.0s", "no tests collected in 1.0s".
_COLLECTED_SUMMARY = re.compile(r"(\d+(/\d+)? tests? collected|no tests collected)\b.* in [\d.]+s")
#: The summary's line for a file that failed to collect: "ERROR tests/test_x.py - ImportError".
_COLLECT_ERROR = re.compile(r"^ERROR (\S+\.py)\b")

#: A junit case's address: (classname, name), as pytest's junitxml writes them.
Address = tuple[str, str]


def op_test_paths() -> list[str]:
    """Every file of ``OP_TEST_FILES`` once, as ``tests/<stem>.py``, in the table's order (its
    ops in ``ops.OP_MODULES`` order, then registration order; an op's files as
    ``op_test_files`` lists them; a file at its first mention): the op part of the suite
    (``gpu_check.sh suite-ops``; ``suite-rest`` runs the other files)."""
    stems = dict.fromkeys(stem for stems in OP_TEST_FILES.values() for stem in stems)
    return [f"tests/{stem}.py" for stem in stems]


def _module(path: str) -> str:
    """A test file's dotted module: ``tests/a/test_x.py`` -> ``tests.a.test_x``."""
    return re.sub(r"\.py$", "", path.replace("/", "."))


def _address(path: str, rest: str) -> Address:
    """The junit address of node id ``path::rest`` (pytest's ``mangle_test_address``):
    ``tests/test_x.py::TestC::f[a::b]`` -> (``tests.test_x.TestC``, ``f[a::b]``)."""
    names, bracket, params = rest.partition("[")
    parts = [_module(path), *names.split("::")]
    return ".".join(parts[:-1]), parts[-1] + bracket + params


def _module_of(classname: str, name: str) -> str:
    """The dotted test module of a junit case that the collection does not hold: the classname
    up to its last ``test_`` part (``tests.xla.test_x.TestC`` -> ``tests.xla.test_x``). A file
    that failed to import has an empty classname and its module as the name."""
    if not classname:
        return name
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return ".".join(parts[: modules[-1] + 1]) if modules else classname


@dataclass
class Collection:
    """What pytest collected for the parts of a run: every case's junit address -> its dotted
    module, and the modules that failed to collect (import errors)."""

    cases: dict[Address, str] = field(default_factory=dict)
    errors: set[str] = field(default_factory=set)


class IncompleteCollection(ValueError):
    """A collection file without pytest's closing summary line: the listing was cut short (or
    never written), so which cases a file has is unknown."""


def read_collected(paths: list[Path]) -> Collection:
    """The cases of the collection files (the output of ``pytest --collect-only -q``: node id
    lines, ``ERROR tests/x.py`` lines for files that failed to collect, and the summary line
    "N tests collected ..." that pytest prints once the listing is whole; other lines are
    ignored). Raises ``IncompleteCollection`` for a file that is missing or has no summary."""
    collection = Collection()
    for path in paths:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as error:
            raise IncompleteCollection(f"collection {path} unreadable ({error})") from error
        if not any(_COLLECTED_SUMMARY.search(line) for line in lines):
            raise IncompleteCollection(f"collection {path} has no summary line (cut short?)")
        for line in lines:
            match = _NODE_ID.match(line)
            if match:
                collection.cases[_address(match[1], match[2])] = _module(match[1])
            elif match := _COLLECT_ERROR.match(line):
                collection.errors.add(_module(match[1]))
    return collection


def read_junit(paths: list[Path]) -> dict[Address, str]:
    """Every junit case's address -> "passed", "skipped" or "failed" (a failure or an error;
    a case in several files keeps its worst outcome). A file that is missing or cut short (a
    part killed before pytest wrote it) adds nothing: its cases count as not run."""
    outcomes: dict[Address, str] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for path in paths:
        if not path.exists():
            print(f"no junit {path} (its part skipped or killed): its cases count as not run")
            continue
        try:
            cases = list(ET.parse(path).getroot().iter("testcase"))
        except ET.ParseError as error:
            print(f"junit {path} unreadable ({error}): its cases count as not run")
            continue
        for case in cases:
            tags = {child.tag for child in case}
            outcome = "failed" if tags & {"failure", "error"} else "passed"
            if outcome == "passed" and "skipped" in tags:
                outcome = "skipped"
            address = (case.get("classname") or "", case.get("name") or "")
            if rank[outcome] >= rank[outcomes.get(address, "passed")]:
                outcomes[address] = outcome
    return outcomes


@dataclass
class FileResult:
    """One test module's cases in this run: how many were collected and how many of those ran
    (passed or skipped); the names of passed cases and of failed/errored ones."""

    collected: int = 0
    ran: int = 0
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def file_results(collection: Collection, outcomes: dict[Address, str]) -> dict[str, FileResult]:
    """Dotted test module -> its cases' outcomes: the collection says which cases the module
    has (a module that failed to collect counts as failed), the junit which of them ran and how."""
    results: dict[str, FileResult] = {}
    for address, module in collection.cases.items():
        result = results.setdefault(module, FileResult())
        result.collected += 1
        result.ran += address in outcomes
    for module in sorted(collection.errors):
        results.setdefault(module, FileResult()).failed.append("(collection error)")
    for (classname, name), outcome in outcomes.items():
        module = collection.cases.get((classname, name)) or _module_of(classname, name)
        result = results.setdefault(module, FileResult())
        if outcome == "failed":
            result.failed.append(name)
        elif outcome == "passed":
            result.passed.append(name)
    return results


def _mentions(name: str, backend: str) -> bool:
    """Whether a test name's parameter id names ``backend`` as one of its '-'-separated parts."""
    params = name.partition("[")[2].rstrip("]")
    return backend in re.split(r"[-_,]", params)


def verdicts(results: dict[str, FileResult]) -> dict[tuple[str, str], str]:
    """(op, backend) -> "verified" or why not, from the per-module outcomes (``file_results``);
    "not run ..." and "incomplete ..." leave an earlier entry as it is."""
    out = {}
    ran_cuda = any(_mentions(n, "cuda") for r in results.values() for n in r.passed)
    for op, stems in OP_TEST_FILES.items():
        files = {stem: results.get(f"tests.{stem}", FileResult()) for stem in stems}
        failed = [n for f in files.values() for n in f.failed]
        missing = [stem for stem, f in files.items() if f.collected == 0]
        partial = [
            f"{stem} {f.ran} of {f.collected}" for stem, f in files.items() if f.ran < f.collected
        ]
        for backend in dispatch.kernel_backend_names():
            passed = [n for f in files.values() for n in f.passed if _mentions(n, backend)]
            if failed:
                out[op, backend] = f"{len(failed)} failed, e.g. {failed[0]}"
            elif missing:
                out[op, backend] = f"not run ({', '.join(missing)})"
            elif partial:
                out[op, backend] = f"incomplete: {', '.join(partial)} cases ran"
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
    """``table`` (op -> backend -> entry) updated with this run's verdicts: a verified kernel
    gets a new entry, a failed one (or one without a passed case) loses its entry, and one whose
    files did not run or ran only in part keeps what it had."""
    for (op, backend), verdict in found.items():
        files = dispatch.source_files(op, backend)
        if not files:
            continue
        if verdict == "verified":
            table.setdefault(op, {})[backend] = {
                "sources": verified.sources_hash(files),
                "gpu": gpu,
                "date": date,
                "commit": commit,
                "evidence": evidence,
            }
        elif not verdict.startswith(("not run", "incomplete")):
            table.get(op, {}).pop(backend, None)
    return {op: backends for op, backends in sorted(table.items()) if backends}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--collected",
        action="append",
        type=Path,
        default=[],
        help="a part's node ids (pytest --collect-only -q); repeat per part; required",
    )
    parser.add_argument(
        "--junit", action="append", type=Path, default=[], help="a part's junit XML; repeat"
    )
    parser.add_argument("--gpu", help="the GPU's name (nvidia-smi); required")
    parser.add_argument("--commit", help="the commit of the tested tree; required")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--evidence", default="gpu_check.sh suite-ops (collection + junit)")
    parser.add_argument("--base", type=Path, default=verified.VERIFIED_FILE)
    parser.add_argument("--out", type=Path, default=verified.VERIFIED_FILE)
    parser.add_argument(
        "--list-op-files",
        action="store_true",
        help="print the op test files (tests/x.py, one a line) and exit",
    )
    args = parser.parse_args(argv)
    if args.list_op_files:
        print("\n".join(op_test_paths()))
        return 0
    if not args.collected:
        parser.error("--collected is required: without a collection nothing is recorded")
    for name in ("gpu", "commit"):
        if not getattr(args, name):
            parser.error(f"--{name} is required")
    ops.load_all()
    try:
        collection = read_collected(args.collected)
    except IncompleteCollection as error:
        print(f"{error}: nothing recorded, {args.out} not written")
        return 0
    tested = set(collection.cases.values()) | collection.errors
    if not any(f"tests.{stem}" in tested for stems in OP_TEST_FILES.values() for stem in stems):
        print(
            f"no op test file was collected in this run: nothing recorded, {args.out} not written"
        )
        return 0
    base = json.loads(args.base.read_text()) if args.base.exists() else {}
    found = verdicts(file_results(collection, read_junit(args.junit)))
    for (op, backend), verdict in sorted(found.items()):
        print(f"{op:24s} {backend:7s} {verdict}")
    table = record(base.get("kernels", {}), found, args.gpu, args.commit, args.date, args.evidence)
    document = {"format": 1, "kernels": table}
    args.out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/record_verified.py: the verified-dispatch table written from a GPU run's junit and
the same run's collection (a kernel counts only where every collected case of its files ran)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedops import dispatch
from fusedops.kernels import verified

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "record_verified.py"


@pytest.fixture(scope="module")
def recorder():
    spec = importlib.util.spec_from_file_location("record_verified", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["record_verified"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("record_verified", None)


def _junit(path: Path, cases: dict[str, str]) -> Path:
    """A junit file with ``cases``: 'tests.test_x::name' -> passed/failed/error/skipped (a file
    that failed to import: classname '' and the module as the name, as pytest writes it)."""
    rows = []
    for case, outcome in cases.items():
        classname, name = case.split("::")
        body = {"passed": "", "failed": "<failure message='x'/>", "error": "<error message='x'/>"}
        body["skipped"] = "<skipped message='x'/>"
        rows.append(f'<testcase classname="{classname}" name="{name}">{body[outcome]}</testcase>')
    path.write_text(f"<testsuites><testsuite>{''.join(rows)}</testsuite></testsuites>")
    return path


def _collected(path: Path, cases) -> Path:
    """What ``pytest --collect-only -q`` prints for ``cases`` (spelt as for ``_junit``): the
    node ids, a warning line with colons, the summary."""
    ids = []
    for case in cases:
        module, name = case.split("::")
        ids.append(f"{module.replace('.', '/')}.py::{name}")
    warning = "  /usr/lib/python3/site-packages/x.py:44: SomeWarning: a::b"
    path.write_text("\n".join([*ids, "", warning, f"{len(ids)} tests collected in 1.00s", ""]))
    return path


def _record(recorder, tmp_path, *args, base=None):
    """record_verified's main on a GPU run's arguments: the table it wrote, or None."""
    out = tmp_path / "verified.json"
    out.unlink(missing_ok=True)
    fixed = ["--gpu", "H100", "--commit", "abc", "--date", "2026-11-26"]
    fixed += ["--base", str(base or tmp_path / "none.json"), "--out", str(out)]
    assert recorder.main([*args, *fixed]) == 0
    return json.loads(out.read_text())["kernels"] if out.exists() else None


def _base(tmp_path, kernels: dict[str, list[str]]) -> Path:
    """A verified.json with an (old) entry for each op's listed backends."""
    entry = {"sources": "old", "gpu": "G", "date": "d", "commit": "c", "evidence": "e"}
    table = {op: {backend: entry for backend in backends} for op, backends in kernels.items()}
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": 1, "kernels": table}))
    return path


def test_records_only_kernels_whose_files_passed_on_cuda(recorder, tmp_path):
    cases = {
        "tests.test_quick_gelu::test_fwd[shape0-dtype0-triton]": "passed",
        "tests.test_quick_gelu::test_fwd[shape0-dtype0-cuda]": "passed",
        "tests.test_quick_gelu::test_cpu_refusal": "skipped",
        "tests.test_adam::test_step[triton-fp32]": "passed",
        "tests.test_adam::test_step[cuda-fp32]": "error",  # a crashed worker
        "tests.test_nms::test_nms[reference-1000]": "passed",
        "tests.test_nms::test_nms[triton-1000]": "passed",
    }
    junit = _junit(tmp_path / "suite.xml", cases)
    collected = _collected(tmp_path / "suite.txt", cases)
    base = _base(tmp_path, {"adam": ["triton"]})
    table = _record(
        recorder, tmp_path, "--collected", str(collected), "--junit", str(junit), base=base
    )
    assert set(table) == {"quick_gelu", "nms", "soft_nms"}  # adam's old entry: dropped
    assert set(table["quick_gelu"]) == {"triton", "cuda"}
    assert set(table["nms"]) == {"triton"}  # no passed case named cuda
    entry = table["quick_gelu"]["triton"]
    files = dispatch.source_files("quick_gelu", "triton")
    assert entry["sources"] == verified.sources_hash(files)
    assert (entry["gpu"], entry["commit"], entry["date"]) == ("H100", "abc", "2026-11-26")


def test_a_partly_run_file_is_not_recorded_and_keeps_the_old_entry(recorder, tmp_path):
    """The H200 run of 2026-11-26: the main part was cut by its time limit and only the
    big_memory cases of test_window_process ran; the window ops must not count as verified."""
    ran = {
        "tests.test_window_process::test_big[cuda-partition]": "passed",
        "tests.test_window_process::test_big[triton-partition]": "passed",
        "tests.test_quick_gelu::test_fwd[cuda]": "passed",
        "tests.test_quick_gelu::test_fwd[triton]": "passed",
    }
    cut = [
        "tests.test_window_process::test_roll[cuda-fp32]",
        "tests.test_window_process::test_roll[triton-fp32]",
    ]
    junit = _junit(tmp_path / "ops.xml", ran)
    collected = _collected(tmp_path / "ops.txt", [*ran, *cut])
    base = _base(tmp_path, {"window_reverse_roll": ["cuda"]})
    args = ["--collected", str(collected), "--junit", str(junit)]
    table = _record(recorder, tmp_path, *args, base=base)
    assert "window_partition_roll" not in table
    # an earlier complete run's entry stays (partial runs accumulate)
    old = json.loads(base.read_text())["kernels"]
    assert table["window_reverse_roll"] == old["window_reverse_roll"]
    assert set(table["quick_gelu"]) == {"triton", "cuda"}  # complete beside it: recorded
    results = recorder.file_results(
        recorder.read_collected([collected]), recorder.read_junit([junit])
    )
    found = recorder.verdicts(results)
    assert found["window_partition_roll", "cuda"] == (
        "incomplete: test_window_process 2 of 4 cases ran"
    )
    # the rest of the file ran in a later part of the same run (its own collection and junit)
    rest = _junit(tmp_path / "rest.xml", dict.fromkeys(cut, "passed"))
    both = [*args, "--junit", str(rest)]
    assert set(_record(recorder, tmp_path, *both)["window_partition_roll"]) == {"cuda", "triton"}


def test_a_part_killed_before_its_junit_leaves_its_files_incomplete(recorder, tmp_path):
    cases = ["tests.test_quick_gelu::test_fwd[cuda]", "tests.test_quick_gelu::test_fwd[triton]"]
    collected = _collected(tmp_path / "ops.txt", cases)
    truncated = tmp_path / "ops.xml"
    truncated.write_text('<testsuites><testsuite><testcase classname="tests.test_quick_gelu"')
    for junit in (truncated, tmp_path / "missing.xml"):
        args = ["--collected", str(collected), "--junit", str(junit)]
        assert _record(recorder, tmp_path, *args) == {}


def test_a_file_that_failed_to_import_drops_its_kernels(recorder, tmp_path):
    """Named as an error by the junit (classname '', the module as the name), or by the
    collection's summary ("ERROR tests/test_nms.py - ImportError ...")."""
    ran = {"tests.test_nms::test_nms[cuda-1000]": "passed"}
    base = _base(tmp_path, {"nms": ["cuda"], "quick_gelu": ["triton"]})
    collected = _collected(tmp_path / "ops.txt", ran)
    junit = _junit(tmp_path / "ops.xml", {**ran, "::tests.test_nms": "error"})
    args = ["--collected", str(collected), "--junit", str(junit)]
    assert set(_record(recorder, tmp_path, *args, base=base)) == {"quick_gelu"}
    listing = collected.read_text().replace("\n\n", "\nERROR tests/test_nms.py - ImportError\n\n")
    collected.write_text(listing)
    junit = _junit(tmp_path / "ops.xml", ran)
    assert set(_record(recorder, tmp_path, *args, base=base)) == {"quick_gelu"}


def test_a_collection_cut_short_records_nothing(recorder, tmp_path, capsys):
    """Without pytest's summary line the listing may lack cases (or a whole part's files):
    nothing is recorded from such a run."""
    cases = {"tests.test_quick_gelu::test_fwd[cuda]": "passed"}
    junit = _junit(tmp_path / "ops.xml", cases)
    whole = _collected(tmp_path / "ops.txt", cases)
    cut = tmp_path / "big.txt"
    cut.write_text(whole.read_text().split("\n\n")[0] + "\n")  # node ids only
    for listing in (cut, tmp_path / "missing.txt"):
        args = ["--collected", str(whole), "--collected", str(listing), "--junit", str(junit)]
        assert _record(recorder, tmp_path, *args) is None
        assert "nothing recorded" in capsys.readouterr().out
    args = ["--collected", str(whole), "--junit", str(junit)]
    assert set(_record(recorder, tmp_path, *args)) == {"quick_gelu"}


def test_xla_files_of_the_same_name_are_not_the_ops_files(recorder, tmp_path):
    """tests/xla/test_bias_dropout_add.py (the lowering) does not verify the kernels."""
    cases = {
        "tests.xla.test_bias_dropout_add::test_lowering[cuda]": "passed",
        "tests.xla.test_bias_dropout_add::test_lowering[triton]": "passed",
        "tests.test_quick_gelu::test_fwd[cuda]": "passed",
    }
    junit = _junit(tmp_path / "ops.xml", cases)
    collected = _collected(tmp_path / "ops.txt", cases)
    args = ["--collected", str(collected), "--junit", str(junit)]
    assert set(_record(recorder, tmp_path, *args)) == {"quick_gelu"}


def test_nothing_is_recorded_without_a_collection(recorder, tmp_path, capsys):
    junit = _junit(tmp_path / "ops.xml", {"tests.test_quick_gelu::test_fwd[cuda]": "passed"})
    out = tmp_path / "verified.json"
    with pytest.raises(SystemExit):
        recorder.main(["--junit", str(junit), "--gpu", "x", "--commit", "c", "--out", str(out)])
    assert "--collected is required" in capsys.readouterr().err
    assert not out.exists()


def test_a_run_of_no_op_file_writes_nothing(recorder, tmp_path, capsys):
    """suite-rest (tests/xla, hooks, runtime tools): its verified.json would be the package's
    table, which copied back over suite-ops' table would lose what that call verified."""
    cases = {"tests.test_hooks::test_x[cuda]": "passed"}
    junit = _junit(tmp_path / "rest.xml", cases)
    collected = _collected(tmp_path / "rest.txt", cases)
    args = ["--collected", str(collected), "--junit", str(junit)]
    assert _record(recorder, tmp_path, *args) is None
    assert "nothing recorded" in capsys.readouterr().out


def test_a_run_without_cuda_cases_records_nothing(recorder, tmp_path):
    cases = {"tests.test_quick_gelu::test_fwd[shape0-dtype0-triton]": "passed"}
    junit = _junit(tmp_path / "cpu.xml", cases)
    collected = _collected(tmp_path / "cpu.txt", cases)
    assert _record(recorder, tmp_path, "--collected", str(collected), "--junit", str(junit)) == {}


def test_collection_and_junit_of_a_real_pytest_run_match(recorder, tmp_path):
    """The node ids of ``pytest --collect-only -q`` and the junit of the same run name the same
    cases (classes, parameter ids with '::', '[' and spaces, a skipped case); a deselected case
    is not collected; a file that fails to import is a collection error in both."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_demo.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.parametrize('p', ['a::b', 'c[d]', 'e f', 1.5])\n"
        "def test_f(p):\n    pass\n\n\n"
        "@pytest.mark.slow\n"
        "def test_deselected():\n    pass\n\n\n"
        "class TestC:\n"
        "    class TestInner:\n"
        "        def test_g(self):\n            pytest.skip('x')\n"
    )
    (tests / "test_broken.py").write_text("import a_module_that_is_not_there\n")
    run = [sys.executable, "-m", "pytest", "-q", "-rE", "-p", "no:cacheprovider", "-p", "no:xdist"]
    run += ["--rootdir", str(tmp_path), "-c", os.devnull, "-m", "not slow", "tests"]
    env = {**os.environ, "PYTEST_ADDOPTS": ""}
    listing = subprocess.run(
        [*run, "--collect-only"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    junit = tmp_path / "demo.xml"
    run += ["--continue-on-collection-errors", "--junitxml", str(junit)]
    subprocess.run(run, cwd=tmp_path, capture_output=True, env=env)
    (tmp_path / "demo.txt").write_text(listing.stdout)
    collected = recorder.read_collected([tmp_path / "demo.txt"])
    outcomes = recorder.read_junit([junit])
    assert len(collected.cases) == 5, listing.stdout
    assert collected.errors == {"tests.test_broken"}, listing.stdout
    assert set(outcomes) == {*collected.cases, ("", "tests.test_broken")}
    assert set(collected.cases.values()) == {"tests.test_demo"}
    results = recorder.file_results(collected, outcomes)
    assert results["tests.test_broken"].failed and not results["tests.test_demo"].failed
    assert results["tests.test_demo"].ran == 5 and len(results["tests.test_demo"].passed) == 4


def test_backend_must_be_a_whole_parameter(recorder):
    assert recorder._mentions("test_x[shape0-cuda]", "cuda")
    assert not recorder._mentions("test_cuda_vector_access[shape0-triton]", "cuda")
    assert not recorder._mentions("test_x[cudagraph]", "cuda")


def test_every_registered_op_has_test_files(recorder):
    from fusedops import dispatch, ops

    ops.load_all()
    assert set(recorder.OP_TEST_FILES) == set(dispatch.registered_ops())
    tests = Path(__file__).resolve().parent
    for stems in recorder.OP_TEST_FILES.values():
        assert all((tests / f"{stem}.py").exists() for stem in stems), stems
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "--list-op-files"], capture_output=True, text=True, check=True
    )
    paths = listed.stdout.split()
    assert paths == recorder.op_test_paths() and len(set(paths)) == len(paths)
    assert {Path(p).stem for p in paths} == {
        s for stems in recorder.OP_TEST_FILES.values() for s in stems
    }

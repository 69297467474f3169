"""benchmarks/record_verified.py: the verified-dispatch table written from a GPU run's junit."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

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
    """A junit file with ``cases``: 'tests.test_x::name' -> passed/failed/error/skipped."""
    rows = []
    for case, outcome in cases.items():
        classname, name = case.split("::")
        body = {"passed": "", "failed": "<failure message='x'/>", "error": "<error message='x'/>"}
        body["skipped"] = "<skipped message='x'/>"
        rows.append(f'<testcase classname="{classname}" name="{name}">{body[outcome]}</testcase>')
    path.write_text(f"<testsuites><testsuite>{''.join(rows)}</testsuite></testsuites>")
    return path


def test_records_only_kernels_whose_files_passed_on_cuda(recorder, tmp_path):
    junit = _junit(
        tmp_path / "suite.xml",
        {
            "tests.test_quick_gelu::test_fwd[shape0-dtype0-triton]": "passed",
            "tests.test_quick_gelu::test_fwd[shape0-dtype0-cuda]": "passed",
            "tests.test_quick_gelu::test_cpu_refusal": "skipped",
            "tests.test_adam::test_step[triton-fp32]": "passed",
            "tests.test_adam::test_step[cuda-fp32]": "error",  # a crashed worker
            "tests.test_nms::test_nms[reference-1000]": "passed",
            "tests.test_nms::test_nms[triton-1000]": "passed",
        },
    )
    base = tmp_path / "base.json"
    stale = {"sources": "old", "gpu": "G", "date": "d", "commit": "c", "evidence": "e"}
    base.write_text(json.dumps({"kernels": {"adam": {"triton": stale}}}))
    out = tmp_path / "verified.json"
    args = ["--junit", str(junit), "--gpu", "H100", "--commit", "abc", "--base", str(base)]
    assert recorder.main([*args, "--out", str(out), "--date", "2026-11-25"]) == 0
    table = json.loads(out.read_text())["kernels"]
    assert set(table) == {"quick_gelu", "nms", "soft_nms"}
    assert set(table["quick_gelu"]) == {"triton", "cuda"}
    assert set(table["nms"]) == {"triton"}  # no passed case named cuda
    entry = table["quick_gelu"]["triton"]
    assert entry["sources"] == verified.sources_hash("triton", "fusedops.kernels.triton.quick_gelu")
    assert (entry["gpu"], entry["commit"], entry["date"]) == ("H100", "abc", "2026-11-25")


def test_a_run_without_cuda_cases_records_nothing(recorder, tmp_path):
    junit = _junit(
        tmp_path / "cpu.xml", {"tests.test_quick_gelu::test_fwd[shape0-dtype0-triton]": "passed"}
    )
    out = tmp_path / "verified.json"
    args = ["--junit", str(junit), "--gpu", "x", "--commit", "c", "--base", str(tmp_path / "none")]
    assert recorder.main([*args, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["kernels"] == {}


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

"""benchmarks/gpu_check.sh's logic that runs without a GPU: the stage list and its time limits
(``--dry-run``), the suite / bench-brief / sanitizer stages' commands, the packing of every
output into at most 8 files under $OUT, and the benchmarks' ``--quick`` flag."""

import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
BENCHES = [
    p for p in sorted((ROOT / "benchmarks").glob("bench_*.py")) if p.stem != "bench_cpu_fallback"
]  # CPU-only: not in the GPU brief
#: What the device tool brings back: at most this many files from $OUT.
MAX_FILES = 8

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _gpu_check(*args, tmp_path, **env):
    environment = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "GPU_CHECK_SCRATCH": str(tmp_path / "scratch"),
        "PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def _stage_limits(stdout: str) -> dict:
    return {m[0]: int(m[1]) for m in re.findall(r"^=== (\S+) \(limit (\d+)s\)", stdout, re.M)}


def test_dry_run_shows_the_three_calls_within_the_budget(tmp_path):
    """Each call of the plan in the script's header: every stage known, each limit capped so
    that the stages of one call fit its budget, nothing run and nothing written."""
    header = SCRIPT.read_text()
    calls = re.findall(r"^#   call \d: export OUT; (?:WORKERS=\d+ )?bash \S+ (.+)$", header, re.M)
    assert len(calls) == 3
    for call in calls:
        done = _gpu_check("--dry-run", *call.split(), tmp_path=tmp_path, BUDGET="590")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "failed stages: none" in done.stdout
        limits = _stage_limits(done.stdout)
        assert list(limits) == [spec.split(":")[0] for spec in call.split()]
        assert all(0 < seconds <= 590 - 15 for seconds in limits.values()), limits
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_dry_run_caps_limits_by_the_budget_and_names_bad_stages(tmp_path):
    done = _gpu_check(
        "--dry-run", "build:200", "bogus", "bench-nope", "info:abc", tmp_path=tmp_path, BUDGET="100"
    )
    assert done.returncode != 0
    assert _stage_limits(done.stdout)["build"] == 100 - 15
    assert "unknown stage bogus" in done.stdout
    assert "no benchmarks/bench_nope.py" in done.stdout
    assert "bad time limit 'abc'" in done.stdout
    assert "failed stages: bogus bench-nope info" in done.stdout


def test_suite_runs_bias_dropout_add_first_in_one_worker_then_the_rest(tmp_path):
    done = _gpu_check("--dry-run", "suite:570", tmp_path=tmp_path, WORKERS="12")
    pytest_lines = [line for line in done.stdout.splitlines() if " -m pytest " in line]
    # big_memory parts where pyproject.toml registers the marker (--strict-markers refuses -m
    # with an unknown one), else the rest of the suite in one part
    registered = "big_memory:" in (ROOT / "pyproject.toml").read_text()
    assert len(pytest_lines) == 2 + registered, done.stdout
    first, main = pytest_lines[:2]
    assert "-n 1 " in first and first.endswith("tests/test_bias_dropout_add.py")
    assert "-n 12 " in main and "--ignore tests/test_bias_dropout_add.py" in main
    if registered:
        assert "not\\ big_memory" in main
        assert "-n 1 " in pytest_lines[2] and "-m big_memory" in pytest_lines[2]
    else:
        assert "big_memory" not in main and "no big_memory marker registered" in done.stdout
    junits = [re.search(r"--junitxml (\S+)", line)[1] for line in pytest_lines]
    assert len(set(junits)) == len(junits)
    assert all(j.startswith(str(tmp_path / "scratch")) for j in junits)
    assert all("faulthandler_timeout" in line for line in pytest_lines)
    limits = [int(re.search(r"timeout -s INT -k 20 (\d+)", line)[1]) for line in pytest_lines]
    assert all(seconds <= 570 for seconds in limits)
    # verified.json from the junit files when record_verified.py exists, else a warning
    if (ROOT / "benchmarks" / "record_verified.py").exists():
        record = next(line for line in done.stdout.splitlines() if "record_verified.py" in line)
        assert record.count("--junit ") == 3 and "--commit " in record
        assert f"--out {tmp_path / 'out' / 'verified.json'}" in record
    else:
        assert "record_verified.py is missing" in done.stdout


def test_bench_brief_runs_every_bench_script_quick_within_its_limit(tmp_path):
    done = _gpu_check("--dry-run", "bench-brief:590", tmp_path=tmp_path)
    runs = re.findall(
        r"timeout -s INT -k 20 (\d+) \S+ benchmarks/(bench_\w+)\.py --quick", done.stdout
    )
    assert sorted(name for _, name in runs) == [p.stem for p in BENCHES]
    assert sum(int(seconds) for seconds, _ in runs) <= 590 - 15


def test_sanitizer_runs_memcheck_on_bias_dropout_add_first(tmp_path):
    done = _gpu_check("--dry-run", "sanitizer:300", tmp_path=tmp_path)
    lines = [line for line in done.stdout.splitlines() if "compute-sanitizer" in line]
    assert len(lines) == 2 and all("--tool memcheck" in line for line in lines)
    assert lines[0].endswith("tests/test_bias_dropout_add.py")
    assert all("-p no:xdist" in line and "-k cuda" in line for line in lines)
    logs = [re.search(r"--log-file (\S+)", line)[1] for line in lines]
    assert all(log.startswith(str(tmp_path / "scratch")) for log in logs)


def test_outputs_are_packed_into_few_files(tmp_path):
    """A real (CPU) run: the scratch folder's files and the files written under
    benchmarks/results during the run go into $OUT/results.tar.gz, beside the log; files
    written before the run stay out."""
    scratch = tmp_path / "scratch" / "junit"
    scratch.mkdir(parents=True)
    (scratch / "stale.xml").write_text("<testsuites/>")  # an earlier call's: removed first
    marker = ROOT / "benchmarks" / "results" / f"test_gpu_check_{uuid.uuid4().hex}.csv"
    existing = sorted((ROOT / "benchmarks" / "results").glob("*.csv"))
    # the python the script runs: a stand-in writing what a stage would
    probe = tmp_path / "python"
    probe.write_text(
        f"#!/bin/sh\necho a,b > {marker}\n"
        'mkdir -p "$SCRATCH/junit" && echo "<testsuites/>" > "$SCRATCH/junit/part.xml"\n'
    )
    probe.chmod(0o755)
    try:
        done = _gpu_check("info:60", tmp_path=tmp_path, PYTHON=str(probe))
        assert done.returncode == 0, done.stdout + done.stderr
        out = tmp_path / "out"
        files = sorted(p.name for p in out.iterdir())
        assert files == ["gpu_check.log", "results.tar.gz"], files
        with tarfile.open(out / "results.tar.gz") as tar:
            names = set(tar.getnames())
        assert "gpu-check/junit/part.xml" in names, names
        assert "gpu-check/junit/stale.xml" not in names
        assert f"benchmarks/results/{marker.name}" in names
        assert not any(f"benchmarks/results/{p.name}" in names for p in existing)
        assert "results.tar.gz:" in (out / "gpu_check.log").read_text()
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("script", BENCHES, ids=lambda p: p.stem)
def test_every_bench_script_takes_quick(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script), run_name="__main__")
    assert stop.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_quick_mode_picks_and_writes_apart(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "gpu_name", lambda: "GPU")
    monkeypatch.setattr(common.torch.cuda, "get_device_name", lambda: "GPU")
    previous = common.QUICK
    try:
        assert common.set_quick(False) is False and common.pick([1, 2, 3], [2]) == [1, 2, 3]
        assert common.append_rows([{"a": 1}], "op").name == "GPU_op.csv"
        assert common.set_quick(True) is True and common.pick([1, 2, 3], [2]) == [2]
        assert common.append_rows([{"a": 1}], "op").name == "GPU_op_quick.csv"
    finally:
        common.set_quick(previous)

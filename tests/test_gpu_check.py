"""benchmarks/gpu_check.sh's logic that runs without a GPU: the stage list and its time limits
(``--dry-run``), the suite / test / bench-brief / sanitizer stages' commands, a suite stage run
for real with a stand-in pytest (a part cut short verifies nothing), the test stage's junit when
its limit cuts it, the live failure lines, the packing of every output into at most 8 files
under $OUT, and the benchmarks' ``--quick`` flag."""

import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
VERIFIED_FILE = ROOT / "fusedops" / "kernels" / "verified.json"  # record_verified.py's base
BENCHES = [
    p
    for p in sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if p.stem not in ("bench_cpu_fallback", "bench_models")
]  # CPU-only, and whole models (a stage of their own): not in the GPU brief
#: What the device tool brings back: at most this many files from $OUT.
MAX_FILES = 8

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


#: The script's settings from the environment: a GPU run of this file inside gpu_check.sh
#: (suite-rest, with SUITE_OPS set for its suite-ops) must not pass them on to the runs here.
KNOBS = {"BUDGET", "WORKERS", "SUITE_OPS", "PYTEST_ARGS", "BENCH_ARGS", "SCRATCH", "PY"}
KNOBS |= {"GPU_CHECK_DRY_RUN", "FUSEDOPS_COMMIT"}


#: What the script reads of the machine, the same on every machine the tests run on: the GPU
#: name (a stand-in nvidia-smi first on PATH: a GPU machine's real one names its GPU) and the
#: commit where ``git rev-parse HEAD`` has none (a checkout copied without .git).
STAND_IN_GPU = "Stand-in GPU 80GB"
STAND_IN_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _stand_in_tools(tmp_path) -> str:
    """A folder holding a stand-in ``nvidia-smi`` that prints STAND_IN_GPU (its only use in the
    script: ``--query-gpu=name``); returns the folder."""
    tools = tmp_path / "stand-in-tools"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{STAND_IN_GPU}'\n")
    smi.chmod(0o755)
    return str(tools)


def _gpu_check(*args, tmp_path, **env):
    environment = {
        **{key: value for key, value in os.environ.items() if key not in KNOBS},
        "OUT": str(tmp_path / "out"),
        "GPU_CHECK_SCRATCH": str(tmp_path / "scratch"),
        "PYTHON": sys.executable,
        "PATH": os.pathsep.join([_stand_in_tools(tmp_path), os.environ.get("PATH", "")]),
        "FUSEDOPS_COMMIT": STAND_IN_COMMIT,
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


def _planned_calls() -> list[tuple[dict, list[str]]]:
    """The device calls of the script's header: (environment, stages) each."""
    header = SCRIPT.read_text().replace("\\\n#          ", "")  # continued lines joined
    calls = []
    for line in re.findall(r"^#   call \d: export OUT; (.+)$", header, re.M):
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words[: words.index("bash")])
        assert words[words.index("bash") + 1] == "benchmarks/gpu_check.sh", line
        calls.append((env, words[words.index("bash") + 2 :]))
    return calls


def test_dry_run_shows_the_four_calls_within_the_budget(tmp_path):
    """Each call of the plan in the script's header: every stage known, each limit capped so
    that the stages of one call fit its budget, nothing run and nothing written; the suite
    stages of calls 1 and 2 run every op test file once between them."""
    calls = _planned_calls()
    assert len(calls) == 4
    suites = [[s.split(":")[0] for s in stages if s.startswith("suite")] for _, stages in calls]
    assert suites[:2] == [["suite-ops"], ["suite-ops", "suite-rest"]] and not any(suites[2:])
    selected = []
    for env, stages in calls:
        done = _gpu_check("--dry-run", *stages, tmp_path=tmp_path, BUDGET="590", **env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "failed stages: none" in done.stdout
        limits = _stage_limits(done.stdout)
        assert list(limits) == [spec.split(":")[0] for spec in stages]
        assert all(0 < seconds <= 590 - 15 for seconds in limits.values()), limits
        selected += re.findall(r"^SUITE_OPS='[^']*': (.+)$", done.stdout, re.M)
    assert len(selected) == 2
    first, second = (set(files.split()) for files in selected)
    assert first | second == set(_op_files()) and not first & second
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


def _op_files() -> list[str]:
    listed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "record_verified.py"), "--list-op-files"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def _suite_plan(stdout: str):
    """A dry run's suite parts: (collection args, run line) per part, and record_verified's
    line. A part's pytest arguments are what follows the collection's fixed options and the
    run's junit path."""
    lines = stdout.splitlines()
    collect = [
        line.split("-p no:cacheprovider ", 1)[1] for line in lines if "--collect-only" in line
    ]
    runs = [line for line in lines if " -m pytest " in line and "--collect-only" not in line]
    record = [line for line in lines if "record_verified.py --gpu" in line]
    return collect, runs, record


def _run_args(line: str) -> str:
    return re.split(r"--junitxml \S+ ", line, maxsplit=1)[1]


def test_suite_ops_runs_bias_dropout_add_first_then_the_op_files_each_part_collected(tmp_path):
    done = _gpu_check("--dry-run", "suite-ops:570", tmp_path=tmp_path, WORKERS="12")
    assert done.returncode == 0, done.stdout + done.stderr
    collect, runs, record = _suite_plan(done.stdout)
    # a big_memory part where pyproject.toml registers the marker (--strict-markers refuses -m
    # with an unknown one), else the op files in one part
    registered = "big_memory:" in (ROOT / "pyproject.toml").read_text()
    assert len(runs) == 2 + registered == len(collect), done.stdout
    first, ops = runs[0], runs[-1]  # the long part last: it gets the time that is left
    assert "-n 1 " in first and first.endswith("tests/test_bias_dropout_add.py")
    others = [f for f in _op_files() if f != "tests/test_bias_dropout_add.py"]
    assert "-n 12 " in ops and ops.endswith(" ".join(others))
    assert "tests/test_bias_dropout_add.py" not in ops and " tests " not in ops
    if registered:
        assert "not\\ big_memory" in ops
        assert "-n 1 " in runs[1] and "-m big_memory" in runs[1] and runs[1].endswith(others[-1])
    else:
        assert "big_memory" not in ops and "no big_memory marker registered" in done.stdout
    # each part collected with its own arguments, all before the first part runs
    assert collect == [_run_args(line) for line in runs]
    assert done.stdout.index("--collect-only") < done.stdout.index(runs[0])
    junits = [re.search(r"--junitxml (\S+)", line)[1] for line in runs]
    assert len(set(junits)) == len(junits)
    assert all(j.startswith(str(tmp_path / "scratch")) for j in junits)
    assert all("faulthandler_timeout" in line and "-p tests.live_failures" in line for line in runs)
    limits = [int(re.search(r"timeout -s INT -k 20 (\d+)", line)[1]) for line in runs]
    assert all(seconds <= 570 for seconds in limits)
    # verified.json from every part's collection and junit
    (line,) = record
    assert re.findall(r"--junit (\S+)", line) == junits
    collections = re.findall(r"--collected (\S+)", line)
    assert len(collections) == len(junits) and "--commit " in line
    assert all(c.startswith(str(tmp_path / "scratch" / "collected")) for c in collections)
    assert f"--out {tmp_path / 'out' / 'verified.json'}" in line


def test_suite_ops_runs_only_the_op_files_asked_for(tmp_path):
    """SUITE_OPS: glob patterns of the op files to run (the files a cut run left incomplete,
    say), "-pattern" of those to leave out; no other file runs."""

    def plan(selection):
        done = _gpu_check("--dry-run", "suite-ops:300", tmp_path=tmp_path, SUITE_OPS=selection)
        return done, _suite_plan(done.stdout)[1]

    done, runs = plan("tests/test_nms.py tests/test_window_p*")
    assert done.returncode == 0, done.stdout + done.stderr
    asked = ("tests/test_nms.py", "tests/test_window_process.py")
    in_order = " ".join(f for f in _op_files() if f in asked)  # --list-op-files' order
    assert runs and all(line.endswith(in_order) for line in runs)
    assert "bias_dropout_add" not in done.stdout.split("record_verified.py")[0]
    done, runs = plan("-tests/test_*norm* -tests/test_window_* tests/test_*a*")
    ran = {word for line in runs for word in line.split() if word.startswith("tests/")}
    everything = set(_op_files())
    left_out = {f for f in everything if "norm" in f or "window_" in f or "a" not in f[6:]}
    assert ran == everything - left_out and "tests/test_adam.py" in ran
    done, runs = plan("tests/test_hooks.py")
    assert done.returncode != 0 and not runs and "selects none of the op test files" in done.stdout


def test_suite_rest_runs_every_other_test_file(tmp_path):
    done = _gpu_check("--dry-run", "suite-rest:570", tmp_path=tmp_path, WORKERS="12")
    assert done.returncode == 0, done.stdout + done.stderr
    collect, runs, record = _suite_plan(done.stdout)
    assert "-n 12 " in runs[0] and runs[0].endswith(" tests")
    assert re.findall(r"--ignore (\S+)", runs[0]) == _op_files()
    assert collect == [_run_args(line) for line in runs]
    assert len(record) == 1 and record[0].count("--collected ") == len(runs)


def test_the_old_suite_stage_names_its_replacements(tmp_path):
    done = _gpu_check("--dry-run", "suite:570", tmp_path=tmp_path)
    assert done.returncode != 0 and "suite-ops, suite-rest" in done.stdout


def test_test_stage_writes_a_junit_and_stops_pytest_before_its_limit(tmp_path):
    done = _gpu_check(
        "--dry-run", "test:200", tmp_path=tmp_path, WORKERS="3", PYTEST_ARGS="tests/test_a.py -k x"
    )
    (line,) = [line for line in done.stdout.splitlines() if " -m pytest " in line]
    assert re.search(r"timeout -s INT -k 20 185 ", line)
    assert f"--junitxml {tmp_path / 'scratch' / 'junit' / 'test.xml'}" in line
    assert "-p tests.live_failures" in line and "-n 3 " in line
    assert line.endswith("tests/test_a.py -k x")


#: A stand-in for the machine's python in a real run of a suite stage: record_verified.py runs
#: for real; ``pytest --markers``/``--collect-only`` print what pytest would for the files given
#: (two cases per file, cuda and triton; the big_memory cases: test_window_process's); a run
#: writes the junit of its cases, except the part named in CUT_PART, which (as if its time limit
#: cut it) writes the cases of one file only: CUT_KEEP's, else its first file's.
STAND_IN = """\
    import os, sys
    args = sys.argv[1:]
    if args[0].endswith("record_verified.py"):
        os.execv(REAL, [REAL, *args])
    if "--markers" in args:
        sys.exit(print("@pytest.mark.big_memory: needs memory"))
    big = "big_memory" in args and "not big_memory" not in args
    files = [a for i, a in enumerate(args) if a.endswith(".py") and args[i - 1] != "--ignore"]
    if big:
        files = [f for f in files if f.endswith("test_window_process.py")]
    cases = [(f, "test_big" if big else "test_x", b) for f in files for b in ("cuda", "triton")]
    if "--collect-only" in args:
        for f, name, b in cases:
            print(f"{f}::{name}[{b}]")
        sys.exit(print(f"\\n{len(cases)} tests collected in 0.01s") or (0 if cases else 5))
    junit = args[args.index("--junitxml") + 1]
    if os.path.basename(junit) == os.environ.get("CUT_PART", "") + ".xml":
        cases = [c for c in cases if c[0] == os.environ.get("CUT_KEEP", files[0])]
    rows = "".join(
        f'<testcase classname="{f[:-3].replace("/", ".")}" name="{name}[{b}]"/>'
        for f, name, b in cases
    )
    with open(junit, "w") as out:
        out.write(f"<testsuites><testsuite>{rows}</testsuite></testsuites>")
"""


def test_suite_ops_run_records_only_the_files_whose_every_case_ran(tmp_path):
    """suite-ops run for real on the stand-in: the ops part is cut with only test_quick_gelu's
    cases run, so quick_gelu is verified and the kernels of every other op file stay
    out of verified.json (the window ops too, whose big_memory cases ran in full)."""
    stand_in = tmp_path / "python"
    body = textwrap.dedent(STAND_IN).replace("REAL", repr(sys.executable))
    stand_in.write_text(f"#!{sys.executable}\n{body}")
    stand_in.chmod(0o755)
    done = _gpu_check(
        "suite-ops:300",
        tmp_path=tmp_path,
        PYTHON=str(stand_in),
        CUT_PART="ops",
        CUT_KEEP="tests/test_quick_gelu.py",
        WORKERS="2",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert re.search(r"--- collected ops: \d+ cases \(exit 0\)", log), log
    assert "incomplete: test_window_process 2 of 4 cases ran" in log
    table = json.loads((tmp_path / "out" / "verified.json").read_text())["kernels"]
    # the run starts from the package's table (record_verified.py's --base): its entries of
    # kernels whose files ran in part stay as they were
    base = json.loads(VERIFIED_FILE.read_text())["kernels"]
    assert {op for op in table if table[op] != base.get(op)} == {"quick_gelu", "bias_dropout_add"}
    assert set(table) == set(base) | {"quick_gelu", "bias_dropout_add"}, table
    assert set(table["quick_gelu"]) == {"cuda", "triton"}
    assert table["quick_gelu"]["cuda"]["gpu"] == STAND_IN_GPU  # what nvidia-smi printed
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu-check/collected/ops.txt", "gpu-check/junit/ops.xml"} <= names


def test_a_test_stage_cut_by_its_limit_still_brings_back_its_junit(tmp_path):
    """The stage's pytest gets SIGINT before the stage's own limit (which would SIGTERM it,
    and pytest writes no junit then): the stand-in writes its junit on SIGINT."""
    stand_in = tmp_path / "python"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import signal, sys, time\n"
        "junit = sys.argv[sys.argv.index('--junitxml') + 1]\n"
        "def stop(*_):\n"
        "    open(junit, 'w').write('<testsuites/>')\n"
        "    sys.exit(2)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('running', flush=True)\n"
        "time.sleep(120)\n"
    )
    stand_in.chmod(0o755)
    done = _gpu_check("test:18", tmp_path=tmp_path, PYTHON=str(stand_in))
    assert done.returncode != 0
    assert re.search(r"=== test: exit 124 in \d+s", done.stdout), done.stdout  # timeout's
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        assert "gpu-check/junit/test.xml" in tar.getnames()


def test_failures_are_named_while_the_run_goes_on(tmp_path):
    """tests/live_failures.py: a failure and a setup error are in the output before the
    process dies without pytest's summary (as a run killed by its limit does)."""
    test_file = tmp_path / "test_live.py"
    test_file.write_text(
        "import os, signal, pytest\n\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('setup broke')\n\n\n"
        "def test_fails():\n    assert 1 == 2, 'one is not two'\n\n\n"
        "def test_setup(broken):\n    pass\n\n\n"
        "def test_killed():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    run += ["-p", "tests.live_failures", "-c", os.devnull, "--rootdir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_ADDOPTS": ""}
    done = subprocess.run(
        [*run, str(test_file)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "(live)" in line]
    assert len(lines) == 2, done.stdout
    assert lines[0].startswith("FAILED (live) test_live.py::test_fails - ")
    assert "test_live.py:10: AssertionError: one is not two" in lines[0]
    assert lines[1].startswith("ERROR (live) test_live.py::test_setup (at setup) - ")
    assert "RuntimeError: setup broke" in lines[1]
    assert "short test summary" not in done.stdout


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

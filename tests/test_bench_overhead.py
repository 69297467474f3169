"""benchmarks/overhead.py --cpu: every op's host code with Triton launches stubbed out."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import overhead  # noqa: E402

import fusedops  # noqa: E402
from fusedops.testing import random_tensor  # noqa: E402

DEVICE = torch.device("cpu")  # the stub replaces the Triton interpreter, a CPU-only path

# The stub works on interpreted kernels: on a GPU machine (no TRITON_INTERPRET, tests/conftest.py
# sets it only where CUDA is absent) the kernels are compiled ones and the CPU table cannot be
# made; there `benchmarks/overhead.py` measures the real launches instead.
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the launch stub needs the Triton interpreter (TRITON_INTERPRET=1, CPU-only runs)",
)


def test_stub_launches_nothing_and_is_undone():
    """Under the stub a Triton backend's output keeps the poison it was allocated with (no
    kernel wrote it); after it, the kernel runs again."""
    from fusedops import _alloc

    x = random_tensor((4, 40), torch.float32, DEVICE)
    previous = _alloc.set_poison(True)
    try:
        with overhead.stubbed_triton_launches():
            assert torch.isnan(fusedops.quick_gelu(x, backend="triton")).all()
        y = fusedops.quick_gelu(x, backend="triton")
    finally:
        _alloc.set_poison(previous)
    torch.testing.assert_close(y, x * torch.sigmoid(1.702 * x))


def test_cpu_table_has_every_op(tmp_path, monkeypatch):
    monkeypatch.setattr(overhead, "RESULTS", tmp_path / "cpu-overhead.csv")
    threads = torch.get_num_threads()
    try:
        assert overhead.cpu_main(calls=1, repeats=1) == 0
    finally:
        torch.set_num_threads(threads)
    with (tmp_path / "cpu-overhead.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    ops = {row["op"].split()[0] for row in rows}
    assert ops == {
        "layer_norm", "rms_norm", "quick_gelu", "bias_dropout_add", "adamw", "window_attention",
        "swin_attention_softmax", "window_partition_roll", "window_reverse_roll",
    }  # fmt: skip
    assert all(float(row["triton_host_us"]) > 0 for row in rows)


def test_only_keeps_those_rows_and_leaves_the_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(overhead, "RESULTS", tmp_path / "cpu-overhead.csv")
    threads = torch.get_num_threads()
    try:
        assert overhead.cpu_main(calls=1, repeats=1, only=["window_partition"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "window_partition_roll" in out and "layer_norm" not in out
    assert not (tmp_path / "cpu-overhead.csv").exists()


@pytest.mark.parametrize("clock", sorted(overhead.CLOCKS))
def test_each_block_runs_in_its_own_context(clock):
    """The native column runs outside the forced Triton backend, the Triton column inside."""
    from fusedops import dispatch

    seen: dict[str, set] = {"native": set(), "triton": set()}
    fns = [lambda column=column: seen[column].add(dispatch.requested()) for column in seen]
    times = overhead.per_call_us(fns, 2, 3, [None, overhead._triton_host_only], clock)
    assert seen == {"native": {None}, "triton": {"triton"}}
    assert all(t >= 0 for t in times)


def test_cpu_main_times_native_outside_the_triton_context(tmp_path, monkeypatch):
    """Columns torch, native, Triton host: only the last one under the forced, stubbed backend."""
    monkeypatch.setattr(overhead, "RESULTS", tmp_path / "cpu-overhead.csv")
    asked = []

    def per_call_us(fns, calls, repeats, contexts=None, clock="wall"):
        asked.append(contexts)
        return [1.0] * len(fns)

    monkeypatch.setattr(overhead, "per_call_us", per_call_us)
    assert overhead.cpu_main(calls=1, repeats=1, only=["window_reverse"]) == 0
    assert asked == [[None, None, overhead._triton_host_only]]


def test_script_measures_this_checkout(tmp_path):
    """Run as a script from elsewhere, it imports this checkout's fusedops (not an installed
    one, which main() would otherwise import first)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "benchmarks" / "overhead.py"), "--cpu"]
    command += ["--only", "window_reverse", "--calls", "1", "--repeats", "1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert f"fusedops from {root / 'fusedops'}" in done.stdout, done.stdout

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

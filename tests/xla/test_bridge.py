"""The torch <-> JAX bridge, the lazy import and the compilation cache directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusedops.testing import assert_close, non_contiguous, random_tensor

jax = pytest.importorskip("jax")

from fusedops.xla import bridge, cache  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_cached_parameter_view_is_zero_copy_and_follows_in_place_updates():
    p = torch.nn.Parameter(random_tensor((64, 32)))
    first = bridge.to_jax(p)
    assert first.unsafe_buffer_pointer() == p.data_ptr()
    assert bridge.to_jax(p) is first  # cached
    with torch.no_grad():
        p.mul_(2.0)
    again = bridge.to_jax(p)
    assert_close(torch.from_numpy(jax.device_get(again).copy()), p.detach(), dtype=torch.float32)


def test_parameter_with_new_storage_gets_a_new_view():
    p = torch.nn.Parameter(random_tensor((8, 8)))
    first = bridge.to_jax(p)
    p.data = random_tensor((8, 8))
    second = bridge.to_jax(p)
    assert second is not first
    assert_close(torch.from_numpy(jax.device_get(second).copy()), p.detach(), dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_round_trip_keeps_values_and_dtype(dtype):
    t = (
        random_tensor((5, 7), dtype)
        if dtype.is_floating_point
        else torch.randint(-9, 2**40, (5, 7))
    )
    with jax.enable_x64(True):
        back = bridge.to_torch(jax.numpy.asarray(bridge.to_jax(t)))
    assert back.dtype == t.dtype
    assert torch.equal(back, t)


def test_non_contiguous_tensor_crosses_with_its_values():
    t = non_contiguous(random_tensor((4, 6)))
    assert not t.is_contiguous()
    back = bridge.to_torch(jax.numpy.asarray(bridge.to_jax(t)))
    assert torch.equal(back, t)


def test_cache_directory_is_user_overridable(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("FUSEDOPS_XLA_CACHE_DIR", "")
    assert cache.cache_dir() is None
    monkeypatch.delenv("FUSEDOPS_XLA_CACHE_DIR")
    assert cache.cache_dir() == Path.home() / ".cache" / "fusedops" / "xla"


def test_import_fusedops_xla_does_not_import_jax():
    code = (
        "import sys, fusedops, fusedops.xla\n"
        "fusedops.xla.partial_trace, fusedops.xla.xla_trace, fusedops.xla.XLATraceError\n"
        "assert 'jax' not in sys.modules, 'fusedops.xla imported jax'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"

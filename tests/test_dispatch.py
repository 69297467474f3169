"""The dispatch rule (dispatch.py), checked with stand-in inputs where a GPU would be needed."""

from types import SimpleNamespace

import pytest
import torch

import fusedops
from fusedops import dispatch
from fusedops.kernels.cuda import build
from fusedops.testing import device_under_test

fusedops.ops.load_all()


def _cuda_input(dtype=torch.float32):
    """What dispatch reads of a tensor (device, dtype), standing in for a CUDA tensor."""
    return SimpleNamespace(device=torch.device("cuda"), dtype=dtype)


def test_cpu_tensor_goes_to_reference(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_BACKEND", raising=False)
    assert dispatch.select_name("quick_gelu", torch.ones(2)) == "reference"


def test_explicit_choice_order(monkeypatch):
    x = torch.ones(2, device=device_under_test())  # triton takes it (GPU, or the interpreter)
    monkeypatch.setenv("FUSEDOPS_BACKEND", "reference")
    with dispatch.use_backend("triton"):
        assert dispatch.select_name("quick_gelu", x) == "triton"  # context beats env
        assert dispatch.select_name("quick_gelu", x, backend="reference") == "reference"
        with dispatch.use_backend(None):
            assert dispatch.select_name("quick_gelu", x) == "reference"  # env again
    monkeypatch.setenv("FUSEDOPS_BACKEND", "triton")
    assert dispatch.select_name("quick_gelu", x) == "triton"


def test_bad_backend_names_are_named(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_BACKEND", "tpu")
    with pytest.raises(ValueError, match="FUSEDOPS_BACKEND: unknown backend 'tpu'"):
        dispatch.select_name("quick_gelu", torch.ones(2))
    with pytest.raises(ValueError, match="use_backend: unknown backend"), dispatch.use_backend("x"):
        pass


def test_forced_backend_that_cannot_run_lists_reasons(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(dispatch.BackendUnavailableError, match="'triton'.*TRITON_INTERPRET"):
        dispatch.select_name("quick_gelu", torch.ones(2), backend="triton")
    with pytest.raises(dispatch.BackendUnavailableError, match="dtype torch.float64"):
        dispatch.select_name("quick_gelu", _cuda_input(torch.float64), backend="triton")


def test_cuda_tensor_prefers_cuda_then_triton_then_reference(monkeypatch):
    monkeypatch.setattr(build, "known_state", lambda: None)
    monkeypatch.setattr(dispatch, "_cuda_missing", lambda: None)
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "cuda"
    # a failed CUDA build falls back to triton
    monkeypatch.setattr(build, "known_state", lambda: "CUDA extension build failed: boom")
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "triton"
    # no triton either: reference
    monkeypatch.setattr(dispatch, "_triton_missing", lambda: "triton is not installed")
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "reference"
    # dtypes the kernels do not take go to the reference
    monkeypatch.setattr(build, "known_state", lambda: None)
    assert dispatch.select_name("quick_gelu", _cuda_input(torch.float64)) == "reference"


def test_no_backend_error_lists_every_backend():
    refuse = lambda backend, *tensors: [f"{backend} refuses"]
    dispatch.register_op("_always_refused", reference=None, check=refuse)
    try:
        with pytest.raises(dispatch.BackendUnavailableError) as info:
            dispatch.select_name("_always_refused", _cuda_input())
        message = str(info.value)
        assert "cuda: no CUDA kernel" in message
        assert "triton: no triton kernel" in message
        assert "reference: reference refuses" in message
    finally:
        dispatch._OPS.pop("_always_refused")


def test_cuda_build_failure_logs_one_line_and_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(build, "_error", None)
    monkeypatch.setattr(build, "_loaded", False)
    monkeypatch.setattr(build.torch.version, "cuda", "12.8")

    def fail(verbose=False):
        raise RuntimeError("nvcc exploded\nsecond line")

    monkeypatch.setattr(build, "ensure_built", fail)
    with caplog.at_level("WARNING", logger="fusedops"):
        assert build.unavailable_reason() == "CUDA extension build failed: nvcc exploded"
        assert build.unavailable_reason() == "CUDA extension build failed: nvcc exploded"
    assert len(caplog.records) == 1  # logged once, remembered after


def test_availability_table_names_reasons():
    table = dispatch.availability()
    assert table["quick_gelu"]["reference"] == "available"
    if torch.version.cuda is None:
        assert table["quick_gelu"]["cuda"] == "torch is a CPU-only build"

"""The dispatch rule (dispatch.py), checked with stand-in inputs where a GPU would be needed."""

import warnings
from types import SimpleNamespace

import pytest
import torch

import fusedops
from fusedops import dispatch
from fusedops.kernels.cuda import build
from fusedops.testing import device_under_test

fusedops.ops.load_all()


CUDA = dispatch.get_backend("cuda")
TRITON = dispatch.get_backend("triton")


def _cuda_input(dtype=torch.float32):
    """What dispatch reads of a tensor (device, is_cuda, dtype), standing in for a CUDA tensor."""
    return SimpleNamespace(device=torch.device("cuda"), is_cuda=True, dtype=dtype)


def test_cpu_tensor_goes_to_native(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_BACKEND", raising=False)
    assert dispatch.select_name("quick_gelu", torch.ones(2, device="cpu")) == "native"
    assert dispatch.select_name("quick_gelu", torch.ones(2, device="cpu"), backend="native") == (
        "native"
    )


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
    # inputs a forced backend refuses are bad input: a ValueError too
    with pytest.raises(ValueError, match="dtype torch.float64"):
        dispatch.select_name("quick_gelu", _cuda_input(torch.float64), backend="triton")


def test_cuda_tensor_prefers_cuda_then_triton_then_native(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    monkeypatch.setattr(build, "known_state", lambda: None)
    monkeypatch.setattr(CUDA, "probe_build", lambda: None)
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "cuda"
    # a failed CUDA build falls back to triton
    monkeypatch.setattr(build, "known_state", lambda: "CUDA extension build failed: boom")
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "triton"
    # no triton either: PyTorch's native op
    monkeypatch.setattr(TRITON, "missing", lambda: "triton is not installed")
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "native"
    # dtypes the kernels do not take go to the native op
    monkeypatch.setattr(build, "known_state", lambda: None)
    assert dispatch.select_name("quick_gelu", _cuda_input(torch.float64)) == "native"


def test_no_backend_error_lists_every_backend():
    refuse = lambda backend, *tensors: [f"{backend} refuses"]
    dispatch.register_op("_always_refused", reference=None, unsupported_reasons=refuse)
    try:
        with pytest.raises(dispatch.BackendUnavailableError) as info:
            dispatch.select_name("_always_refused", _cuda_input())
        message = str(info.value)
        assert "cuda: no CUDA kernel" in message
        assert "triton: no triton kernel" in message
        assert "native: reference refuses" in message
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


def _verified_only(monkeypatch, *kernels):
    """Make exactly ``kernels`` ((op, backend) pairs) count as GPU-verified."""
    monkeypatch.delenv("FUSEDOPS_UNVERIFIED", raising=False)
    monkeypatch.setattr(dispatch, "gpu_verified", lambda name, backend: (name, backend) in kernels)
    monkeypatch.setattr(dispatch, "_warned_unverified", set())


def test_automatic_pick_takes_only_verified_kernels(monkeypatch):
    monkeypatch.setattr(build, "known_state", lambda: None)
    probed = []
    monkeypatch.setattr(CUDA, "probe_build", lambda: probed.append(1))  # the build probe
    _verified_only(monkeypatch, ("quick_gelu", "triton"))
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "triton"
    assert probed == []  # the unverified CUDA kernel never triggered the extension build
    _verified_only(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"fusedops.quick_gelu: the cuda and triton kernel"):
        assert dispatch.select_name("quick_gelu", _cuda_input()) == "native"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per op
        assert dispatch.select_name("quick_gelu", _cuda_input()) == "native"
    # forcing a backend still runs an unverified kernel; FUSEDOPS_UNVERIFIED opens the pick
    assert dispatch.select_name("quick_gelu", _cuda_input(), backend="cuda") == "cuda"
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    assert dispatch.select_name("quick_gelu", _cuda_input()) == "cuda"


def test_verified_entry_needs_matching_sources(monkeypatch):
    from fusedops.kernels import verified

    files = dispatch.source_files("quick_gelu", "triton")
    record = {"sources": verified.sources_hash(files), "gpu": "H100", "date": "d"}
    monkeypatch.setattr(verified, "recorded", lambda: {"quick_gelu": {"triton": record}})
    assert dispatch.gpu_verified("quick_gelu", "triton")
    assert dispatch.verified_entry("quick_gelu", "triton")["gpu"] == "H100"
    assert not dispatch.gpu_verified("quick_gelu", "cuda")
    assert not dispatch.gpu_verified("layer_norm", "triton")
    edited = {**record, "sources": "the hash of other sources"}
    monkeypatch.setattr(verified, "recorded", lambda: {"quick_gelu": {"triton": edited}})
    assert not dispatch.gpu_verified("quick_gelu", "triton")


def test_kernel_sources_cover_imports_and_cuda_shared_files():
    from fusedops.kernels import verified

    names = lambda op, backend: {
        str(p.relative_to(verified.PACKAGE_ROOT)) for p in dispatch.source_files(op, backend)
    }
    triton_nms = names("nms", "triton")
    assert {"kernels/triton/nms.py", "kernels/shared/nms_plan.py"} <= triton_nms
    assert "_alloc.py" not in triton_nms and "_env.py" not in triton_nms
    assert not any(name.startswith(("ops/", "dispatch/")) for name in triton_nms)
    shared = {f"kernels/cuda/{name}" for name in CUDA.SHARED_FILES}
    assert {"kernels/cuda/library.cpp", "kernels/cuda/bindings.h"} <= shared
    for op in ("quick_gelu", "deform_conv2d"):
        sources = names(op, "cuda")
        own = {f"kernels/cuda/{op}{suffix}" for suffix in (".cu", ".h", "_bindings.cpp")}
        assert own | shared <= sources, op
        # no other op's kernel, header or binding
        cuda_files = {name for name in sources if name.startswith("kernels/cuda/")}
        assert cuda_files - own - shared == {f"kernels/cuda/{op}.py"}, op
    assert "kernels/deform_conv2d_host.py" in names("deform_conv2d", "cuda")
    assert "kernels/device.py" in names("window_attention", "triton")
    assert dispatch.source_files("quick_gelu", "native") == ()


def test_recorded_entries_are_complete_and_current():
    """Every entry names its GPU, date, commit and evidence; the file only ever holds kernels
    that exist (an entry whose sources changed is simply unverified, not an error)."""
    from fusedops.kernels import verified

    for name, backends in verified.recorded().items():
        assert name in dispatch.registered_ops(), name
        for backend, record in backends.items():
            assert dispatch.is_kernel(backend)
            assert {"sources", "gpu", "date", "commit", "evidence"} <= set(record), (name, backend)


def _automatic_pick_cases(device):
    """(op name, call(backend) -> output, kernels it may pick) on ``device``: one small input per
    op that every kernel takes."""
    from fusedops.testing import random_tensor

    x = random_tensor((10, 1000), torch.bfloat16, device)
    weight = random_tensor((1000,), torch.bfloat16, device)
    windows = random_tensor((2, 14, 21, 96), torch.float16, device)
    attn = random_tensor((12, 3, 49, 49), torch.float32, device)
    bias = random_tensor((3, 49, 49), torch.float32, device)
    mask = torch.where(torch.rand((4, 49, 49), device=device) < 0.3, -100.0, 0.0)
    q, k, v = (random_tensor((8, 2, 49, 32), torch.bfloat16, device) for _ in range(3))
    att_bias = random_tensor((2, 49, 49), torch.bfloat16, device)
    return [
        ("quick_gelu", lambda b: fusedops.quick_gelu(x, backend=b), ("cuda",)),
        ("layer_norm", lambda b: fusedops.layer_norm(x, (1000,), weight, backend=b), ("cuda",)),
        ("rms_norm", lambda b: fusedops.rms_norm(x, (1000,), weight, backend=b), ("cuda",)),
        (
            "window_partition_roll",
            lambda b: fusedops.window_partition_roll(windows, 7, -3, backend=b),
            ("cuda",),
        ),
        (
            "swin_attention_softmax",
            lambda b: fusedops.swin_attention_softmax(attn, bias, mask, backend=b),
            ("cuda",),
        ),
        (
            "window_attention",
            lambda b: fusedops.window_attention(q, k, v, att_bias, backend=b),
            ("triton", "cuda"),
        ),
    ]


@pytest.mark.gpu
def test_kernels_are_picked_automatically_on_a_gpu(monkeypatch):
    """gpu-only: the automatic pick for real CUDA tensors (the extension built, the kernels'
    input checks on device tensors); each op's result equals its forced reference's."""
    from fusedops.testing import assert_close

    # the automatic pick takes kernels not verified on a GPU only with FUSEDOPS_UNVERIFIED=1
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    for name, call, kernels in _automatic_pick_cases(torch.device("cuda")):
        out = call(None)
        assert dispatch.last_used[name] in kernels, name
        assert_close(out, call("reference"), msg=name)


def test_automatic_pick_cases_run_on_this_device(monkeypatch):
    """The case table above on the device under test: the automatic pick (native, or a kernel
    verified on a GPU) against the forced reference, so its inputs and calls are right wherever
    a GPU is missing."""
    from fusedops.testing import assert_close

    monkeypatch.delenv("FUSEDOPS_UNVERIFIED", raising=False)
    for name, call, _ in _automatic_pick_cases(device_under_test()):
        out = call(None)
        chosen = dispatch.last_used[name]
        assert chosen == "native" or dispatch.gpu_verified(name, chosen), (name, chosen)
        assert_close(out, call("reference"), msg=name)


def test_getenv_follows_os_environ(monkeypatch):
    """dispatch.getenv (its fast read) sees every change made through os.environ, and
    os.environ.get's answer where os.environ itself has been replaced."""
    import os
    import random

    name = f"FUSEDOPS_TEST_GETENV_{random.getrandbits(32)}"
    monkeypatch.delenv(name, raising=False)
    assert dispatch.getenv(name, "unset") == "unset"
    value = f"value-{random.getrandbits(32)}-\u00e9"
    monkeypatch.setenv(name, value)
    assert dispatch.getenv(name, "unset") == value == os.environ[name]
    os.environ[name] = "direct"
    assert dispatch.getenv(name, "unset") == "direct"
    del os.environ[name]
    assert dispatch.getenv(name, "unset") == "unset"
    monkeypatch.setattr(os, "environ", {name: "replaced"})
    assert dispatch.getenv(name, "unset") == "replaced"


def test_window_attention_never_picks_the_unfused_cuda_path(monkeypatch):
    """Issue 25: the automatic pick for window attention on CUDA is the Triton kernel or the
    native op (SDPA), never the unfused CUDA path, even with every kernel allowed and the
    extension built; forcing backend="cuda" still runs it."""
    monkeypatch.delenv("FUSEDOPS_BACKEND", raising=False)
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    monkeypatch.setattr(build, "known_state", lambda: None)
    monkeypatch.setattr(CUDA, "probe_build", lambda: None)
    q = SimpleNamespace(**vars(_cuda_input()), shape=(4, 3, 49, 32))
    assert dispatch.select_name("window_attention", q, q, q, None, None) == "triton"
    monkeypatch.setattr(TRITON, "missing", lambda: "triton is not installed")
    assert dispatch.select_name("window_attention", q, q, q, None, None) == "native"
    forced = dispatch.select_name("window_attention", q, q, q, None, None, backend="cuda")
    assert forced == "cuda"

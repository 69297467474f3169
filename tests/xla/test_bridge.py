"""The torch <-> JAX bridge (CPU and CUDA), the lazy import and the compilation cache
directory. Tests on ``DEVICE`` run on CUDA where there is one (JAX then needs its CUDA plugin),
else on the CPU; tests marked ``gpu`` check what only CUDA has (zero-copy CUDA buffers, a JAX
GPU backend next to the CPU)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fusedops.testing import assert_close, device_under_test, non_contiguous, random_tensor

jax = pytest.importorskip("jax")
np = pytest.importorskip("numpy")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from fusedops.xla import XLATraceError, bridge, cache, partial_trace, program  # noqa: E402
from fusedops.xla.program import JaxProgram  # noqa: E402
from tests.xla import models  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEVICE = device_under_test()


def _on_cpu(value):
    """``value`` as a JAX array on the CPU (``jnp.asarray`` would use the default backend)."""
    return jax.device_put(value, jax.devices("cpu")[0])


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


DTYPES = [torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.float16, torch.bool]


def _example(dtype, device="cpu"):
    if dtype == torch.bool:
        return torch.rand(5, 7, device=device) > 0.5
    if dtype.is_floating_point:
        return random_tensor((5, 7), dtype).to(device)
    return torch.randint(-9, 2**40, (5, 7), device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_keeps_values_and_dtype(dtype):
    t = _example(dtype)
    with jax.enable_x64(True):
        back = bridge.to_torch(_on_cpu(bridge.to_jax(t)))
    assert back.dtype == t.dtype
    assert torch.equal(back, t)


def _program(fn, *example):
    return JaxProgram(make_fx(fn)(*example))


def _affine(x, w):
    return (x @ w + 1.0).relu(), (x * 2).sum()


def test_cpu_call_returns_cpu_tensors_computed_on_the_jax_cpu_device(monkeypatch):
    x, w = random_tensor((4, 6)), torch.nn.Parameter(random_tensor((6, 3)))
    program = _program(_affine, x, w.detach())
    seen = []
    to_torch = bridge.to_torch
    monkeypatch.setattr(
        bridge, "to_torch", lambda a, *rest: seen.append(a.devices()) or to_torch(a, *rest)
    )
    outs = program([x, w])
    cpu = jax.devices("cpu")[0]
    assert bridge.call_device([x, w]) == cpu
    assert seen and all(devices == {cpu} for devices in seen)
    assert all(o.device.type == "cpu" for o in outs)
    for got, want in zip(outs, _affine(x, w.detach())):
        assert_close(got, want, dtype=torch.float32)


def test_cpu_call_ignores_jax_default_device():
    """With two JAX CPU devices and the default set to the second, a CPU call still runs on
    ``jax.devices("cpu")[0]`` (stands in for a GPU default backend on a GPU machine)."""
    code = textwrap.dedent(
        """
        import jax, torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from fusedops.xla import bridge
        from fusedops.xla.program import JaxProgram

        cpu0, cpu1 = jax.devices("cpu")[:2]
        jax.config.update("jax_default_device", cpu1)
        f = lambda x, w: (x @ w).sin() + torch.rand_like(x @ w)
        x, w = torch.randn(4, 6), torch.nn.Parameter(torch.randn(6, 3))
        program = JaxProgram(make_fx(f)(x, w.detach()))
        seen, to_torch = [], bridge.to_torch
        bridge.to_torch = lambda a, *rest: seen.append(a.devices()) or to_torch(a, *rest)
        with jax.default_device(cpu1):
            (out,) = program([x, w])
        assert seen == [{cpu0}], seen
        assert out.device.type == "cpu" and out.shape == (4, 3)
        assert jax.numpy.zeros(2).devices() == {cpu1}  # the default is untouched
        print("ok")
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")


def test_mixed_device_inputs_raise_naming_the_devices():
    x = random_tensor((4, 6))
    program = _program(_affine, x, random_tensor((6, 3)))
    elsewhere = torch.empty(6, 3, device="meta")
    with pytest.raises(XLATraceError, match=r"different devices \(cpu, meta\)"):
        bridge.call_device([x, elsewhere])
    with pytest.raises(XLATraceError, match=r"cpu, meta"):
        program([x, elsewhere])


def test_cpu_scalars_may_join_any_call():
    assert bridge.call_device([torch.tensor(2.0), random_tensor((3,))]) == jax.devices("cpu")[0]
    assert bridge.call_device([torch.tensor(1)]) == jax.devices("cpu")[0]


def test_cuda_tensor_without_jax_gpu_backend_names_the_fix():
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has a GPU backend here")
    with pytest.raises(XLATraceError, match=r"jax\[cuda13\]"):
        bridge.jax_device(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_round_trip_is_zero_copy_and_exact(dtype):
    """gpu-only: what it checks is that a CUDA tensor crosses to JAX's GPU backend without a
    copy (the CPU's zero-copy view is checked above)."""
    t = _example(dtype, "cuda")
    with jax.enable_x64(True):
        array = bridge.to_jax(t)
        assert array.devices() == {bridge.jax_device(t.device)}
        back = bridge.to_torch(array + 0 if dtype != torch.bool else ~~array)
        assert back.device == t.device and back.dtype == t.dtype
        assert torch.equal(back, t)
        if dtype != torch.bool:
            assert array.unsafe_buffer_pointer() == t.data_ptr()
    strided = non_contiguous(random_tensor((4, 6)).cuda())
    assert torch.equal(bridge.to_torch(jax.numpy.asarray(bridge.to_jax(strided))), strided)


@pytest.mark.usefixtures("no_tf32")
def test_mlp_forward_backward_match_eager():
    """partial_trace of an MLP on DEVICE: outputs and gradients on DEVICE, eager's values."""
    torch.manual_seed(0)
    model = models.mlp().to(DEVICE)
    ref = copy.deepcopy(model)

    @partial_trace
    def backbone(model, x):
        return model(x)

    x = random_tensor((6, 8), device=DEVICE).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, want = backbone(model, x), ref(x_ref)
    assert out.device == x.device
    out.square().mean().backward()
    want.square().mean().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    got, expected = models.grads(model), models.grads(ref)
    assert got.keys() == expected.keys() and got
    for name in expected:
        assert got[name].device == x.device
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.usefixtures("no_tf32")
def test_parameter_updated_in_place_is_seen_by_the_next_call():
    """A parameter on DEVICE crosses as a zero-copy view: in-place updates queued by torch
    (on CUDA, on torch's stream) are seen by the next call, ordered before it."""
    x = random_tensor((64, 256), device=DEVICE)
    w = torch.nn.Parameter(random_tensor((256, 256), device=DEVICE))
    program = _program(_affine, x, w.detach())
    first = program([x, w])[0]
    assert_close(first, (x @ w.detach() + 1).relu(), terms=256, magnitude=x.abs() @ w.abs())
    with torch.no_grad():
        for _ in range(20):  # queue enough work on torch's stream that a race would show
            w.mul_(1.1)
    second = program([x, w])[0]
    assert_close(second, (x @ w.detach() + 1).relu(), terms=256, magnitude=x.abs() @ w.abs())
    assert bridge.to_jax(w).unsafe_buffer_pointer() == w.data_ptr()


@pytest.mark.gpu
def test_cpu_call_stays_on_the_cpu_next_to_a_jax_gpu():
    """gpu-only: it needs JAX's GPU backend beside its CPU (the CPU stand-in, two JAX CPU
    devices, is test_cpu_call_ignores_jax_default_device)."""
    x, w = random_tensor((4, 6)), torch.nn.Parameter(random_tensor((6, 3)))
    outs = _program(_affine, x, w.detach())([x, w])
    assert all(o.device.type == "cpu" for o in outs)
    assert bridge.to_jax(w).devices() == {jax.devices("cpu")[0]}


def test_non_contiguous_tensor_crosses_with_its_values():
    t = non_contiguous(random_tensor((4, 6)))
    assert not t.is_contiguous()
    back = bridge.to_torch(_on_cpu(bridge.to_jax(t)))
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


def _result(shape=(6, 5)):
    """A CPU tensor made from a program result (``to_torch`` of a JAX array), and the array."""
    array = _on_cpu(bridge.to_jax(random_tensor(shape))) * 2.0
    return bridge.to_torch(array), array


def test_an_unchanged_result_hands_its_jax_array_back():
    """A result tensor given, untouched, to a later program crosses as the JAX array it views
    (a forward's saved activations into the backward): no second import."""
    t, array = _result()
    assert bridge.to_jax(t) is array
    assert bridge.to_jax(t.detach()) is not array  # another tensor object: imported as usual


@pytest.mark.parametrize(
    "change",
    ["add_", "view_write", "t_", "resize_", "set_", "data", "data_shape", "data_stride"],
)
def test_a_changed_result_crosses_with_its_new_contents(change):
    """Written in place (itself or through a view sharing its version counter), or reshaped
    or re-pointed in place (``.data =`` moves no version counter): the result crosses anew,
    with what it holds now."""
    t, array = _result()
    if change == "add_":
        t.add_(1.0)
    elif change == "view_write":
        t[1:3].mul_(-3.0)
    elif change == "t_":
        t.t_()
    elif change == "resize_":
        t.resize_(3, 5)
    elif change == "set_":
        t.set_(random_tensor((6, 5)))
    elif change == "data":  # other memory, same shape and stride
        t.data = random_tensor((6, 5))
    elif change == "data_shape":  # the same memory and strides, fewer rows
        t.data = t.detach()[:3]
    else:  # the same memory and shape, another stride
        t.data = t.detach().as_strided((6, 5), (1, 6))
    crossed = bridge.to_jax(t)
    assert crossed is not array
    assert torch.equal(torch.from_numpy(np.array(jax.device_get(crossed))), t)


def test_a_result_is_forgotten_when_its_tensor_dies():
    before = len(bridge._results)
    t, _ = _result()
    assert len(bridge._results) == before + 1
    del t
    assert len(bridge._results) == before


def test_backward_takes_the_forward_activations_as_jax_arrays(monkeypatch):
    """partial_trace on the CPU: the activations the forward program saved reach the backward
    program as the forward's own JAX arrays; the gradients are eager's. (Results this small
    would cross packed, which hands nothing back: packing is off here.)"""
    monkeypatch.setattr(program, "PACK_MAX_ELEMENTS", 0)
    handed_back = []
    unchanged = bridge._unchanged_result
    monkeypatch.setattr(
        bridge, "_unchanged_result", lambda t: handed_back.append(unchanged(t)) or handed_back[-1]
    )
    model = models.mlp()
    ref = copy.deepcopy(model)

    @partial_trace
    def backbone(model, x):
        return model(x)

    x = random_tensor((6, 8)).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    backbone(model, x).square().mean().backward()
    ref(x_ref).square().mean().backward()
    assert any(a is not None for a in handed_back)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    got, expected = models.grads(model), models.grads(ref)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)

"""fusedops.nn.LayerNorm / RMSNorm and the layer_norm / rms_norm hooks."""

import io
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import fusedops
from fusedops import hooks
from fusedops.testing import (
    assert_close,
    backends_under_test,
    device_under_test,
    random_tensor,
    run_python,
)

REPO = Path(__file__).resolve().parent.parent
TORCH_LAYER_NORM = nn.LayerNorm
TORCH_RMS_NORM = nn.RMSNorm


pytestmark = pytest.mark.usefixtures("restore_hooks")


def _namespaces():
    import torch.nn.modules.normalization as normalization

    return (torch.nn, torch.nn.modules, normalization)


@pytest.mark.parametrize(
    ("fused", "original", "kwargs"),
    [
        (fusedops.nn.LayerNorm, TORCH_LAYER_NORM, {"bias": False}),
        (fusedops.nn.LayerNorm, TORCH_LAYER_NORM, {"elementwise_affine": False}),
        (fusedops.nn.LayerNorm, TORCH_LAYER_NORM, {"eps": 1e-3}),
        (fusedops.nn.RMSNorm, TORCH_RMS_NORM, {}),
        (fusedops.nn.RMSNorm, TORCH_RMS_NORM, {"eps": 1e-4, "elementwise_affine": False}),
    ],
)
def test_modules_match_torch(fused, original, kwargs):
    torch.manual_seed(0)
    ours = fused((3, 8), dtype=torch.float32, **kwargs)
    theirs = original((3, 8), **kwargs)
    assert isinstance(ours, original) and ours.extra_repr() == theirs.extra_repr()
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if ours.weight is not None:
        with torch.no_grad():
            ours.weight.copy_(random_tensor((3, 8)))
    theirs.load_state_dict(ours.state_dict())
    x = random_tensor((2, 3, 8))
    assert_close(ours(x), theirs.double()(x.double()))


def _model():
    return nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16), nn.RMSNorm(16)
    ).to(device_under_test())


def _train(model, steps=20):
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(8, 16, generator=gen).to(device_under_test())
    target = torch.randn(8, 16, generator=gen).to(device_under_test())
    losses = []
    for _ in range(steps):
        loss = (model(x) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("backend", backends_under_test())
def test_training_with_and_without_hooks_gives_the_same_losses(backend):
    torch.manual_seed(0)
    plain = _model()
    state = {k: v.clone() for k, v in plain.state_dict().items()}
    expected = _train(plain)
    hooks.enable_fused_layer_norm()
    hooks.enable_fused_rms_norm()
    fused = _model()
    assert type(fused[1]) is fusedops.nn.LayerNorm and type(fused[4]) is fusedops.nn.RMSNorm
    fused.load_state_dict(state)
    with fusedops.use_backend(backend):
        losses = _train(fused)
    assert fusedops.dispatch.last_used["layer_norm"] == backend
    assert_close(
        torch.tensor(losses, device="cpu"),
        torch.tensor(expected, dtype=torch.float64, device="cpu"),
    )
    assert losses[-1] < losses[0]


def test_state_dict_round_trips_between_fused_and_torch_modules():
    torch.manual_seed(0)
    plain = _model()
    buffer = io.BytesIO()
    torch.save(plain.state_dict(), buffer)
    with hooks.patched("layer_norm", "rms_norm"):
        fused = _model()
    buffer.seek(0)
    fused.load_state_dict(torch.load(buffer))
    back = _model()
    back.load_state_dict(fused.state_dict())
    x = random_tensor((4, 16), device=device_under_test())
    assert_close(fused(x), plain(x).double())
    assert_close(back(x), plain(x).double())


def test_replace_modules_swaps_exact_classes_keeping_weights():
    class MyNorm(nn.LayerNorm):
        pass

    torch.manual_seed(0)
    model = nn.Sequential(_model(), MyNorm(16)).to(device_under_test())
    ln = model[0][1]
    weight = ln.weight
    x = random_tensor((4, 16), device=device_under_test())
    expected = model(x)
    fusedops.replace_modules(model, ["layer_norm", "rms_norm"])
    assert model[0][1] is ln and type(ln) is fusedops.nn.LayerNorm and ln.weight is weight
    assert type(model[0][4]) is fusedops.nn.RMSNorm
    assert type(model[1]) is MyNorm  # user subclasses keep their own forward
    assert_close(model(x), expected.double())
    fusedops.replace_modules(model, ["layer_norm"])  # already fused: unchanged
    assert type(ln) is fusedops.nn.LayerNorm


def test_enable_disable_restore_every_torch_location():
    assert hooks.enabled() == []
    hooks.enable_fused_layer_norm()
    hooks.enable_fused_layer_norm()  # idempotent
    assert hooks.enabled() == ["layer_norm"]
    for namespace in _namespaces():
        assert namespace.LayerNorm is fusedops.nn.LayerNorm
        assert namespace.RMSNorm is TORCH_RMS_NORM
    hooks.enable_fused_rms_norm()
    assert hooks.enabled() == ["layer_norm", "rms_norm"]
    assert all(ns.RMSNorm is fusedops.nn.RMSNorm for ns in _namespaces())
    hooks.disable_fused_layer_norm()
    assert hooks.enabled() == ["rms_norm"]
    assert all(ns.LayerNorm is TORCH_LAYER_NORM for ns in _namespaces())
    hooks.disable_fused_rms_norm()
    hooks.disable_fused_rms_norm()
    assert hooks.enabled() == []
    assert all(ns.RMSNorm is TORCH_RMS_NORM for ns in _namespaces())


def _python(code: str, tmp_path: Path, **env: str) -> str:
    done = run_python("-c", textwrap.dedent(code), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_enable_before_import_torch_patches_from_imports(tmp_path):
    out = _python(
        """
        import sys
        from fusedops import hooks
        hooks.enable_fused_layer_norm()
        assert "torch" not in sys.modules
        from torch.nn import LayerNorm
        assert LayerNorm.__module__.startswith("fusedops"), LayerNorm
        import torch
        print(torch.nn.LayerNorm.__module__, hooks.enabled())
        hooks.disable_fused_layer_norm()
        print(torch.nn.LayerNorm.__module__)
        """,
        tmp_path,
    )
    assert out.split("\n")[:2] == [
        "fusedops.nn.layer_norm ['layer_norm']",
        "torch.nn.modules.normalization",
    ]


def test_fusedops_hooks_env_shows_the_fused_class(tmp_path):
    code = "import torch; print(torch.nn.LayerNorm, torch.nn.RMSNorm)"
    out = _python(code, tmp_path, FUSEDOPS_HOOKS="layer_norm")
    assert "fusedops.nn.layer_norm.LayerNorm" in out
    assert "torch.nn.modules.normalization.RMSNorm" in out
    out = _python(code, tmp_path, FUSEDOPS_HOOKS="all")
    assert "fusedops.nn.layer_norm.LayerNorm" in out and "fusedops.nn.layer_norm.RMSNorm" in out


@pytest.mark.parametrize(
    ("hook", "original"), [("layer_norm", TORCH_LAYER_NORM), ("rms_norm", TORCH_RMS_NORM)]
)
def test_every_torch_module_holding_the_class_by_name_is_patched(hook, original):
    """torch.nn.modules.transformer imports LayerNorm by name while torch imports: its encoder
    and decoder layers build the fused class too, and disable restores it there."""
    name = original.__name__
    holders = {
        module_name
        for module_name, module in list(sys.modules.items())
        if module_name.split(".")[0] == "torch" and vars(module).get(name) is original
    }
    assert hook != "layer_norm" or "torch.nn.modules.transformer" in holders
    hooks.enable(hook)
    patched = {p for p in hooks.state()[hook]["patched"] if p.split(".")[0] == "torch"}
    assert patched == {f"{module_name}.{name}" for module_name in holders}
    if hook == "layer_norm":
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32)
        assert type(layer.norm1) is type(layer.norm2) is fusedops.nn.LayerNorm
    hooks.disable(hook)
    assert all(vars(sys.modules[module_name])[name] is original for module_name in holders)

"""The hooks machinery: patching, restoring, import-time patching, FUSEDOPS_HOOKS, swaps."""

import copy
import functools
import pickle
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fusedops
from fusedops import hooks
from fusedops.testing import assert_close, random_tensor, run_python

REPO = Path(__file__).resolve().parent.parent


class QuickGELU(nn.Module):
    """A user's CLIP-style QuickGELU (what the hook replaces)."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


ORIGINAL = QuickGELU  # the global name above is what the hook patches


def _current():
    return sys.modules[__name__].QuickGELU


pytestmark = pytest.mark.usefixtures("restore_hooks")


def test_enable_replaces_named_class_and_disable_restores():
    original = ORIGINAL
    hooks.enable_quick_gelu(classes=[original])
    fused_cls = _current()
    assert fused_cls is not original and issubclass(fused_cls, original)
    assert hooks.enabled() == ["quick_gelu"]
    module = fused_cls()
    assert isinstance(module, original)
    x = random_tensor((4, 7))
    assert_close(module(x), original()(x).double())
    hooks.disable_quick_gelu()
    assert _current() is original
    assert hooks.enabled() == []


def test_enable_is_idempotent_and_patched_restores():
    hooks.enable_quick_gelu(classes=[ORIGINAL])
    fused_cls = _current()
    hooks.enable_quick_gelu(classes=[ORIGINAL])  # same options: no change
    assert _current() is fused_cls
    hooks.disable_quick_gelu()
    with hooks.patched("quick_gelu", classes=[f"{__name__}.QuickGELU"]):
        assert hooks.enabled() == ["quick_gelu"]
        assert _current().__mro__[1] is ORIGINAL
    assert hooks.enabled() == [] and _current() is ORIGINAL


def test_gelu_replacement_warns_and_covers_every_torch_location():
    original = nn.GELU
    with pytest.warns(UserWarning, match="different function"):
        hooks.enable_quick_gelu(gelu=True)
    import torch.nn.modules.activation as activation

    for namespace in (torch.nn, torch.nn.modules, activation):
        assert namespace.GELU is fusedops.nn.quick_gelu.GELUAsQuickGELU
    x = random_tensor((9,))
    assert_close(nn.GELU()(x), fusedops.quick_gelu(x, backend="reference"))
    hooks.disable_quick_gelu()
    for namespace in (torch.nn, torch.nn.modules, activation):
        assert namespace.GELU is original


def test_replace_modules_keeps_weights_and_identity():
    model = nn.Sequential(nn.Linear(4, 4), ORIGINAL(), nn.GELU(), nn.Linear(4, 2))
    weight = model[0].weight
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = random_tensor((3, 4))
    expected = model(x)
    act = model[1]
    assert fusedops.replace_modules(model, ["quick_gelu"], classes=[ORIGINAL]) is model
    assert model[1] is act and type(act).__mro__[1] is ORIGINAL
    assert type(model[2]) is nn.GELU  # nn.GELU only on explicit request
    assert model[0].weight is weight
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert_close(model(x), expected.double())
    fusedops.replace_modules(model, ["quick_gelu"], gelu=True)
    assert type(model[2]) is fusedops.nn.quick_gelu.GELUAsQuickGELU


def test_unknown_hook_and_bad_options():
    with pytest.raises(ValueError, match="unknown hook 'nope'"):
        hooks.enable("nope")
    with pytest.raises(ValueError, match="classes: 'QuickGELU' is not a dotted"):
        hooks.enable_quick_gelu(classes=["QuickGELU"])
    with pytest.raises(TypeError, match="classes: expected a class"):
        hooks.enable_quick_gelu(classes=[3])
    assert hooks.enabled() == []


def test_concurrent_enable_disable_leaves_a_consistent_state():
    errors = []

    def toggle():
        try:
            for _ in range(50):
                hooks.enable_quick_gelu(classes=[ORIGINAL])
                hooks.disable_quick_gelu()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=toggle) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _current() is ORIGINAL and hooks.enabled() == []


def _user_package(tmp_path: Path) -> Path:
    package = tmp_path / "clipish"
    package.mkdir()
    (package / "__init__.py").write_text("from .model import QuickGELU\n")
    (package / "model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class QuickGELU(nn.Module):
                def forward(self, x):
                    return x * torch.sigmoid(1.702 * x)
            """
        )
    )
    return tmp_path


def _python(code: str, tmp_path: Path, **env: str) -> str:
    done = run_python("-c", textwrap.dedent(code), cwd=tmp_path, path=(tmp_path,), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_enable_before_import_patches_on_import(tmp_path):
    out = _python(
        """
        import sys
        from fusedops import hooks
        hooks.enable_quick_gelu(classes=["clipish.model.QuickGELU"], gelu=True)
        assert "torch" not in sys.modules
        from torch.nn import GELU
        import clipish
        from clipish.model import QuickGELU
        print(GELU.__module__, QuickGELU.__mro__[1].__module__, clipish.QuickGELU is QuickGELU)
        hooks.disable_quick_gelu()
        import torch
        print(torch.nn.GELU.__module__)
        """,
        _user_package(tmp_path),
    )
    assert "fusedops.nn.quick_gelu clipish.model True" in out
    assert "torch.nn.modules.activation" in out


def test_fusedops_hooks_env_applies_at_start(tmp_path):
    out = _python(
        """
        import sys
        assert "torch" not in sys.modules  # the .pth costs nothing but the hook registration
        from fusedops import hooks
        from clipish import QuickGELU
        print(hooks.enabled(), QuickGELU.__mro__[1].__module__)
        """,
        _user_package(tmp_path),
        FUSEDOPS_HOOKS="quick_gelu:clipish.model.QuickGELU",
    )
    assert "['quick_gelu'] clipish.model" in out


def test_fusedops_hooks_env_bad_value_warns_and_starts(tmp_path):
    out = _python("print('started')", tmp_path, FUSEDOPS_HOOKS="no_such_hook")
    assert "started" in out and "FUSEDOPS_HOOKS ignored: unknown hook 'no_such_hook'" in out


# ------------------------------------------------------------------------------------------
# Machinery edge cases, on scratch hooks over scratch modules (removed again afterwards).


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """register(name, targets) adds a hook (removed afterwards); module(name, code) writes an
    importable module (dropped from sys.modules afterwards)."""
    names = []
    monkeypatch.syspath_prepend(str(tmp_path))

    class Scratch:
        @staticmethod
        def register(name, targets):
            hooks.register_hook(hooks.Hook(name, targets=targets))
            names.append(name)

        @staticmethod
        def module(name, code):
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
            monkeypatch.delitem(sys.modules, name, raising=False)

    yield Scratch
    for name in names:
        hooks.disable(name)
        hooks.machinery._HOOKS.pop(name)


def test_a_failing_replacement_warns_and_the_import_and_other_patches_go_on(scratch):
    def broken(original):
        raise RuntimeError("no fused version")

    scratch.module("hookdemo_make", "A = 1\nB = 2\n")
    scratch.register(
        "scratch_make",
        lambda **_: [
            hooks.Target("hookdemo_make", "A", broken),
            hooks.Target("hookdemo_make", "B", lambda original: original + 40),
        ],
    )
    hooks.enable("scratch_make")
    with pytest.warns(UserWarning, match=r"'scratch_make'.*hookdemo_make\.A.*RuntimeError: no"):
        import hookdemo_make
    assert (hookdemo_make.A, hookdemo_make.B) == (1, 42)
    assert hooks.state()["scratch_make"]["patched"] == ["hookdemo_make.B"]


@pytest.mark.parametrize("noticed_by", ["a later import", "state()"])
def test_enable_while_the_module_imports_in_another_thread(scratch, monkeypatch, noticed_by):
    """The module's loader was chosen before the patch was queued: the patch is applied once
    the import has finished, on the next import or the next state()/report()."""
    gate = type(sys)("hookdemo_gate")
    gate.started, gate.go = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "hookdemo_gate", gate)
    scratch.module("hookdemo_slow", "import hookdemo_gate\nhookdemo_gate.started.set()\n"
                   "hookdemo_gate.go.wait(30)\nA = 1\n")  # fmt: skip
    scratch.module("hookdemo_later", "")
    target = hooks.Target("hookdemo_slow", "A", lambda a: a + 1)
    scratch.register("scratch_race", lambda **_: [target])
    importer = threading.Thread(target=__import__, args=("hookdemo_slow",))
    importer.start()
    assert gate.started.wait(30)
    hooks.enable("scratch_race")
    assert hooks.state()["scratch_race"]["waiting"] == ["hookdemo_slow.A"]
    gate.go.set()
    importer.join(30)
    if noticed_by == "a later import":
        import hookdemo_later  # noqa: F401
    else:
        assert "patched hookdemo_slow.A" in hooks.report()
    assert sys.modules["hookdemo_slow"].A == 2
    assert hooks.state()["scratch_race"] == {
        "enabled": True, "patched": ["hookdemo_slow.A"], "waiting": [], "unpatched": []
    }  # fmt: skip


def test_patched_passes_its_options_to_hooks_that_take_none():
    with hooks.patched("layer_norm", "adam", "quick_gelu", classes=[ORIGINAL]):
        assert torch.nn.LayerNorm is fusedops.nn.LayerNorm and _current() is not ORIGINAL
        assert torch.optim.Adam is fusedops.optim.FusedAdam
    assert hooks.enabled() == [] and _current() is ORIGINAL


def test_overlapping_patched_blocks_keep_the_hook_until_the_last_one_exits():
    first, second = hooks.patched("layer_norm"), hooks.patched("layer_norm")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # not nested: the first block exits first
    assert hooks.enabled() == ["layer_norm"]
    second.__exit__(None, None, None)
    assert hooks.enabled() == []
    hooks.enable_fused_layer_norm()  # enabled before any block: blocks leave it enabled
    with hooks.patched("layer_norm"), hooks.patched("layer_norm", "rms_norm"):
        assert hooks.enabled() == ["layer_norm", "rms_norm"]
    assert hooks.enabled() == ["layer_norm"]


def test_bad_new_options_leave_the_enabled_hook_as_it_was():
    hooks.enable_quick_gelu(classes=[ORIGINAL])
    fused = _current()
    with pytest.raises(ValueError, match="not a dotted"):
        hooks.enable_quick_gelu(classes=["QuickGELU"])
    assert hooks.enabled() == ["quick_gelu"] and _current() is fused


def test_replace_modules_swaps_torch_gelu_while_the_gelu_hook_is_on():
    model = nn.Sequential(nn.GELU())  # built before the hook
    with pytest.warns(UserWarning, match="different function"):
        hooks.enable_quick_gelu(gelu=True)
    found = hooks.unfused(model, ["quick_gelu"], gelu=True)
    assert found == {"torch.nn.modules.activation.GELU": 1}
    fusedops.replace_modules(model, ["quick_gelu"], gelu=True)
    assert type(model[0]) is fusedops.nn.quick_gelu.GELUAsQuickGELU


def _accelerate_style_hook(module, calls):
    """What accelerate's add_hook_to_module does: the bound forward kept as ``_old_forward``,
    a wrapper calling it set as the instance's ``forward``."""
    old_forward = module.forward
    module._old_forward = old_forward

    def new_forward(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return module._old_forward(*args, **kwargs)

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)


def test_replace_modules_reroutes_an_accelerate_style_instance_forward():
    calls = []
    model = nn.Sequential(nn.LayerNorm(8), nn.LayerNorm(8))
    _accelerate_style_hook(model[0], calls)
    model[1].forward = lambda x: x  # an instance forward fusedops cannot see through
    x = random_tensor((3, 8))
    expected = model[0](x)
    counts = {}
    with pytest.warns(UserWarning, match="LayerNorm module left unfused: its forward is set"):
        fusedops.replace_modules(model, ["layer_norm"], counts=counts)
    assert counts == {"torch.nn.modules.normalization.LayerNorm": 1}
    assert type(model[0]) is fusedops.nn.LayerNorm and type(model[1]) is nn.LayerNorm
    fusedops.dispatch.last_used.pop("layer_norm", None)
    assert_close(model[0](x), expected.double())
    assert "layer_norm" in fusedops.dispatch.last_used  # the wrapper now runs the fused forward
    assert calls == ["LayerNorm", "LayerNorm"]
    assert hooks.unfused(model, ["layer_norm"]) == {"torch.nn.modules.normalization.LayerNorm": 1}


def test_fused_subclasses_pickle_and_deep_copy_as_themselves():
    class LocalQuickGELU(ORIGINAL):  # not reachable by name: deep-copies, as before
        pass

    model = nn.Sequential(ORIGINAL(), LocalQuickGELU())
    fusedops.replace_modules(model, ["quick_gelu"], classes=[ORIGINAL, LocalQuickGELU])
    fused, local = type(model[0]), type(model[1])
    assert fused.__mro__[1] is ORIGINAL and local.__mro__[1] is LocalQuickGELU
    copied = copy.deepcopy(model)
    assert (type(copied[0]), type(copied[1])) == (fused, local)
    assert type(pickle.loads(pickle.dumps(model[0]))) is fused
    with hooks.patched("quick_gelu", classes=[ORIGINAL]):  # the name shows the fused class
        assert _current() is fused
        data = pickle.dumps(model[0])
    assert type(pickle.loads(data)) is fused


def test_the_demo_enables_the_hooks_with_something_to_patch_quietly(monkeypatch):
    from fusedops import demo

    monkeypatch.setattr(hooks.machinery, "installed", lambda package: package == "transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "nothing to patch" for nms / a library not installed
        demo._enable_all_hooks()
    assert "nms" not in hooks.enabled() and "layer_norm" in hooks.enabled()
    assert "_fusedops_fused" in demo.QuickGELU.__dict__

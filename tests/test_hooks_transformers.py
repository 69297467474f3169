"""Hooks that reach real model code: transformers' QuickGELU tables, the RMSNorm family, open_clip's
QuickGELU (a stand-in package), report(), replace_modules' counts, and FUSEDOPS_HOOKS=all on
Hugging Face models built from tiny configs (no downloads)."""

import copy
import io
import json
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fusedops
from fusedops import hooks
from fusedops.integrations.transformers import rms_norm_classes
from fusedops.testing import assert_close, random_tensor, run_python
from tests.hf_builders import loss_of, tiny_clip_vision_config, tiny_llama_config, tiny_t5_config

transformers = pytest.importorskip("transformers")
activations = pytest.importorskip("transformers.activations")

ORIGINAL_QUICK_GELU = activations.QuickGELUActivation


pytestmark = pytest.mark.usefixtures("restore_hooks")


def _fused(module_or_class) -> bool:
    cls = module_or_class if isinstance(module_or_class, type) else type(module_or_class)
    return any("_fusedops_fused" in c.__dict__ for c in cls.__mro__)


def _table_classes():
    """The classes ACT2CLS and ACT2FN hold for "quick_gelu", read as get_activation would."""
    return activations.ACT2CLS["quick_gelu"], type(activations.get_activation("quick_gelu"))


def test_enable_quick_gelu_patches_class_and_tables_and_disable_restores():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers is importable: nothing to warn about
        hooks.enable_quick_gelu()
    fused = activations.QuickGELUActivation
    assert fused is not ORIGINAL_QUICK_GELU and issubclass(fused, ORIGINAL_QUICK_GELU)
    assert _table_classes() == (fused, fused)
    assert type(activations.ACT2FN["quick_gelu"]) is fused
    patched = hooks.state()["quick_gelu"]["patched"]
    assert {
        "transformers.activations.QuickGELUActivation",
        "transformers.activations.ACT2CLS['quick_gelu']",
        "transformers.activations.ACT2FN['quick_gelu']",
    } <= set(patched)
    x = random_tensor((4, 9))
    assert_close(activations.get_activation("quick_gelu")(x), ORIGINAL_QUICK_GELU()(x.double()))
    hooks.disable_quick_gelu()
    assert activations.QuickGELUActivation is ORIGINAL_QUICK_GELU
    assert _table_classes() == (ORIGINAL_QUICK_GELU, ORIGINAL_QUICK_GELU)
    assert hooks.state()["quick_gelu"] == {
        "enabled": False, "patched": [], "waiting": [], "unpatched": []
    }  # fmt: skip


class UserQuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


def test_named_classes_are_added_to_the_library_classes():
    hooks.enable_quick_gelu(classes=[f"{__name__}.UserQuickGELU"])
    assert _fused(globals()["UserQuickGELU"]) and _fused(activations.QuickGELUActivation)


def test_a_named_target_that_does_not_exist_warns():
    with pytest.warns(UserWarning, match="cannot patch no_such_package_x.mod.QuickGELU"):
        hooks.enable_quick_gelu(classes=["no_such_package_x.mod.QuickGELU"])
    hooks.disable_quick_gelu()
    with pytest.warns(UserWarning, match=f"cannot patch {__name__}.Missing: AttributeError"):
        hooks.enable_quick_gelu(classes=[f"{__name__}.Missing"])


def test_without_the_libraries_quick_gelu_has_nothing_to_patch(monkeypatch):
    monkeypatch.setattr(hooks.machinery, "installed", lambda package: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "quick_gelu" not in hooks.enable_from_spec("all")  # all: skipped, quietly
    with pytest.warns(UserWarning, match="'quick_gelu' has nothing to patch"):
        hooks.enable_quick_gelu()


def test_listed_rms_norms_of_another_code_or_class_are_left_unpatched(monkeypatch):
    """The RMSNorm list is static: a listed name bound to another class (transformers 4.x's
    ``T5LayerNorm = FusedRMSNorm`` where apex is installed) or a listed class whose forward is
    not its variant's code (another transformers version) stays as it is, with a warning."""
    from transformers.models.llama import modeling_llama
    from transformers.models.t5 import modeling_t5

    llama = modeling_llama.LlamaRMSNorm

    class LlamaRMSNorm(llama):  # another version's math, at the listed name
        __module__, __qualname__ = modeling_llama.__name__, "LlamaRMSNorm"

        def forward(self, hidden_states):
            return self.weight * hidden_states

    class FusedRMSNorm(nn.Module):  # apex's, bound to the listed name
        pass

    monkeypatch.setattr(modeling_llama, "LlamaRMSNorm", LlamaRMSNorm)
    monkeypatch.setattr(modeling_t5, "T5LayerNorm", FusedRMSNorm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks.enable_fused_rms_norm()
    messages = "\n".join(str(w.message) for w in caught)
    assert "LlamaRMSNorm left unpatched: its forward is not the code of the 'llama'" in messages
    assert f"T5LayerNorm left unpatched: it holds {__name__}" in messages
    assert modeling_llama.LlamaRMSNorm is LlamaRMSNorm and modeling_t5.T5LayerNorm is FusedRMSNorm
    assert len(hooks.state()["rms_norm"]["unpatched"]) == 2
    model = nn.Sequential(LlamaRMSNorm(8))
    with pytest.warns(UserWarning, match="LlamaRMSNorm left unfused: its forward"):
        assert hooks.replace_modules(model, ["rms_norm"]) and type(model[0]) is LlamaRMSNorm
    # the check reads code, not text: a docstring does not count, another variant does
    assert rms_norm_classes.rms_norm_code_mismatch(llama, "llama") is None
    assert rms_norm_classes.rms_norm_code_mismatch(llama, "fp32_weight") is not None

    class Documented(llama):
        def forward(self, hidden_states):
            """With a docstring."""
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    assert rms_norm_classes.rms_norm_code_mismatch(Documented, "llama") is None


def _tiny_clip_vision():
    model = transformers.CLIPVisionModel(tiny_clip_vision_config())
    return model, {"pixel_values": random_tensor((2, 3, 16, 16))}


def _tiny_t5():
    ids = torch.randint(1, 64, (2, 7))
    model = transformers.T5ForConditionalGeneration(tiny_t5_config())
    return model, {"input_ids": ids, "labels": ids}


def _tiny_llama():
    ids = torch.randint(0, 64, (2, 7))
    return transformers.LlamaForCausalLM(tiny_llama_config()), {"input_ids": ids, "labels": ids}


def _output(model, inputs):
    torch.manual_seed(1)  # the same dropout masks in both models
    return loss_of(model(**inputs))


@pytest.mark.parametrize(
    ("build", "swapped"),
    [
        (
            _tiny_clip_vision,
            {
                "torch.nn.modules.normalization.LayerNorm": 6,
                "transformers.activations.QuickGELUActivation": 2,
            },
        ),
        (_tiny_t5, {"transformers.models.t5.modeling_t5.T5LayerNorm": 7}),
        (_tiny_llama, {"transformers.models.llama.modeling_llama.LlamaRMSNorm": 5}),
    ],
)
def test_replace_modules_fuses_built_models(build, swapped, capsys):
    torch.manual_seed(0)
    model, inputs = build()
    fused = copy.deepcopy(model)
    counts = {}
    assert hooks.replace_modules(fused, verbose=True, counts=counts) is fused
    assert counts == swapped
    assert "fusedops.replace_modules swapped" in capsys.readouterr().out
    assert hooks.unfused(fused) == {} and hooks.unfused(model) == swapped
    assert list(fused.state_dict()) == list(model.state_dict())
    expected = _output(model, inputs)
    expected.backward()
    actual = _output(fused, inputs)
    actual.backward()
    assert_close(actual, expected.double())
    for (name, p), q in zip(fused.named_parameters(), model.parameters()):
        assert_close(p.grad, q.grad.double(), msg=name)
    assert hooks.replace_modules(fused, counts=counts) is fused and counts == swapped  # no-op


SUBPROCESS_COMMON = """
import json, math, sys
import torch
from fusedops import hooks
from fusedops.testing import assert_close
from tests.hf_builders import grads_of, loss_of

def fused(m):
    return any("_fusedops_fused" in c.__dict__ for c in type(m).__mro__)

def kinds(model):
    # modules whose class (or a base) is a LayerNorm, an RMSNorm-family norm or a QuickGELU
    names = ("LayerNorm", "RMSNorm", "QuickGELU")
    return [m for m in model.modules()
            if any(any(n in c.__name__ for n in names) for c in type(m).__mro__[:-2])]

def run(model, inputs):
    model.zero_grad()
    loss = loss_of(model(**inputs))
    loss.backward()
    return loss.detach(), grads_of(model)
"""


def _run(code: str, tmp_path: Path, **env: str) -> str:
    done = run_python("-c", textwrap.dedent(code), cwd=tmp_path, path=(tmp_path,), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_hooks_enabled_before_import_fuse_clip_t5_llama_and_disable_restores(tmp_path):
    out = _run(
        SUBPROCESS_COMMON
        + textwrap.dedent(
            """
        import warnings
        warnings.simplefilter("error")
        hooks.enable_quick_gelu()
        hooks.enable_fused_rms_norm()
        assert "transformers" not in sys.modules
        import transformers
        from transformers import activations
        from transformers.models.llama import modeling_llama
        from transformers.models.t5 import modeling_t5

        from tests.hf_builders import tiny_clip_vision_config, tiny_llama_config, tiny_t5_config

        def builds():
            c, t, l = tiny_clip_vision_config(), tiny_t5_config(), tiny_llama_config()
            g = torch.Generator().manual_seed(3)
            ids = torch.randint(1, 64, (2, 7), generator=g)
            pixels = torch.rand(2, 3, 16, 16, generator=g)
            return {
                "clip": (transformers.CLIPVisionModel, c, {"pixel_values": pixels}),
                "t5": (transformers.T5ForConditionalGeneration, t,
                       {"input_ids": ids, "labels": ids}),
                "llama": (transformers.LlamaForCausalLM, l, {"input_ids": ids, "labels": ids}),
            }

        def results():
            found = {}
            for name, (cls, config, inputs) in builds().items():
                torch.manual_seed(0)
                model = cls(config)
                mods = [m for m in kinds(model) if "LayerNorm" != type(m).__name__]
                found[name] = (sum(map(fused, mods)), len(mods), run(model, inputs))
            return found

        hooked = results()
        report = hooks.report()
        assert "patched transformers.activations.ACT2FN['quick_gelu']" in report, report
        assert "patched transformers.models.llama.modeling_llama.LlamaRMSNorm" in report
        assert "patched transformers.models.t5.modeling_t5.T5LayerNorm" in report
        hooks.disable_quick_gelu()
        hooks.disable_fused_rms_norm()
        original = activations.QuickGELUActivation
        assert "_fusedops_fused" not in original.__dict__
        assert activations.ACT2CLS["quick_gelu"] is original
        assert type(activations.ACT2FN["quick_gelu"]) is original
        for cls in (modeling_llama.LlamaRMSNorm, modeling_t5.T5LayerNorm, torch.nn.RMSNorm):
            assert "_fusedops_fused" not in cls.__dict__, cls
        plain = results()
        counts = {}
        for name in hooked:
            n_fused, n, (loss, grads) = hooked[name]
            p_fused, p_n, (p_loss, p_grads) = plain[name]
            assert n_fused == n > 0 and p_fused == 0 and p_n == n, (name, n_fused, n, p_fused)
            assert_close(loss, p_loss.double(), msg=name)
            assert grads.keys() == p_grads.keys()
            for key in grads:
                assert_close(grads[key], p_grads[key].double(), msg=f"{name} {key}")
            counts[name] = n
        print(json.dumps(counts))
        """
        ),
        tmp_path,
    )
    # CLIP vision: 2 QuickGELU; T5: 7 T5LayerNorm; Llama: 5 LlamaRMSNorm
    assert json.loads(out.strip().splitlines()[-1]) == {"clip": 2, "t5": 7, "llama": 5}


ALL_MODELS_STEP = """
import fusedops.nn.layer_norm, fusedops.nn.quick_gelu
import fusedops.integrations.transformers.rms_norm_variants as rms_norm_variants
import transformers as T
from tests.hf_builders import tiny_llama_config, tiny_t5_config

g = torch.Generator().manual_seed(5)
ids = torch.randint(1, 64, (2, 8), generator=g)
pixels = torch.rand(2, 3, 32, 32, generator=g)
text = {"input_ids": ids, "labels": ids}
image = {"pixel_values": pixels, "labels": torch.tensor([0, 2])}
small = dict(num_hidden_layers=1, num_attention_heads=2, intermediate_size=48)
vit = dict(image_size=32, patch_size=8, hidden_size=32, **small)
MODELS = {
    "bert": (T.BertForMaskedLM, T.BertConfig(vocab_size=64, hidden_size=32, **small), text),
    "vit": (T.ViTForImageClassification, T.ViTConfig(num_labels=3, **vit), image),
    "swin": (T.SwinForImageClassification, T.SwinConfig(image_size=32, patch_size=4,
             embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3),
             image),
    "clip": (T.CLIPModel, T.CLIPConfig(text_config=dict(vocab_size=64, hidden_size=32, **small),
             vision_config=dict(**vit), projection_dim=16),
             {"input_ids": ids, "pixel_values": pixels, "return_loss": True}),
    "convnext": (T.ConvNextForImageClassification, T.ConvNextConfig(num_channels=3,
                 num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=3), image),
    "gpt2": (T.GPT2LMHeadModel, T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2,
             n_positions=16), text),
    "t5": (T.T5ForConditionalGeneration, tiny_t5_config(), text),
    "llama": (T.LlamaForCausalLM, tiny_llama_config(num_hidden_layers=1), text),
}

# every call of a fused function, and every call of a norm / QuickGELU module
calls = {"fused": 0, "modules": 0}
def counting(module, name):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        calls["fused"] += 1
        return original(*args, **kwargs)
    setattr(module, name, wrapper)
counting(fusedops.nn.layer_norm, "layer_norm")
counting(fusedops.nn.layer_norm, "rms_norm")
counting(rms_norm_variants, "rms_norm")
counting(fusedops.nn.quick_gelu, "quick_gelu")

def count_module_call(*_):
    calls["modules"] += 1

results = {}
for name, (cls, config, inputs) in MODELS.items():
    torch.manual_seed(0)
    model = cls(config)
    mods = kinds(model)
    for m in mods:
        m.register_forward_pre_hook(count_module_call)
    calls.update(fused=0, modules=0)
    loss, grads = run(model, inputs)
    info = {"n": len(mods), "fused": sum(map(fused, mods)), "unfused": hooks.unfused(model),
            "calls": dict(calls), "kinds": sorted({type(m).__name__ for m in mods})}
    results[name] = (info, loss, grads)
torch.save(results, sys.argv[1])
"""


def _all_models_step(tmp_path: Path, out: str, **env: str):
    script = tmp_path / "all_models_step.py"
    script.write_text(textwrap.dedent(SUBPROCESS_COMMON) + ALL_MODELS_STEP)
    if "FUSEDOPS_HOOKS" in env:  # where the package is not installed, do what its .pth does
        script.write_text("import fusedops._autohooks\n" + script.read_text())
    done = run_python(str(script), str(tmp_path / out), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.load(tmp_path / out)


def test_fusedops_hooks_all_fuses_every_norm_and_quick_gelu_with_the_plain_loss(tmp_path):
    """The issue's done-when: FUSEDOPS_HOOKS=all fuses every LayerNorm, RMSNorm-family norm and
    QuickGELU in BERT, ViT, Swin, CLIP, ConvNeXt, GPT-2, T5 and LLaMA (ConvNeXt's own
    LayerNorm subclass included), the fused functions run once per module call, and the first
    step's loss and gradients equal a plain run's (another interpreter, same seeds, fp32)."""
    hooked = _all_models_step(tmp_path, "hooked.pt", FUSEDOPS_HOOKS="all")
    plain = _all_models_step(tmp_path, "plain.pt")
    assert set(hooked) == {"bert", "vit", "swin", "clip", "convnext", "gpt2", "t5", "llama"}
    for name, (info, loss, grads) in hooked.items():
        plain_info, plain_loss, plain_grads = plain[name]
        assert info["n"] > 0 and info["fused"] == info["n"], (name, info)
        assert info["unfused"] == {}, (name, info)
        assert info["calls"]["fused"] == info["calls"]["modules"] > 0, (name, info)
        assert plain_info["fused"] == plain_info["calls"]["fused"] == 0, (name, plain_info)
        assert plain_info["n"] == info["n"] and plain_info["kinds"] == info["kinds"]
        assert_close(loss, plain_loss.double(), msg=name)
        assert grads.keys() == plain_grads.keys()
        for key, grad in grads.items():
            assert_close(grad, plain_grads[key].double(), scale=10, msg=f"{name} {key}")
    assert "ConvNextLayerNorm" in hooked["convnext"][0]["kinds"]
    assert "QuickGELUActivation" in hooked["clip"][0]["kinds"]
    assert "T5LayerNorm" in hooked["t5"][0]["kinds"]
    assert "LlamaRMSNorm" in hooked["llama"][0]["kinds"]


def _open_clip_standin(tmp_path: Path) -> Path:
    """A package at open_clip's module paths with its QuickGELU code: the class in
    open_clip.transformer, imported by name into open_clip.model and open_clip.coca_model."""
    package = tmp_path / "open_clip"
    package.mkdir()
    (package / "__init__.py").write_text("from .model import build_mlp\n")
    (package / "transformer.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class QuickGELU(nn.Module):
                def forward(self, x: torch.Tensor):
                    return x * torch.sigmoid(1.702 * x)
            """
        )
    )
    builder = textwrap.dedent(
        """
        from torch import nn
        from .transformer import QuickGELU

        def build_mlp(quick_gelu=True):
            act_layer = QuickGELU if quick_gelu else nn.GELU
            return nn.Sequential(nn.Linear(4, 8), act_layer(), nn.Linear(8, 4))
        """
    )
    (package / "model.py").write_text(builder)
    (package / "coca_model.py").write_text(builder)
    return tmp_path


def test_open_clip_quick_gelu_before_and_after_import(tmp_path):
    out = _run(
        """
        import sys, torch
        from fusedops import hooks
        from fusedops.testing import assert_close

        def fused(cls):
            return "_fusedops_fused" in cls.__dict__

        # enabled before the import: every location shows the fused class, models use it
        hooks.enable_quick_gelu()
        import open_clip
        from open_clip import coca_model, model, transformer
        assert fused(transformer.QuickGELU) and model.QuickGELU is transformer.QuickGELU
        assert coca_model.QuickGELU is transformer.QuickGELU
        assert fused(type(open_clip.build_mlp()[1]))
        hooks.disable_quick_gelu()
        original = transformer.QuickGELU
        assert not fused(original) and model.QuickGELU is original
        assert coca_model.QuickGELU is original

        # imported first, built, then enabled: the modules importing it by name are patched
        # too, and replace_modules converts the model built before
        mlp = open_clip.build_mlp()
        hooks.enable_quick_gelu()
        assert fused(model.QuickGELU) and fused(coca_model.QuickGELU)
        state = hooks.state()["quick_gelu"]["patched"]
        assert {"open_clip.transformer.QuickGELU", "open_clip.model.QuickGELU",
                "open_clip.coca_model.QuickGELU"} <= set(state), state
        counts = {}
        x = torch.randn(3, 4)
        expected = mlp(x)
        hooks.replace_modules(mlp, counts=counts)
        assert counts == {"open_clip.transformer.QuickGELU": 1}, counts
        assert_close(mlp(x), expected.double())
        print("ok")
        """,
        _open_clip_standin(tmp_path),
    )
    assert out.strip().endswith("ok")


def test_info_prints_the_report_when_hooks_are_enabled(tmp_path):
    out = _run(
        "from fusedops.__main__ import main\nraise SystemExit(main(['info']))",
        tmp_path,
        FUSEDOPS_HOOKS="layer_norm,rms_norm",
    )
    assert "layer_norm: enabled" in out and "patched torch.nn.LayerNorm" in out
    assert "rms_norm: enabled" in out and "waiting: transformers:" in out
    assert "adam: not enabled" in out


def test_report_counts_and_lists(monkeypatch):
    hooks.enable_fused_rms_norm()
    text = hooks.report()
    state = hooks.state()["rms_norm"]
    assert state["enabled"] and "torch.nn.RMSNorm" in state["patched"]
    waiting = state["waiting"]
    assert len(waiting) > 8 and "waiting: transformers:" in text
    assert all(f"waiting {w}" in hooks.report(verbose=True) for w in waiting)
    assert f"{len(state['patched'])} patched, {len(waiting)} waiting for import" in text
    assert fusedops.hooks.report is hooks.report


@pytest.mark.parametrize("how", ["replace_modules", "built under the hook", "hook still on"])
def test_fused_llama_pickles_and_deep_copies_as_itself(how):
    """torch.save(model) of a model with fused subclasses (which keep the original's module and
    name) loads back with the same fused classes, as copy.deepcopy does."""
    torch.manual_seed(0)
    if how == "replace_modules":
        model, inputs = _tiny_llama()
        hooks.replace_modules(model, ["rms_norm"])
    else:
        hooks.enable_fused_rms_norm()
        model, inputs = _tiny_llama()
        if how == "built under the hook":
            hooks.disable_fused_rms_norm()
    norm = type(model.model.norm)
    assert norm.__dict__.get("_fusedops_fused") and norm.__name__ == "LlamaRMSNorm"
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    hooks.disable_fused_rms_norm()
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded.model.norm) is norm and type(copy.deepcopy(model).model.norm) is norm
    assert hooks.unfused(loaded) == {}
    assert_close(_output(loaded, inputs), _output(model, inputs).double())

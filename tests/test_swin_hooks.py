"""The swin hook on real models: Hugging Face Swin / Swinv2 built from configs, and timm's
swin_transformer through a stand-in module with timm's names and code shape (timm itself cannot
be imported here)."""

import copy
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import fusedops
from fusedops import hooks
from fusedops.testing import assert_close, random_tensor, run_python
from tests.op_testing import BACKENDS, DEVICE

transformers = pytest.importorskip("transformers")
modeling_swin = pytest.importorskip("transformers.models.swin.modeling_swin")
modeling_swinv2 = pytest.importorskip("transformers.models.swinv2.modeling_swinv2")

ORIGINALS = {
    (modeling_swin, "SwinLayer"): modeling_swin.SwinLayer,
    (modeling_swin, "SwinAttention"): modeling_swin.SwinAttention,
    (modeling_swinv2, "Swinv2Layer"): modeling_swinv2.Swinv2Layer,
    (modeling_swinv2, "Swinv2SelfAttention"): modeling_swinv2.Swinv2SelfAttention,
}


pytestmark = pytest.mark.usefixtures("restore_hooks")


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: one intra-op thread (two threads spinning on a shared 2-core
    machine made a 10-step run 40x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(v2=False, **overrides):
    """2 stages, window 4, 36x36 images: 9x9 and 5x5 feature maps, both padded to the window."""
    options = dict(
        image_size=36, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
        num_labels=5, drop_path_rate=0.0,
    )  # fmt: skip
    options.update(overrides)
    config_class = transformers.Swinv2Config if v2 else transformers.SwinConfig
    return config_class(**options)


def _build(model_class, config, *, seed=0):
    """A model with random (not zero) relative-position tables, so the bias paths count."""
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(0.0, 1.0)
    return model


def _fused_count(model):
    return sum(type(m).__dict__.get("_fusedops_fused", False) for m in model.modules())


def _check_same(model, ref, images, labels=None):
    """Same logits, attentions and parameter gradients for model and ref."""
    out, expected = model(images, output_attentions=True), ref(images, output_attentions=True)
    assert_close(out.logits, expected.logits, dtype=torch.float32, scale=4.0, msg="logits")
    assert len(out.attentions) == len(expected.attentions) == 2
    for got, want in zip(out.attentions, expected.attentions):
        assert_close(got, want, dtype=torch.float32, scale=4.0, msg="attentions")
    labels = torch.arange(images.shape[0]) % 5 if labels is None else labels
    F.cross_entropy(out.logits, labels).backward()
    F.cross_entropy(expected.logits, labels).backward()
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=torch.float32, scale=16.0, msg=name)


@pytest.mark.parametrize(
    ("model_class", "v2"),
    [("SwinForImageClassification", False), ("Swinv2ForImageClassification", True)],
)
def test_hooked_model_matches_the_original(model_class, v2):
    cls = getattr(transformers, model_class)
    config = _config(v2, attn_implementation="eager")  # eager: the originals return attentions
    ref = _build(cls, config)
    hooks.enable_fused_swin()
    assert "swin" in hooks.enabled()
    model = cls(config)
    model.load_state_dict(ref.state_dict())
    assert _fused_count(model) == 8  # 4 layers + 4 attentions
    _check_same(model, ref, random_tensor((2, 3, 36, 36)))
    assert fusedops.dispatch.last_used["window_partition_roll"] == "native"
    assert fusedops.dispatch.last_used["swin_attention_softmax"] == "native"


@pytest.mark.parametrize("v2", [False, True])
def test_without_attention_weights_the_hook_runs_the_flash_window_attention(v2):
    """Asked for no attention weights, the fused attention is one window_attention call per
    direction (bias and shift mask read apart, scores never materialised); same logits and
    gradients as the model's own code (head dim 16: the flash kernel's smallest)."""
    cls = (
        transformers.Swinv2ForImageClassification if v2 else transformers.SwinForImageClassification
    )
    config = _config(v2, embed_dim=32)
    ref = _build(cls, config)
    hooks.enable_fused_swin()
    model = cls(config)
    model.load_state_dict(ref.state_dict())
    images, labels = random_tensor((2, 3, 36, 36)), torch.tensor([1, 3])
    fusedops.dispatch.last_used.clear()
    logits = model(images).logits
    assert fusedops.dispatch.last_used.get("window_attention") == "native"
    assert "swin_attention_softmax" not in fusedops.dispatch.last_used
    expected = ref(images).logits
    assert_close(logits, expected, dtype=torch.float32, scale=4.0, msg="logits")
    F.cross_entropy(logits, labels).backward()
    F.cross_entropy(expected, labels).backward()
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=torch.float32, scale=16.0, msg=name)


@pytest.mark.parametrize("route", ["config", "kwarg"])
def test_attentions_asked_for_by_config_or_argument_are_returned(route):
    """transformers 5.x records attentions when ``output_attentions`` is passed or set in the
    config (without passing the config's value down): the fused attention returns the weights
    either way (head dim 16, where the flash path would otherwise run)."""
    overrides = dict(image_size=16, embed_dim=32, depths=[2], num_heads=[2])
    config = _config(attn_implementation="eager", output_attentions=route == "config", **overrides)
    ref = _build(transformers.SwinForImageClassification, config)
    model = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    images = random_tensor((2, 3, 16, 16))
    kwargs = {"output_attentions": True} if route == "kwarg" else {}
    out, expected = model(images, **kwargs), ref(images, **kwargs)
    assert len(out.attentions) == len(expected.attentions) == 1
    assert_close(out.attentions[0], expected.attentions[0], dtype=torch.float32, scale=4.0)
    assert_close(out.logits, expected.logits, dtype=torch.float32, scale=4.0)
    if route == "config":  # asked not to return them: the flash path, no weights
        assert model(images, output_attentions=False).attentions is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_hooked_model_matches_the_original_on_every_backend(backend, autocast):
    """16x16 and 8x8 maps padded to 7x7 windows (64px; smaller maps than the window make HF
    Swin shrink the window below its bias table), 4 images on a GPU, 1 on the CPU; fp32 and
    bf16 autocast, logits and every parameter's gradient."""
    size = 64
    config = _config(image_size=size, embed_dim=32, window_size=7)
    ref = _build(transformers.SwinForImageClassification, config).to(DEVICE)
    model = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    images = random_tensor((4 if DEVICE.type == "cuda" else 1, 3, size, size), device=DEVICE)
    with (
        fusedops.use_backend(backend),
        torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast),
    ):
        out = model(images).logits
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        expected = ref(images).logits
    assert fusedops.dispatch.last_used["window_partition_roll"] == backend
    assert fusedops.dispatch.last_used["window_attention"] == backend  # not the softmax alone
    dtype = torch.bfloat16 if autocast else torch.float32
    assert_close(out.float(), expected.float(), dtype=dtype, scale=4.0)
    with fusedops.use_backend(backend):
        out.float().square().sum().backward()
    expected.float().square().sum().backward()
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=dtype, scale=16.0, msg=name)


def test_ten_adamw_steps_give_the_same_losses():
    config = _config()
    ref = _build(transformers.SwinForImageClassification, config)
    model = copy.deepcopy(ref)
    fusedops.replace_modules(model, hooks=["swin"])
    generator = torch.Generator().manual_seed(3)
    images = torch.randn(4, 3, 36, 36, generator=generator)
    labels = torch.randint(0, 5, (4,), generator=generator)
    losses = []
    for net in (ref, model):
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        run = []
        for _ in range(10):
            loss = F.cross_entropy(net(images).logits, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.append(loss.item())
        losses.append(torch.tensor(run, dtype=torch.float64))
    assert_close(losses[1], losses[0], dtype=torch.float32, scale=10.0)
    assert losses[0][-1] < losses[0][0]


def test_replace_modules_converts_a_built_model_and_disable_restores_the_classes():
    config = _config(attn_implementation="eager")
    ref = _build(transformers.SwinForImageClassification, config)
    model = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    assert _fused_count(model) == 8 and _fused_count(ref) == 0
    layer = model.swin.encoder.layers[0].blocks[1]
    assert isinstance(layer, modeling_swin.SwinLayer) and layer.shift_size == 2
    _check_same(model, ref, random_tensor((3, 3, 36, 36)))

    hooks.enable_fused_swin()
    for (module, name), original in ORIGINALS.items():
        patched = getattr(module, name)
        assert patched is not original and patched.__mro__[1] is original
    hooks.disable_fused_swin()
    for (module, name), original in ORIGINALS.items():
        assert getattr(module, name) is original
    assert "swin" not in hooks.enabled()


def test_swin_backbone_feature_maps_match():
    config = _config(out_features=["stage1", "stage2"])
    ref = _build(transformers.SwinBackbone, config)
    model = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    images = random_tensor((2, 3, 36, 36))
    got, want = model(images).feature_maps, ref(images).feature_maps
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        assert_close(a, b, dtype=torch.float32, scale=4.0)


def test_hooked_swin_is_one_xla_program_per_direction():
    pytest.importorskip("jax")
    from fusedops.xla import partial_trace

    torch._dynamo.reset()
    config = _config(image_size=20, patch_size=2, embed_dim=8, depths=[2], num_heads=[2])
    ref = _build(transformers.SwinModel, config)
    ref.pooler = None  # AdaptiveAvgPool1d's backward has no XLA lowering (as_strided_scatter)
    model = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    traced = partial_trace(lambda m, x: m(x).last_hidden_state, fullgraph=True)
    images = random_tensor((2, 3, 20, 20))
    out = traced(model, images)
    expected = ref(images).last_hidden_state
    weights = random_tensor(out.shape)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    assert_close(out, expected, dtype=torch.float32, scale=16.0)
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=torch.float32, scale=64.0, msg=name)
    assert traced.stats.regions == 1 and traced.stats.programs == 2
    assert not traced.stats.eager_ops


def test_unknown_code_shape_is_left_unpatched_with_a_warning(monkeypatch):
    class SwinLayer(torch.nn.Module):  # a transformers version whose layer fusedops does not know
        __module__, __qualname__ = modeling_swin.__name__, "SwinLayer"

        def forward(self, hidden_states, dims, something_new=None):
            return hidden_states

    monkeypatch.setattr(modeling_swin, "SwinLayer", SwinLayer)
    with pytest.warns(UserWarning, match="SwinLayer left unpatched: its forward"):
        hooks.enable_fused_swin()
    assert modeling_swin.SwinLayer is SwinLayer
    assert modeling_swin.SwinAttention.__mro__[1] is ORIGINALS[(modeling_swin, "SwinAttention")]
    state, report = hooks.state()["swin"], hooks.report()
    layer = "transformers.models.swin.modeling_swin.SwinLayer"
    assert layer not in state["patched"] and f"  patched {layer}" not in report
    assert [entry.partition(":")[0] for entry in state["unpatched"]] == [layer]
    assert f"left unpatched {layer}: its forward" in report
    with pytest.warns(UserWarning, match="SwinLayer left unfused: its forward"):
        assert hooks.machinery._get("swin").swap_for(SwinLayer) is None


def test_a_name_bound_to_another_class_is_left_unpatched(monkeypatch):
    """A model file may bind a listed name to a class of its own (transformers 4.x's
    ``T5LayerNorm = FusedRMSNorm`` where apex is installed): not the class the list means."""

    class FusedRMSNorm(torch.nn.Module):  # e.g. apex.normalization.FusedRMSNorm
        pass

    monkeypatch.setattr(modeling_swin, "SwinAttention", FusedRMSNorm)
    with pytest.warns(UserWarning, match=f"SwinAttention left unpatched: it holds {__name__}"):
        hooks.enable_fused_swin()
    assert modeling_swin.SwinAttention is FusedRMSNorm


def test_fusedops_hooks_env_patches_at_import(tmp_path):
    code = """
        import sys
        assert "transformers" not in sys.modules
        from transformers import SwinConfig, SwinModel
        config = SwinConfig(image_size=16, patch_size=4, embed_dim=8, depths=[2], num_heads=[2],
                            window_size=2)
        model = SwinModel(config)
        print(type(model.encoder.layers[0].blocks[1])._fusedops_fused)
        print(model(__import__("torch").randn(1, 3, 16, 16)).last_hidden_state.shape)
    """
    done = run_python("-c", textwrap.dedent(code), cwd=tmp_path, env={"FUSEDOPS_HOOKS": "swin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["True", "torch.Size([1, 16, 8])"]


def test_all_includes_swin():
    names = hooks.enable_from_spec("all")
    assert "swin" in names and "swin" in hooks.enabled()


# ------------------------------------------------------------------------------------------
# timm: a stand-in for timm.models.swin_transformer with timm's names and code shape (>= 0.9).

TIMM_SWIN = """
import torch
from torch import nn


def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size[0], window_size[0], W // window_size[1], window_size[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size[0], window_size[1], C)


def window_reverse(windows, window_size, H, W):
    C = windows.shape[-1]
    wh, ww = window_size
    x = windows.view(-1, H // wh, W // ww, wh, ww, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


def get_relative_position_index(win_h, win_w):
    coords = torch.stack(torch.meshgrid(torch.arange(win_h), torch.arange(win_w), indexing="ij"))
    flat = torch.flatten(coords, 1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += win_h - 1
    rel[:, :, 1] += win_w - 1
    rel[:, :, 0] *= 2 * win_w - 1
    return rel.sum(-1)


class WindowAttention(nn.Module):
    def __init__(self, dim, num_heads, window_size=7, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.window_size = window_size
        self.window_area = window_size[0] * window_size[1]
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.register_buffer("relative_position_index",
                             get_relative_position_index(*window_size).view(-1), persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.softmax = nn.Softmax(dim=-1)

    def _get_rel_pos_bias(self):
        bias = self.relative_position_bias_table[self.relative_position_index]
        bias = bias.view(self.window_area, self.window_area, -1).permute(2, 0, 1).contiguous()
        return bias.unsqueeze(0)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn + self._get_rel_pos_bias()
        if mask is not None:
            num_win = mask.shape[0]
            attn = attn.view(-1, num_win, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.attn_drop(self.softmax(attn))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, -1)
        return self.proj_drop(self.proj(x))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, input_resolution, num_heads=4, window_size=7, shift_size=0):
        super().__init__()
        self.input_resolution = input_resolution
        self.window_size = (window_size, window_size)
        self.shift_size = (shift_size, shift_size)
        self.window_area = window_size * window_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window_size=self.window_size)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.register_buffer("attn_mask", self.get_attn_mask(), persistent=False)

    def get_attn_mask(self, x=None):
        if not any(self.shift_size):
            return None
        H, W = self.input_resolution
        H = -(-H // self.window_size[0]) * self.window_size[0]
        W = -(-W // self.window_size[1]) * self.window_size[1]
        img_mask = torch.zeros((1, H, W, 1))
        cnt = 0
        for h in ((0, -self.window_size[0]), (-self.window_size[0], -self.shift_size[0]),
                  (-self.shift_size[0], None)):
            for w in ((0, -self.window_size[1]), (-self.window_size[1], -self.shift_size[1]),
                      (-self.shift_size[1], None)):
                img_mask[:, slice(*h), slice(*w), :] = cnt
                cnt += 1
        mask_windows = window_partition(img_mask, self.window_size).view(-1, self.window_area)
        attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
        return attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, 0.0)

    def _attn(self, x):
        B, H, W, C = x.shape
        has_shift = any(self.shift_size)
        if has_shift:
            shift = (-self.shift_size[0], -self.shift_size[1])
            shifted_x = torch.roll(x, shifts=shift, dims=(1, 2))
        else:
            shifted_x = x
        pad_h = (self.window_size[0] - H % self.window_size[0]) % self.window_size[0]
        pad_w = (self.window_size[1] - W % self.window_size[1]) % self.window_size[1]
        shifted_x = torch.nn.functional.pad(shifted_x, (0, 0, 0, pad_w, 0, pad_h))
        _, Hp, Wp, _ = shifted_x.shape
        x_windows = window_partition(shifted_x, self.window_size).view(-1, self.window_area, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size[0], self.window_size[1], C)
        shifted_x = window_reverse(attn_windows, self.window_size, Hp, Wp)
        shifted_x = shifted_x[:, :H, :W, :].contiguous()
        if has_shift:
            return torch.roll(shifted_x, shifts=self.shift_size, dims=(1, 2))
        return shifted_x

    def forward(self, x):
        B, H, W, C = x.shape
        x = x + self._attn(self.norm1(x))
        x = x.reshape(B, -1, C)
        x = x + self.mlp(self.norm2(x))
        return x.reshape(B, H, W, C)
"""


@pytest.fixture
def timm_swin(tmp_path, monkeypatch):
    """Import the stand-in as timm.models.swin_transformer (removed again afterwards)."""
    models = tmp_path / "timm" / "models"
    models.mkdir(parents=True)
    (tmp_path / "timm" / "__init__.py").write_text("")
    (models / "__init__.py").write_text("")
    (models / "swin_transformer.py").write_text(TIMM_SWIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
        del sys.modules[name]


@pytest.mark.parametrize("resolution", [(8, 12), (6, 10)], ids=["divisible", "padded"])
def test_timm_swin_block_hooked_at_import_matches_the_original(timm_swin, resolution):
    hooks.enable_fused_swin()  # before timm's module is imported: patched on import
    import timm.models.swin_transformer as swin

    fused_block = swin.SwinTransformerBlock
    original = fused_block._fusedops_original
    assert swin.WindowAttention.__dict__["_fusedops_fused"]
    torch.manual_seed(0)
    ref = original(16, resolution, num_heads=2, window_size=4, shift_size=2)
    block = fused_block(16, resolution, num_heads=2, window_size=4, shift_size=2)
    block.load_state_dict(ref.state_dict())
    assert isinstance(block.attn, swin.WindowAttention._fusedops_original)
    ref.attn.__class__ = swin.WindowAttention._fusedops_original
    x = random_tensor((2, *resolution, 16))
    out, expected = block(x), ref(x)
    assert_close(out, expected, dtype=torch.float32, scale=4.0)
    out.square().sum().backward()
    expected.square().sum().backward()
    want = dict(ref.named_parameters())
    for name, p in block.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=torch.float32, scale=16.0, msg=name)
    hooks.disable_fused_swin()
    assert swin.SwinTransformerBlock is original


def test_timm_replace_modules_on_a_built_block(timm_swin):
    import timm.models.swin_transformer as swin

    torch.manual_seed(0)
    ref = swin.SwinTransformerBlock(8, (8, 8), num_heads=2, window_size=4, shift_size=2)
    block = fusedops.replace_modules(copy.deepcopy(ref), hooks=["swin"])
    assert _fused_count(block) == 2 and swin.SwinTransformerBlock is type(ref)
    x = random_tensor((3, 8, 8, 8))
    assert_close(block(x), ref(x), dtype=torch.float32, scale=4.0)
    assert fusedops.dispatch.last_used["window_reverse_roll"] == "native"


def test_timm_shape_without_attn_method_is_refused():
    from fusedops.integrations.timm import swin as swin_timm
    from fusedops.nn import swin

    class SwinTransformerBlock(torch.nn.Module):  # timm < 0.9: everything inline in forward
        def forward(self, x):
            return x

    reason = swin.fused_subclass(SwinTransformerBlock, swin_timm.recognise)
    assert isinstance(reason, str) and "no _attn method" in reason


# ------------------------------------------------------------------------------------------
# transformers 4.x code shape (SwinSelfAttention with query/key/value and a bias table inside
# SwinAttention, head_mask / output_attentions arguments, tuple outputs), as stand-in classes.


def _transformers4_swin_classes(mask_takes_device=True):
    from torch import nn

    class SwinSelfAttention(nn.Module):
        def __init__(self, dim, heads, window):
            super().__init__()
            self.num_attention_heads, self.attention_head_size = heads, dim // heads
            self.all_head_size, self.window_size = dim, (window, window)
            self.relative_position_bias_table = nn.Parameter(
                torch.randn((2 * window - 1) ** 2, heads)
            )
            index = modeling_swin.SwinRelativePositionBias(heads, self.window_size)
            self.register_buffer("relative_position_index", index.relative_position_index.clone())
            self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
            self.dropout = nn.Dropout(0.0)

        def forward(
            self, hidden_states, attention_mask=None, head_mask=None, output_attentions=False
        ):
            b, n, _ = hidden_states.shape
            heads = self.num_attention_heads

            def split(x):
                return x.view(b, n, heads, self.attention_head_size).permute(0, 2, 1, 3)

            q, k, v = (split(f(hidden_states)) for f in (self.query, self.key, self.value))
            scores = q @ k.transpose(-1, -2) / self.attention_head_size**0.5
            bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
            scores = scores + bias.view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
            if attention_mask is not None:
                nw = attention_mask.shape[0]
                scores = scores.view(b // nw, nw, heads, n, n) + attention_mask.unsqueeze(
                    1
                ).unsqueeze(0)
                scores = scores.view(-1, heads, n, n)
            probs = self.dropout(nn.functional.softmax(scores, dim=-1))
            if head_mask is not None:
                probs = probs * head_mask
            context = (probs @ v).permute(0, 2, 1, 3).reshape(b, n, self.all_head_size)
            return (context, probs) if output_attentions else (context,)

    class SwinSelfOutput(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dense = nn.Linear(dim, dim)

        def forward(self, hidden_states, input_tensor):
            return self.dense(hidden_states)

    class SwinAttention(nn.Module):
        def __init__(self, dim, heads, window):
            super().__init__()
            self.self = SwinSelfAttention(dim, heads, window)
            self.output = SwinSelfOutput(dim)

        def forward(
            self, hidden_states, attention_mask=None, head_mask=None, output_attentions=False
        ):
            outputs = self.self(hidden_states, attention_mask, head_mask, output_attentions)
            return (self.output(outputs[0], hidden_states),) + outputs[1:]

    class SwinLayer(nn.Module):
        set_shift_and_window_size = modeling_swin.SwinLayer.set_shift_and_window_size
        maybe_pad = modeling_swin.SwinLayer.maybe_pad
        if mask_takes_device:
            get_attn_mask = modeling_swin.SwinLayer.get_attn_mask
        else:  # early 4.x: get_attn_mask(height, width, dtype), moved to the device after

            def get_attn_mask(self, height, width, dtype):
                return modeling_swin.SwinLayer.get_attn_mask(self, height, width, dtype, "cpu")

        def __init__(self, dim, heads, window, shift):
            super().__init__()
            self.window_size, self.shift_size = window, shift
            self.layernorm_before, self.layernorm_after = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attention = SwinAttention(dim, heads, window)
            self.drop_path = nn.Identity()
            self.intermediate = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU())
            self.output = nn.Linear(2 * dim, dim)

        def forward(
            self, hidden_states, input_dimensions, head_mask=None, output_attentions=False,
            always_partition=False,
        ):  # fmt: skip
            if not always_partition:
                self.set_shift_and_window_size(input_dimensions)
            height, width = input_dimensions
            batch, _, channels = hidden_states.size()
            shortcut = hidden_states
            hidden_states = self.layernorm_before(hidden_states).view(
                batch, height, width, channels
            )
            hidden_states, pad_values = self.maybe_pad(hidden_states, height, width)
            _, height_pad, width_pad, _ = hidden_states.shape
            if self.shift_size > 0:
                shift = (-self.shift_size, -self.shift_size)
                hidden_states = torch.roll(hidden_states, shifts=shift, dims=(1, 2))
            windows = modeling_swin.window_partition(hidden_states, self.window_size)
            windows = windows.view(-1, self.window_size * self.window_size, channels)
            if mask_takes_device:
                mask = self.get_attn_mask(
                    height_pad, width_pad, dtype=windows.dtype, device=windows.device
                )
            else:
                mask = self.get_attn_mask(height_pad, width_pad, windows.dtype).to(windows.device)
            outputs = self.attention(windows, mask, head_mask, output_attentions=output_attentions)
            windows = outputs[0].view(-1, self.window_size, self.window_size, channels)
            shifted = modeling_swin.window_reverse(windows, self.window_size, height_pad, width_pad)
            if self.shift_size > 0:
                shift = (self.shift_size, self.shift_size)
                shifted = torch.roll(shifted, shifts=shift, dims=(1, 2))
            if pad_values[3] > 0 or pad_values[5] > 0:
                shifted = shifted[:, :height, :width, :].contiguous()
            hidden_states = shortcut + self.drop_path(shifted.view(batch, height * width, channels))
            layer_output = self.intermediate(self.layernorm_after(hidden_states))
            layer_output = hidden_states + self.output(layer_output)
            return (layer_output, outputs[1]) if output_attentions else (layer_output,)

    return SwinLayer, SwinAttention


@pytest.mark.parametrize(
    ("use_head_mask", "mask_takes_device"),
    [(False, True), (True, True), (False, False)],
    ids=["fused", "head_mask", "get_attn_mask-without-device"],
)
def test_transformers_4x_code_shape(use_head_mask, mask_takes_device):
    from fusedops.integrations.transformers import swin as swin_transformers
    from fusedops.nn import swin

    layer_class, attention_class = _transformers4_swin_classes(mask_takes_device)
    torch.manual_seed(0)
    ref = layer_class(16, 2, 4, 2)
    layer = copy.deepcopy(ref)
    layer.__class__ = swin.fused_subclass(layer_class, swin_transformers.recognise)
    layer.attention.__class__ = swin.fused_subclass(attention_class, swin_transformers.recognise)
    assert layer.__class__._fusedops_fused and layer.attention.__class__._fusedops_fused
    x = random_tensor((2, 81, 16))  # a 9x9 map: padded to 12x12, shift 2
    head_mask = torch.tensor([1.0, 0.5])[None, :, None, None] if use_head_mask else None
    fusedops.dispatch.last_used.clear()
    out = layer(x, (9, 9), head_mask, output_attentions=True)
    assert "window_partition_roll" in fusedops.dispatch.last_used
    # a head_mask runs the model's own attention code
    assert ("swin_attention_softmax" in fusedops.dispatch.last_used) != use_head_mask
    expected = ref(x, (9, 9), head_mask, output_attentions=True)
    assert len(out) == len(expected) == 2
    assert_close(out[0], expected[0], dtype=torch.float32, scale=4.0)
    assert_close(out[1], expected[1], dtype=torch.float32, scale=4.0)
    out[0].square().sum().backward()
    expected[0].square().sum().backward()
    want = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        assert_close(p.grad, want[name].grad, dtype=torch.float32, scale=16.0, msg=name)
    assert len(layer(x, (9, 9))) == 1  # no attentions asked: a 1-tuple, as 4.x returns


def test_a_layer_whose_get_attn_mask_takes_other_arguments_is_refused():
    from fusedops.integrations.transformers import swin as swin_transformers

    class SwinLayer(modeling_swin.SwinLayer):
        def get_attn_mask(self, shape, dtype, device):  # a signature fusedops does not know
            return None

    reason = swin_transformers.recognise(SwinLayer)
    assert isinstance(reason, str) and "get_attn_mask('shape', 'dtype', 'device')" in reason

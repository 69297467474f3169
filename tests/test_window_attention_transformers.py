"""``attn_implementation="fusedops"`` (fusedops.integrations.transformers): Hugging Face models
built from configs give the eager implementation's logits and gradients; inputs the op cannot
take fall back to transformers' sdpa with one warning."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fusedops
from fusedops.testing import assert_close, random_tensor, run_python
from tests.hf_builders import grads_of
from tests.op_testing import BACKENDS, DEVICE

transformers = pytest.importorskip("transformers")

from fusedops.integrations import transformers as integration  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _registered():
    integration.register_attention()


def _swin(small: bool):
    config = transformers.SwinConfig(
        image_size=16 if small else 32,
        patch_size=2,
        num_channels=3,
        embed_dim=32,
        depths=[2] if small else [2, 2],
        num_heads=[2] if small else [2, 4],
        window_size=4,
        num_labels=5,
        drop_path_rate=0.0,
    )
    return (
        transformers.SwinForImageClassification,
        config,
        (2, 3, config.image_size) + (config.image_size,),
    )


def _beit():
    config = transformers.BeitConfig(
        image_size=32,
        patch_size=4,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        use_relative_position_bias=True,
        num_labels=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )
    return transformers.BeitForImageClassification, config, (2, 3, 32, 32)


def _pair(model_class, config):
    """The same random weights with the eager and the fusedops attention (train mode)."""
    torch.manual_seed(0)
    eager = model_class._from_config(copy.deepcopy(config), attn_implementation="eager")
    with torch.no_grad():
        for p in eager.parameters():  # relative position bias tables start at zero
            p.add_(0.05 * torch.randn_like(p))
    fused = model_class._from_config(copy.deepcopy(config), attn_implementation="fusedops")
    fused.load_state_dict(eager.state_dict())
    assert fused.config._attn_implementation == "fusedops"
    return eager.to(DEVICE).train(), fused.to(DEVICE).train()


def _logits_and_grads(model, pixels):
    model.zero_grad(set_to_none=True)
    logits = model(pixel_values=pixels).logits
    logits.square().sum().backward()
    return logits, grads_of(model)


def _compare(model_class, config, shape, backend):
    eager, fused = _pair(model_class, config)
    pixels = random_tensor(shape, torch.float32, DEVICE)
    fusedops.dispatch.last_used.pop("window_attention", None)
    with fusedops.use_backend(backend):
        logits, grads = _logits_and_grads(fused, pixels)
    assert fusedops.dispatch.last_used["window_attention"] == backend
    expected, expected_grads = _logits_and_grads(eager, pixels)
    assert_close(logits, expected, scale=4.0, msg="logits")
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert_close(grad, expected_grads[name], scale=20.0, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swin_same_logits_and_gradients_as_eager(backend):
    """Swin's plain blocks pass the bias (1, H, N, N), its shifted ones bias + shift mask
    combined to (B*nW, H, N, N): both mappings, with the bias table's gradient."""
    _compare(*_swin(small=backend != "reference"), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_beit_relative_position_bias_same_logits_and_gradients_as_eager(backend):
    """BEiT passes its learned relative position bias (1, H, 65, 65) as the float mask: 65
    tokens take two blocks of the Triton kernels."""
    _compare(*_beit(), backend)


class _Attention(torch.nn.Module):
    is_causal = False


@pytest.mark.parametrize("shape", [(1, 2), (3, 1), (3, 2)], ids=["shared", "per-batch", "full"])
@pytest.mark.parametrize("learned", [False, True])
def test_each_mask_mapping_matches_eager_attention(shape, learned):
    from transformers.models.swin.modeling_swin import eager_attention_forward

    batch, heads, n, d = 3, 2, 9, 16
    q, k, v = (random_tensor((batch, n, heads, d)).transpose(1, 2).requires_grad_() for _ in "qkv")
    mask = random_tensor((*shape, n, n)).requires_grad_(learned)
    module = _Attention()
    out, weights = integration.attention_forward(module, q, k, v, mask, scaling=0.2)
    assert weights is None and out.shape == (batch, n, heads, d)
    expected, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.2)
    assert_close(out, expected.double())
    if learned:
        (grad,) = torch.autograd.grad(out.square().sum(), mask)
        (want,) = torch.autograd.grad(expected.square().sum(), mask)
        assert_close(grad, want.double(), scale=4.0)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dropout": 0.1}, "dropout"),
        ({"mask": "bool"}, "bool"),
        ({"causal": True}, "causal"),
        ({"d": 24}, "head dim 24"),
    ],
)
def test_unsupported_inputs_fall_back_to_sdpa_with_one_warning(change, reason):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, n, d = 2, 2, 8, change.get("d", 16)
    q, k, v = (random_tensor((batch, heads, n, d)) for _ in "qkv")
    mask = random_tensor((1, heads, n, n))
    if change.get("mask") == "bool":
        mask = torch.rand(batch, 1, n, n) > 0.3
    module, kwargs = _Attention(), {}
    if change.get("causal"):
        mask, kwargs = None, {"is_causal": True}
    dropout = change.get("dropout", 0.0)
    integration._warned.clear()
    fusedops.dispatch.last_used.pop("window_attention", None)
    with pytest.warns(UserWarning, match=f"fusedops attention: .*{reason}.*sdpa") as record:
        torch.manual_seed(1)
        out, _ = integration.attention_forward(module, q, k, v, mask, dropout=dropout, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second call does not warn again
            torch.manual_seed(1)
            again, _ = integration.attention_forward(
                module, q, k, v, mask, dropout=dropout, **kwargs
            )
    assert len(record) == 1
    assert "window_attention" not in fusedops.dispatch.last_used
    torch.manual_seed(1)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, **kwargs)
    assert torch.equal(out, expected) and torch.equal(again, expected)


def test_softcap_falls_back_to_the_model_files_eager_attention():
    """sdpa refuses softcap: the call goes to the eager function of the module's own file."""
    from transformers.models.gemma2 import modeling_gemma2

    class Gemma2LikeAttention(_Attention):
        __module__ = modeling_gemma2.__name__
        head_dim, num_key_value_groups = 16, 1

    q, k, v = (random_tensor((2, 2, 8, 16)) for _ in "qkv")
    mask = random_tensor((2, 1, 8, 8))
    integration._warned.clear()
    module = Gemma2LikeAttention()
    with pytest.warns(UserWarning, match="softcap.*eager attention"):
        out, weights = integration.attention_forward(module, q, k, v, mask, softcap=30.0)
    expected, expected_weights = modeling_gemma2.eager_attention_forward(
        module, q, k, v, mask, softcap=30.0
    )
    assert torch.equal(out, expected) and torch.equal(weights, expected_weights)


def test_importing_fusedops_and_the_integration_does_not_import_transformers(tmp_path):
    done = run_python(
        "-c",
        "import sys, fusedops, fusedops.integrations\n"
        "fusedops.window_attention\n"
        "import fusedops.integrations.transformers\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
        "print('ok')\n",
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def _fallback_call(module_file, kwargs, config=None, match=""):
    """attention_forward on a module of ``module_file`` with ``kwargs``: it warns once, falls
    back to that file's eager attention and returns what it returns (weights included)."""

    class ModelAttention(_Attention):
        __module__ = module_file.__name__
        num_key_value_groups = 1

    module = ModelAttention()
    if config is not None:
        module.config = config
    q, k, v = (random_tensor((2, 2, 8, 16)) for _ in "qkv")
    mask = random_tensor((1, 2, 8, 8))
    integration._warned.clear()
    with pytest.warns(UserWarning, match=match):
        out, weights = integration.attention_forward(module, q, k, v, mask, scaling=0.25, **kwargs)
    expected, expected_weights = module_file.eager_attention_forward(
        module, q, k, v, mask, scaling=0.25, **kwargs
    )
    assert torch.equal(out, expected) and torch.equal(weights, expected_weights)


def test_attention_sinks_fall_back_to_the_model_files_eager_attention():
    """Feature-detected: transformers releases without the inkling2 model skip it."""
    modeling_inkling2 = pytest.importorskip("transformers.models.inkling2.modeling_inkling2")
    sinks = {"sinks": random_tensor((2, 2, 8, 1))}
    _fallback_call(modeling_inkling2, sinks, match="attention sinks.*eager attention")


@pytest.mark.parametrize("route", ["argument", "config"])
def test_attention_weights_asked_for_fall_back_to_the_eager_attention(route):
    from types import SimpleNamespace

    from transformers.models.swin import modeling_swin

    kwargs = {"output_attentions": True} if route == "argument" else {}
    config = SimpleNamespace(output_attentions=route == "config")
    _fallback_call(modeling_swin, kwargs, config, match="attention weights.*eager attention")


def test_query_key_value_dtypes_that_differ_fall_back_to_sdpa():
    """Under autocast a model may hand over q, k, v in different dtypes: sdpa casts them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, v = random_tensor((2, 2, 8, 16)), random_tensor((2, 2, 8, 16))
    k = random_tensor((2, 2, 8, 16), torch.bfloat16)
    integration._warned.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(UserWarning, match="dtypes differ.*sdpa"):
            out, _ = integration.attention_forward(_Attention(), q, k, v, None)
        expected, _ = sdpa_attention_forward(_Attention(), q, k, v, None)
    assert torch.equal(out, expected)

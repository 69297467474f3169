"""Hugging Face models (built from tiny configs, no downloads) with fusedops' fused modules in
them, under ``partial_trace(fullgraph=True)`` (one XLA program forward, one backward) and under
``xla_trace`` with ``FusedAdamW``, against the same models in eager PyTorch.

The fused modules come from ``fusedops.replace_modules`` (LayerNorm, CLIP's QuickGELUActivation,
Swin's layers and attention), and in one test from ``FUSEDOPS_HOOKS=all`` set before the
interpreter starts. Dropout is 0 so both runs compute the same function.
"""

from __future__ import annotations

import copy

import pytest
import torch

from fusedops.testing import assert_close, device_under_test, run_python
from tests.hf_builders import grads_of
from tests.xla.traced import no_cpu_tune  # noqa: F401

pytest.importorskip("jax")
transformers = pytest.importorskip("transformers")

import fusedops  # noqa: E402
from fusedops.optim import FusedAdamW  # noqa: E402
from fusedops.xla import partial_trace, xla_trace  # noqa: E402

T = transformers
DEVICE = device_under_test()
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _images(labels: bool = True):
    """Inputs of an image model: two random 16x16 RGB images (and class labels of 3)."""

    def inputs(device="cpu"):
        batch = {"pixel_values": torch.randn(2, 3, 16, 16, device=device)}
        if labels:
            batch["labels"] = torch.randint(0, 3, (2,), device=device)
        return batch

    return inputs


def _vit(attn="sdpa"):
    config = T.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8, num_labels=3, **NO_DROPOUT,
    )  # fmt: skip
    return T.ViTForImageClassification(config), _images()


def _bert(attn="sdpa"):
    config = T.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=3,
        attn_implementation=attn, **NO_DROPOUT,
    )  # fmt: skip

    def inputs(device="cpu"):
        mask = torch.ones(2, 7, dtype=torch.long, device=device)
        mask[1, 5:] = 0  # padding: the attention mask reaches the attention
        return {
            "input_ids": torch.randint(0, 50, (2, 7), device=device),
            "attention_mask": mask,
            "labels": torch.tensor([1, 2], device=device),
        }

    return T.BertForSequenceClassification(config), inputs


def _gpt2(attn="sdpa"):
    config = T.GPT2Config(
        vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip

    def inputs(device="cpu"):
        ids = torch.randint(0, 50, (2, 7), device=device)
        return {"input_ids": ids, "labels": ids}

    model = T.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # unset, transformers logs a warning in forward: a graph break
    return model, inputs


def _swin(attn="sdpa"):
    # head dim 16: the swin hook's attention is fusedops.window_attention (flash-style)
    config = T.SwinConfig(
        image_size=16, patch_size=2, embed_dim=32, depths=[2, 1], num_heads=[2, 2], window_size=4,
        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )  # fmt: skip
    return T.SwinForImageClassification(config), _images()


def _clip(attn="sdpa"):
    config = T.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=16, patch_size=8, attention_dropout=0.0,
    )  # fmt: skip
    return T.CLIPVisionModel(config), _images(labels=False)


MODELS = {"vit": _vit, "bert": _bert, "gpt2": _gpt2, "swin": _swin, "clip": _clip}


def _loss(output):
    """The model's own loss where it computes one (labels given), else a function of its
    pooled output."""
    if getattr(output, "loss", None) is not None:
        return output.loss
    return output.pooler_output.square().mean()


def _fused(model) -> torch.nn.Module:
    """``model`` with fusedops' modules swapped in (LayerNorm; QuickGELU named explicitly)."""
    fusedops.replace_modules(model, classes=[T.activations.QuickGELUActivation])
    kinds = {type(m).__name__ for m in model.modules() if getattr(type(m), "_fusedops_fused", 0)}
    assert "LayerNorm" in kinds, kinds
    return model


def _build(name: str, attn: str = "sdpa", fused: bool = True):
    torch.manual_seed(0)
    model, inputs = MODELS[name](attn)
    model.train()
    plain = copy.deepcopy(model)
    return (_fused(model) if fused else model), plain, inputs


def _compare_grads(got, want, scale=8.0):
    assert got.keys() == want.keys() and got
    for name, g in want.items():
        assert_close(got[name], g, scale=scale, msg=name)


#: tolerance scales of the loss and the gradients: on CUDA fusedops' kernels and cuBLAS sum in
#: other orders than the XLA programs
LOSS_SCALE, GRAD_SCALE = (8.0, 32.0) if DEVICE.type == "cuda" else (4.0, 8.0)


@pytest.mark.parametrize(
    ("name", "attn"), [(n, "sdpa") for n in MODELS] + [("bert", "eager")], ids=lambda v: v
)
@pytest.mark.usefixtures("no_tf32")
def test_partial_trace_one_program_per_direction(name, attn):
    """Each model on DEVICE under partial_trace(fullgraph=True): one program per direction,
    eager's loss and gradients."""
    model, plain, inputs = _build(name, attn)
    model, plain = model.to(DEVICE), plain.to(DEVICE)
    if name == "clip":
        assert any(type(m).__name__ == "QuickGELUActivation" and
                   getattr(type(m), "_fusedops_fused", 0) for m in model.modules())  # fmt: skip

    @partial_trace(fullgraph=True)
    def loss_fn(batch):
        return _loss(model(**batch))

    batch = inputs(DEVICE)
    loss = loss_fn(batch)
    loss.backward()
    expected = _loss(plain(**batch))
    expected.backward()
    assert loss_fn.stats.programs == 2 and not loss_fn.stats.eager_ops, loss_fn.stats
    assert loss.device.type == DEVICE.type
    assert_close(loss, expected, scale=LOSS_SCALE, msg="loss")
    _compare_grads(grads_of(model), grads_of(plain), scale=GRAD_SCALE)


def _train(model, inputs, steps: int, traced: bool):
    """``steps`` FusedAdamW steps (eager or one xla_trace program each); the losses. eps 1e-3:
    Adam's update of a near-zero gradient is then proportional to it, so fp32 rounding noise
    in such gradients moves weights by rounding noise (with eps 1e-8 it flips whole steps)."""
    opt = FusedAdamW(model.parameters(), lr=1e-2, eps=1e-3, weight_decay=0.1)

    def step(batch, *, net, opt):
        loss = _loss(net(**batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = xla_trace(step) if traced else step
    losses = [run(batch, net=model, opt=opt).detach() for batch in inputs]
    if traced:
        assert run.programs == 1
    return losses, opt


@pytest.mark.parametrize(("name", "fused"), [(n, True) for n in MODELS] + [("swin", False)])
def test_xla_trace_with_fused_adamw_matches_eager(name, fused):
    model, plain, make_inputs = _build(name, fused=fused)
    eager_model = copy.deepcopy(model) if fused else plain
    batches = [make_inputs() for _ in range(2)]
    losses, opt = _train(model, batches, 2, traced=True)
    want_losses, want_opt = _train(eager_model, batches, 2, traced=False)
    for got, want in zip(losses, want_losses):
        assert_close(got, want, scale=4.0, msg="loss")
    for (n, p), q in zip(model.named_parameters(), eager_model.parameters()):
        assert_close(p.detach(), q.detach(), scale=8.0, msg=n)
        state, want_state = opt.state[p], want_opt.state[q]
        assert_close(state["exp_avg_sq"], want_state["exp_avg_sq"], scale=8.0, msg=n)


_HOOKED_RUN = """
import torch
import fusedops
from fusedops import hooks
from fusedops.xla import partial_trace, xla_trace
from fusedops.optim import FusedAdamW
import tests.xla.test_hf_models as hf

assert hooks.enabled() == sorted(hooks.enabled()) and "swin" in hooks.enabled(), hooks.enabled()
for name, build in hf.MODELS.items():
    torch.manual_seed(0)
    model, inputs = build()
    assert not hooks.unfused(model), (name, hooks.unfused(model))
    fused = {type(m).__name__ for m in model.modules() if getattr(type(m), "_fusedops_fused", 0)}
    traced = partial_trace(lambda batch: hf._loss(model(**batch)), fullgraph=True)
    batch = inputs()
    loss = traced(batch)
    loss.backward()
    eager = hf._loss(model(**batch))
    assert traced.stats.programs == 2 and not traced.stats.eager_ops, (name, traced.stats)
    assert torch.allclose(loss, eager, rtol=1e-4, atol=1e-5), (name, loss, eager)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert isinstance(opt, FusedAdamW)

    def step(batch, *, net, opt):
        loss = hf._loss(net(**batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    train = xla_trace(step)
    train(inputs(), net=model, opt=opt)
    assert train.programs == 1, name
    print(name, sorted(fused))
"""


def test_fusedops_hooks_all_models_are_one_program_per_direction_and_xla_trace():
    """With ``FUSEDOPS_HOOKS=all`` (hooks on at interpreter start, before transformers is
    imported), every LayerNorm / QuickGELU / Swin module of the five models is fused
    (``hooks.unfused`` empty), each model runs under ``partial_trace(fullgraph=True)`` as one XLA
    program per direction with eager's loss, and its training step (torch.optim.AdamW, which the
    hook makes FusedAdamW) under ``xla_trace`` as one program."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = run_python("-c", _HOOKED_RUN, cwd=repo, env={"FUSEDOPS_HOOKS": "all"})
    assert done.returncode == 0, done.stderr[-4000:]
    for name in MODELS:
        assert name in done.stdout
    assert "SwinAttention" in done.stdout and "QuickGELUActivation" in done.stdout

"""Tiny Hugging Face models built from configs (no downloads), and what the tests that run them
share: the configs more than one test builds, a model's loss and its parameters' gradients.

``transformers`` is imported when a builder runs, not when this module is imported, so a
subprocess that enables fusedops' hooks before transformers loads can import it first
(``from tests.hf_builders import ...``: the repository is on a ``run_python`` child's path).
"""

from __future__ import annotations

import torch


def tiny_clip_vision_config():
    """CLIP's vision tower: width 32, MLP 48, 2 layers of 2 heads, 16x16 images, patch 8."""
    import transformers

    return transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        image_size=16, patch_size=8,
    )  # fmt: skip


def tiny_t5_config():
    """T5: vocabulary 64, width 32 (d_kv 8, d_ff 48), 1 encoder and 1 decoder layer, 2 heads."""
    import transformers

    return transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_decoder_layers=1,
        num_heads=2, decoder_start_token_id=0,
    )  # fmt: skip


def tiny_llama_config(num_hidden_layers: int = 2):
    """LLaMA: vocabulary 64, width 32, MLP 48, ``num_hidden_layers`` layers of 2 query heads
    sharing 1 key/value head."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=num_hidden_layers,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip


def loss_of(output) -> torch.Tensor:
    """The model's own loss where it computes one (labels given), else the sum of its pooled
    output (a scalar of the output's dtype)."""
    if getattr(output, "loss", None) is not None:
        return output.loss
    return output.pooler_output.sum()


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameter name -> ``.grad`` for every parameter of ``model`` that has a gradient."""
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

"""The Hugging Face model set of ``bench_xla.py --hf``: eight ``transformers`` models built from
configs (no downloads), each wrapped so that calling it on its batch returns the training loss.

Sizes (``Size``): the benchmark's is hidden 256, 4 layers, 4 heads (MLP 1024), batch 8, text of
128 tokens from a 4096-word vocabulary, 64x64 RGB images, 10 classes; ``Size.tiny()`` is the
tests' (a few seconds for all eight). Per model:

- ``bert``: ``BertForMaskedLM``, rows padded (attention mask: lengths from 64 to 128 tokens),
  15% of the real tokens labelled (cross-entropy over the vocabulary, the rest ignored).
- ``clip``: ``CLIPVisionModel``, patch 8 (64 patches + class token), loss mean(pooler**2).
- ``convnext``: ``ConvNextForImageClassification``, stages of 32/64/128/256 channels, one block
  each (7x7 depthwise convolutions), patch-4 stem.
- ``gpt2``: ``GPT2LMHeadModel``, causal LM loss on its own tokens.
- ``swin``: ``SwinForImageClassification``, patch 4 (16x16 patches), embed dim 64 (stages of
  64/128/256 channels, 1/1/2 blocks, 2/4/8 heads), window 4.
- ``vit``: ``ViTForImageClassification``, patch 8 (64 patches + class token).
- ``t5``: ``T5ForConditionalGeneration``, 4 encoder and 4 decoder layers, d_kv 64, d_ff 1024,
  encoder and decoder 128 tokens (targets labelled for cross-entropy).
- ``resnet``: ``ResNetForImageClassification``, bottleneck stages of 32/64/128/256 channels
  (embedding 32), one block each.

Dropout is 0 (so every backend computes the same function and no random op is timed).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

#: model names in the order of the issue's table
NAMES = ("bert", "clip", "convnext", "gpt2", "swin", "vit", "t5", "resnet")


@dataclasses.dataclass(frozen=True)
class Size:
    """Widths of the model set: ``hidden`` (transformer width; ``hidden // 8`` for the first
    convolution stage), ``layers``, ``heads``, ``seq`` (tokens per text row), ``image``
    (pixels per side), ``vocab``, ``batch``."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    seq: int = 128
    image: int = 64
    vocab: int = 4096
    batch: int = 8

    @classmethod
    def tiny(cls, batch: int = 2) -> Size:
        return cls(hidden=32, layers=2, heads=2, seq=16, image=32, vocab=64, batch=batch)


class LossOf(nn.Module):
    """``model`` called on a batch (a dict of tensors) returning its training loss: the model's
    own loss where it computes one (labels in the batch), else mean(pooler_output**2)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        output = self.model(**batch)
        if getattr(output, "loss", None) is not None:
            return output.loss
        return output.pooler_output.square().mean()


def _text(s: Size, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(1, s.vocab, (s.batch, s.seq), generator=generator)


def _images(s: Size, generator: torch.Generator, labels: bool = True) -> dict:
    batch = {"pixel_values": torch.randn(s.batch, 3, s.image, s.image, generator=generator)}
    if labels:
        batch["labels"] = torch.randint(0, 10, (s.batch,), generator=generator)
    return batch


def _bert(T, s: Size, g: torch.Generator):
    config = T.BertConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, intermediate_size=4 * s.hidden, max_position_embeddings=s.seq,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    ids = _text(s, g)
    lengths = torch.linspace(s.seq // 2, s.seq, s.batch).long()
    mask = (torch.arange(s.seq) < lengths[:, None]).long()
    picked = (torch.rand(ids.shape, generator=g) < 0.15) & (mask == 1)
    picked[:, 0] = True  # every row has a label
    labels = torch.where(picked, ids, -100)
    batch = {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}
    return T.BertForMaskedLM(config), batch


def _clip(T, s: Size, g: torch.Generator):
    config = T.CLIPVisionConfig(
        hidden_size=s.hidden, intermediate_size=4 * s.hidden, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, image_size=s.image, patch_size=8, attention_dropout=0.0,
    )  # fmt: skip
    return T.CLIPVisionModel(config), _images(s, g, labels=False)


def _stages(s: Size) -> list[int]:
    """Four convolution stages' widths ending at ``s.hidden`` (32/64/128/256)."""
    return [s.hidden // 8, s.hidden // 4, s.hidden // 2, s.hidden]


def _convnext(T, s: Size, g: torch.Generator):
    config = T.ConvNextConfig(
        hidden_sizes=_stages(s), depths=[1, 1, 1, 1], image_size=s.image, num_labels=10,
        drop_path_rate=0.0,
    )  # fmt: skip
    return T.ConvNextForImageClassification(config), _images(s, g)


def _gpt2(T, s: Size, g: torch.Generator):
    config = T.GPT2Config(
        vocab_size=s.vocab, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads, n_positions=s.seq,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = T.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # unset, transformers logs a warning in forward: a graph break
    ids = _text(s, g)
    return model, {"input_ids": ids, "labels": ids}


def _swin(T, s: Size, g: torch.Generator):
    embed = s.hidden // 4
    config = T.SwinConfig(  # patches: a 16x16 grid (stages of 16x16, 8x8, 4x4 tokens)
        image_size=s.image, patch_size=s.image // 16, embed_dim=embed,
        depths=[1, 1, max(s.layers - 2, 1)], num_heads=[max(s.heads // 2, 1), s.heads, 2 * s.heads],
        window_size=4, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
    )  # fmt: skip
    return T.SwinForImageClassification(config), _images(s, g)


def _vit(T, s: Size, g: torch.Generator):
    config = T.ViTConfig(
        hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
        intermediate_size=4 * s.hidden, image_size=s.image, patch_size=8, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return T.ViTForImageClassification(config), _images(s, g)


def _t5(T, s: Size, g: torch.Generator):
    config = T.T5Config(
        vocab_size=s.vocab, d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=4 * s.hidden,
        num_layers=s.layers, num_decoder_layers=s.layers, num_heads=s.heads, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return T.T5ForConditionalGeneration(config), {"input_ids": _text(s, g), "labels": _text(s, g)}


def _resnet(T, s: Size, g: torch.Generator):
    config = T.ResNetConfig(
        embedding_size=s.hidden // 8, hidden_sizes=_stages(s), depths=[1, 1, 1, 1],
        layer_type="bottleneck", num_labels=10,
    )  # fmt: skip
    return T.ResNetForImageClassification(config), _images(s, g)


_BUILDERS = {
    "bert": _bert,
    "clip": _clip,
    "convnext": _convnext,
    "gpt2": _gpt2,
    "swin": _swin,
    "vit": _vit,
    "t5": _t5,
    "resnet": _resnet,
}


def build(name: str, size: Size | None = None, seed: int = 0) -> tuple[LossOf, dict]:
    """``(LossOf(model), batch)`` of model ``name`` (one of ``NAMES``) at ``size`` (default:
    the benchmark's), in train mode, weights and batch drawn from ``seed``: calling the first on
    the second returns the loss (a 0-dim float32 tensor) of one training step."""
    import transformers

    transformers.logging.set_verbosity_error()  # config notices would be printed every build
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model, batch = _BUILDERS[name](transformers, size or Size(), generator)
    return LossOf(model).train(), batch

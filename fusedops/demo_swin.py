"""The demo's Swin stage: a small Hugging Face Swin (built from a config, never downloaded)
trained a few steps as transformers writes it and with ``hooks.enable_fused_swin()``, same seed
and data; prints the step time, the final loss and the backend each fused Swin op ran on."""

from __future__ import annotations

import importlib.util
import statistics

import torch
from torch.nn import functional as F

from fusedops._demo_loop import timed_steps

IMAGE = 36  # 9x9 then 5x5 feature maps: both padded to the 4x4 window


def _train(steps: int, batch: int, device: str, fused: bool) -> tuple[float, float]:
    import transformers

    from fusedops import hooks

    config = transformers.SwinConfig(
        image_size=IMAGE, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
        window_size=4, num_labels=10, drop_path_rate=0.0,
    )  # fmt: skip
    if fused:
        hooks.enable_fused_swin()
    try:
        torch.manual_seed(0)
        model = transformers.SwinForImageClassification(config).to(device)
    finally:
        hooks.disable_fused_swin()  # the model keeps its fused classes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, IMAGE, IMAGE, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    times, loss = timed_steps(
        lambda: F.cross_entropy(model(images).logits, labels), optimizer, steps, device
    )
    return 1e3 * statistics.median(times[1:] or times), loss.item()


def main(steps: int, batch: int, device: str) -> None:
    """Print the Swin stage of ``make demo``."""
    from fusedops import dispatch

    if importlib.util.find_spec("transformers") is None:
        print("\nSwin: skipped, transformers is not installed (pip install -e '.[test]')")
        return
    print(f"\nSwin (transformers SwinForImageClassification from a config, 2 stages, window 4, "
          f"{IMAGE}x{IMAGE} images), {steps} steps, batch {batch}:")  # fmt: skip
    plain_ms, plain_loss = _train(steps, batch, device, fused=False)
    dispatch.last_used.clear()
    fused_ms, fused_loss = _train(steps, batch, device, fused=True)
    print(f"  plain transformers   step {plain_ms:8.2f} ms  final loss {plain_loss:.6f}")
    print(
        f"  fusedops swin hook   step {fused_ms:8.2f} ms  final loss {fused_loss:.6f}  "
        f"|diff| {abs(fused_loss - plain_loss):.2e}"
    )
    # the hook's attention is window_attention where it takes the call, else the products
    # around swin_attention_softmax (attention weights asked for, dropout, other sizes)
    ops = ("window_partition_roll", "window_reverse_roll", "window_attention")
    for op in (*ops, "swin_attention_softmax"):
        print(f"  {op:<24} ran on {dispatch.last_used.get(op, 'nothing (not called)')}")

"""One module per op: input checks, the torch.library custom op, autograd, reference."""

import importlib

#: Every op module; importing one registers its op with the dispatcher.
OP_MODULES = (
    "quick_gelu",
    "layer_norm",
    "adam",
    "bias_dropout_add",
    "window_attention",
    "window_process",
    "swin_softmax",
    "nms",
    "deform_conv2d",
)


def load_all() -> None:
    """Import every op module so all ops are registered (for ``info`` and the demo)."""
    for name in OP_MODULES:
        importlib.import_module(f"fusedops.ops.{name}")

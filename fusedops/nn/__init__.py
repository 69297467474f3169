"""Drop-in modules: subclasses of the torch modules they replace, running fused ops."""

from fusedops.nn.bias_dropout_add import (
    BiasDropoutAdd,
    dropout_add_fused,
    dropout_add_fused_train,
)
from fusedops.nn.dcn import DCN, DCNv2
from fusedops.nn.layer_norm import LayerNorm, RMSNorm
from fusedops.nn.quick_gelu import QuickGELU
from fusedops.nn.swin import FusedSwinFmha, WindowProcess, WindowProcessReverse

__all__ = [
    "BiasDropoutAdd",
    "DCN",
    "DCNv2",
    "FusedSwinFmha",
    "LayerNorm",
    "QuickGELU",
    "RMSNorm",
    "WindowProcess",
    "WindowProcessReverse",
    "dropout_add_fused",
    "dropout_add_fused_train",
]

"""Drop-in modules: subclasses of the torch modules they replace, running fused ops."""

from fusedops.nn.bias_dropout_add import (
    BiasDropoutAdd,
    dropout_add_fused,
    dropout_add_fused_train,
)
from fusedops.nn.layer_norm import LayerNorm, RMSNorm
from fusedops.nn.quick_gelu import QuickGELU

__all__ = [
    "BiasDropoutAdd",
    "LayerNorm",
    "QuickGELU",
    "RMSNorm",
    "dropout_add_fused",
    "dropout_add_fused_train",
]

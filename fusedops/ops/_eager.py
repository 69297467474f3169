"""When an op may bypass torch.library's custom-op machinery.

Each op is a ``torch.library.custom_op`` (so torch.compile, torch.export and tensor subclasses
see one opaque node with a fake implementation) and also a ``torch.autograd.Function`` calling
the same forward/backward bodies. In plain eager execution the custom op's Python wrappers
(autograd registration, redispatch, the Dynamo-disable guard) cost about 100 us a call on a
fast host, more than a LayerNorm kernel on small rows takes on an H100; the autograd.Function
costs a few microseconds. ``eager_fast_path`` says when the Function may be used: no
compile/export tracing, no ``torch.jit.trace`` (which would record the Function as a Python call
that ``torch.jit.save`` cannot serialise; the custom op is recorded as ``fusedops::<op>``), no
functorch transform, no dispatch or function mode, and plain tensors only. Both paths run the
same code, so results are identical.

LayerNorm/RMSNorm on the CUDA backend go one step further in eager mode: one call into the
extension, whose op records a C++ autograd node (layer_norm_bindings.cpp, NormFunction), so neither
direction runs Python per call beyond the argument checks.
"""

from __future__ import annotations

import torch
from torch._C import (
    _are_functorch_transforms_active,
    _is_torch_function_mode_enabled,
    _is_tracing,
    _len_torch_dispatch_stack,
)

#: Tensor types that are not subclasses (the fast paths take these only).
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def eager_fast_path(*tensors: torch.Tensor | None) -> bool:
    """True when the op may call its autograd.Function directly instead of the custom op."""
    # torch._C's checks directly, where torch's Python helpers add frames per call:
    # jit.is_tracing() is _is_tracing() outside TorchScript, _get_current_dispatch_mode() is
    # None when the dispatch-mode stack is empty
    if torch.compiler.is_compiling() or _is_tracing():
        return False
    for t in tensors:
        if t is not None and type(t) not in PLAIN_TENSOR_TYPES:
            return False
    return (
        not _len_torch_dispatch_stack()
        and not _is_torch_function_mode_enabled()
        and not _are_functorch_transforms_active()
    )

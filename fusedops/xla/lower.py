"""The lowering table, loaded: every core ATen op's lowering (``lower_pointwise``,
``lower_reduce``, ``lower_shape``, ``lower_nn``, ``lower_pool``, ``lower_linalg``) and every
fusedops op's (``fusedops/xla/fused/<op>.py``) registered in ``LOWERINGS``. The registry and
its helpers live in ``lower_table`` (see there for the table's contract); their names are
re-exported here for the bridge and the tests.

Importing this module imports jax; ``fusedops.xla`` imports it lazily.
"""

from __future__ import annotations

# The table itself: each module registers its ops on import.
from fusedops.xla import (  # noqa: E402, F401
    lower_linalg,
    lower_nn,
    lower_pointwise,
    lower_pool,
    lower_reduce,
    lower_shape,
)
from fusedops.xla.lower_table import (  # noqa: F401  (re-exported)
    FUNCTIONALIZED,
    LOWERINGS,
    MUTATES,
    NEEDS_KEY,
    NEEDS_META,
    SKIPPED_EFFECTS,
    WITH_EFFECTS,
    aten,
    call_functionalized,
    compute_dtype,
    jax_dtype,
    node_supported,
    node_target,
    on_cpu,
    op_names,
    register,
    supported,
    upcast,
)


def _load_fusedops_lowerings() -> None:
    """Register the lowering of every fusedops op (``fusedops/xla/fused/<op>.py``, docs/contract.md,
    "The XLA lowering contract"); importing an op's module first defines its
    ``torch.ops.fusedops`` ops."""
    import importlib
    import importlib.util

    from fusedops import ops

    for name in ops.OP_MODULES:
        importlib.import_module(f"fusedops.ops.{name}")
        module = f"fusedops.xla.fused.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


_load_fusedops_lowerings()

# functionalization with views removed (``remove="mutations_and_views"``) emits *_copy ops
for _view_op, _copy_op in (
    (aten.view.default, aten.view_copy.default),
    (aten.permute.default, aten.permute_copy.default),
    (aten.expand.default, aten.expand_copy.default),
    (aten.t.default, aten.t_copy.default),
    (aten.transpose.int, aten.transpose_copy.int),
    (aten.unsqueeze.default, aten.unsqueeze_copy.default),
    (aten.squeeze.default, aten.squeeze_copy.default),
    (aten.squeeze.dim, aten.squeeze_copy.dim),
    (aten.squeeze.dims, aten.squeeze_copy.dims),
    (aten.slice.Tensor, aten.slice_copy.Tensor),
    (aten.select.int, aten.select_copy.int),
    (aten.alias.default, aten.alias_copy.default),
    (aten.detach.default, aten.detach_copy.default),
    (aten.split.Tensor, aten.split_copy.Tensor),
    (aten.split_with_sizes.default, aten.split_with_sizes_copy.default),
    (aten.unbind.int, aten.unbind_copy.int),
    (aten.as_strided.default, aten.as_strided_copy.default),
    (aten.view_as_real.default, aten.view_as_real_copy.default),
    (aten.view_as_complex.default, aten.view_as_complex_copy.default),
    (aten._conj.default, aten._conj_copy.default),
    (aten.diagonal.default, aten.diagonal_copy.default),
    (aten.unfold.default, aten.unfold_copy.default),
):
    register(_copy_op, meta=_view_op in NEEDS_META)(LOWERINGS[_view_op])

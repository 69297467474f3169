"""The lowering table: core ATen ops -> jax.numpy / jax.lax, one small function per op.

``LOWERINGS[op]`` takes the op's ATen arguments with tensors replaced by ``jax.Array`` and returns
what the op returns (an array, or a tuple of arrays). Ops that need the shape/dtype of their
result (factories, ``as_strided``...) are marked ``needs_meta`` and get ``meta=`` (the FX node's
FakeTensor value). Ops that draw random numbers get ``key=`` (a ``jax.random`` key). Ops that
write their arguments in place (fusedops' ``adam_step``) are marked ``mutates``: their lowering
takes the op's arguments and returns ``{argument name: new value}`` for what it writes, and runs
for the ``auto_functionalized`` nodes functionalization turns their calls into
(:func:`call_functionalized`). Backward ops are ``jax.vjp`` of the forward lowering wherever that
is exact. The lowerings live in ``lower_pointwise``, ``lower_reduce``, ``lower_shape``,
``lower_nn``, ``lower_pool`` and ``lower_linalg``; fusedops' own ops' in
``fusedops/xla/fused/<op>.py``. This module holds the registry and the helpers they share;
``fusedops.xla.lower`` loads them all (the lowering modules import this one, never that one,
so no module imports itself back).

Importing this module imports jax; ``fusedops.xla`` imports it lazily.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.errors import XLATraceError

aten = torch.ops.aten
prims = torch.ops.prims

LOWERINGS: dict[object, Callable] = {}
NEEDS_META: set[object] = set()
NEEDS_KEY: set[object] = set()
MUTATES: set[object] = set()

_DTYPES = {
    torch.float64: jnp.float64,
    torch.float32: jnp.float32,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.complex32: jnp.complex64,  # JAX has none: computed in complex64, returned as complex32
}


def jax_dtype(dtype: torch.dtype):
    """The jax dtype for a torch dtype (KeyError for ones XLA cannot hold)."""
    return _DTYPES[dtype]


def register(*ops, meta: bool = False, key: bool = False, mutates: bool = False):
    """Decorator: register ``fn`` as the lowering of every op in ``ops``."""

    def wrap(fn):
        for op in ops:
            LOWERINGS[op] = fn
            if meta:
                NEEDS_META.add(op)
            if key:
                NEEDS_KEY.add(op)
            if mutates:
                MUTATES.add(op)
        return fn

    return wrap


#: The higher-order ops functionalization wraps a call of an in-place (mutating) op in.
FUNCTIONALIZED = (
    torch.ops.higher_order.auto_functionalized,
    torch.ops.higher_order.auto_functionalized_v2,
)


def supported(op) -> bool:
    """Whether ``op`` (an OpOverload or ``operator.getitem``) has a lowering."""
    return op in LOWERINGS or op is operator.getitem


#: The higher-order op that threads an effect token through ops with side effects.
WITH_EFFECTS = torch.ops.higher_order.with_effects

#: Side-effect-only ops a program leaves out: ATen's error checks of linalg results (XLA has no
#: error channel; a singular matrix gives inf/nan, as ATen's ``*_ex`` ops without checks).
SKIPPED_EFFECTS = {torch.ops.aten._linalg_check_errors.default}


def node_target(node):
    """The op an FX node runs: the wrapped op of an ``auto_functionalized`` or
    ``with_effects`` node, else its target."""
    if node.target in FUNCTIONALIZED and node.args:
        return node.args[0]
    if node.target is WITH_EFFECTS and len(node.args) > 1:
        return node.args[1]
    return node.target


def node_supported(node) -> bool:
    """Whether the FX ``call_function`` node has a lowering (a functionalized in-place op
    needs one marked ``mutates``; an effectful op must be one a program may skip)."""
    if node.target in FUNCTIONALIZED:
        return node_target(node) in MUTATES
    if node.target is WITH_EFFECTS:
        return node_target(node) in SKIPPED_EFFECTS
    return supported(node.target)


def call_functionalized(target, args, kwargs):
    """Run an ``auto_functionalized`` / ``auto_functionalized_v2`` node (``target``) on jax
    arrays: the wrapped op's ``mutates`` lowering, then what the node returns: the op's result
    (None for ops returning nothing) followed by the new value of each mutated argument (v1)
    or of each base tensor (v2)."""
    from torch._higher_order_ops import auto_functionalize as af

    op = args[0]
    kwargs = dict(kwargs)
    names, types = af.get_mutable_args(op)
    if target is torch.ops.higher_order.auto_functionalized:
        written = LOWERINGS[op](**kwargs)
        return (None, *[written.get(n, kwargs[n]) for n in names])
    bases = list(kwargs.pop("_all_bases"))
    views = af.read_view_information_from_args(names, types, kwargs, bases)
    for name in names:
        info = views[name]
        infos = info if isinstance(info, list) else [info]
        for each in infos:
            if each is not None and not isinstance(each, (af.NotView, af.AliasViewInfo)):
                raise XLATraceError(
                    f"{op} writes to a view ({type(each).__name__}) of a tensor; pass it "
                    "whole tensors (no slices or strided views)"
                )
        pick = lambda v: None if v is None else bases[v.base_index]  # noqa: E731
        kwargs[name] = [pick(v) for v in info] if isinstance(info, list) else pick(info)
    written = LOWERINGS[op](**kwargs)
    for name in names:
        info, value = views[name], written.get(name)
        if value is None:
            continue
        pairs = zip(info, value) if isinstance(info, list) else [(info, value)]
        for view, new in pairs:
            if view is not None:
                bases[view.base_index] = new.astype(bases[view.base_index].dtype)
    return (None, *bases)


def _dims(dim, ndim: int) -> tuple[int, ...]:
    """A reduction's axes: ``dim`` None or empty means all; a 0-dim tensor has none (torch
    takes dim 0 / -1 there and reduces nothing)."""
    if ndim == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(d % ndim for d in dim)


def _axis(dim: int, ndim: int) -> int | None:
    """One axis ``dim`` normalised, or None for a 0-dim tensor (torch's dim 0 / -1 there)."""
    return None if ndim == 0 else dim % ndim


def on_cpu() -> bool:
    """Whether the program being traced runs on the CPU (``JaxProgram`` traces inside
    ``jax.default_device(<its device>)``). Lowerings use it to pick the form XLA:CPU runs fast
    where it differs from what suits a GPU."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend() == "cpu"
    return getattr(device, "platform", device) == "cpu"


def upcast(x):
    """``x`` in fp32 when it is 16-bit float (fusedops' kernels compute in fp32), else as is."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


def compute_dtype(*dtypes):
    """fusedops' compute dtype (``fusedops.ops._dtypes``) for jax ``dtypes`` (None ignored):
    float64 when any is float64, else float32."""
    wide = any(d is not None and jnp.dtype(d) == jnp.float64 for d in dtypes)
    return jnp.float64 if wide else jnp.float32


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


_HIGHEST = lax.Precision.HIGHEST


def op_names(ops: Sequence[object]) -> list[str]:
    """Readable names (``aten.foo.default``) for a list of ops."""
    return sorted({str(op) for op in ops})

"""The op contract's wiring, written once (docs/contract.md, "What an op module declares").

``define_op`` takes an op's bodies (plain functions with annotated signatures) and does what
every op needs around them:

- ``torch.library.custom_op("fusedops::<name>")`` with its fake, and, when the op has a
  backward, ``fusedops::<name>_backward`` with its fake and ``register_autograd`` tying the two
  together, so the op is one opaque node under torch.compile (no graph break) and torch.export;
- an eager ``torch.autograd.Function`` running the same bodies without the custom op's Python
  wrappers (ops/_eager.py says when that is allowed and why it pays);
- a callable (``FusedOp``) that picks between the two on each call.

The autograd rule is written once, as two functions shared by both paths::

    setup_context(ctx, inputs, output)        # save what the backward needs on ctx
    grads(ctx, backward, *grad_outputs)       # -> one gradient (or None) per forward input

``backward`` is the backward op on the custom-op path and its body on the eager path, so the
rule never branches on which path it runs in.

The XLA lowering of each op (docs/contract.md, "The XLA lowering contract") lives in
``kernels/xla/<op>.py`` under the op's own name, beside its Triton and CUDA kernels;
``fusedops.xla.lower`` registers every module listed in ``ops.OP_MODULES``, and
``tests/xla/test_fusedops_lowerings.py`` checks that every ``fusedops::`` op has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from fusedops.ops._eager import eager_fast_path


@dataclass(frozen=True)
class FusedOp:
    """One op wired into torch: ``op`` (the custom op), ``backward_op`` (or None) and
    ``function`` (the eager autograd.Function, or None for ops without a backward).

    Calling it runs ``function.apply`` where the eager fast path is allowed for these tensors,
    else the custom op. Arguments are the forward body's, positionally."""

    name: str
    op: Any
    backward_op: Any | None
    function: type[torch.autograd.Function] | None
    forward_body: Callable

    def __call__(self, *args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if eager_fast_path(*tensors):
            if self.function is not None:
                return self.function.apply(*args)
            with torch.no_grad():  # not differentiable: as the custom op, no graph recorded
                return self.forward_body(*args)
        return self.op(*args)


def define_op(
    name: str,
    *,
    forward: Callable,
    fake: Callable,
    backward: Callable | None = None,
    backward_fake: Callable | None = None,
    setup_context: Callable | None = None,
    grads: Callable | None = None,
) -> FusedOp:
    """Register ``fusedops::<name>`` (and ``fusedops::<name>_backward``) and return the op.

    forward, backward: the bodies, annotated so torch.library can infer their schemas (tensors,
    ``Tensor | None``, floats, ints, bools, ``str | None``...); they must not mutate their inputs.
    fake, backward_fake: their fake (meta) implementations, same arguments.
    setup_context(ctx, inputs, output): save what the backward needs (as for
    ``register_autograd``); grads(ctx, backward, *grad_outputs) -> a tuple with one gradient or
    None per forward argument, computed by calling ``backward(...)``.
    An op without ``backward`` is not differentiable (e.g. NMS): no autograd is registered.
    """
    if (backward is None) != (grads is None) or (backward is None) != (setup_context is None):
        raise ValueError(f"define_op({name!r}): backward, setup_context and grads go together")
    op = torch.library.custom_op(f"fusedops::{name}", forward, mutates_args=())
    op.register_fake(fake)
    if backward is None:
        return FusedOp(name, op, None, None, forward)
    if backward_fake is None:
        raise ValueError(f"define_op({name!r}): backward needs backward_fake")
    backward_op = torch.library.custom_op(f"fusedops::{name}_backward", backward, mutates_args=())
    backward_op.register_fake(backward_fake)
    op.register_autograd(
        lambda ctx, *grad_outputs: grads(ctx, backward_op, *grad_outputs),
        setup_context=setup_context,
    )

    class Function(torch.autograd.Function):
        # Classic ``forward(ctx, ...)``: a separate setup_context staticmethod would make
        # ``apply`` bind its arguments through inspect.signature on every call.
        @staticmethod
        def forward(ctx, *args):
            output = forward(*args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        @once_differentiable
        def backward(ctx, *grad_outputs):
            return grads(ctx, backward, *grad_outputs)

    Function.__name__ = Function.__qualname__ = f"{_camel(name)}Function"
    return FusedOp(name, op, backward_op, Function, forward)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))

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
    grads(ctx, backward, *grad_outputs)       # -> the gradients of the leading forward inputs

``backward`` is the backward op on the custom-op path and its body on the eager path, so the
rule never branches on which path it runs in. What every op's rule would repeat is done here:

- ``ctx.backend = dispatch.requested(backend)`` before ``setup_context`` runs, so an explicit
  choice made around the forward (``use_backend``, the environment) also holds for the backward;
- a backward body may return None for an absent gradient (no bias...), as the backends do: the
  custom op, which returns tensors only, carries it as an empty tensor (its fake too);
- the gradients ``grads`` returns become one per forward input: None for the inputs after the
  last one it gives, and None wherever an input needs no gradient (``ctx.needs_input_grad``:
  non-tensor arguments, absent tensors, tensors not requiring grad), which is where the empty
  tensors standing for absent gradients land.

Two extensions serve ops that do more than that:

- ``eager``: the op's own eager fast path (LayerNorm: torch's op on the native backend, the
  CUDA extension's C++ autograd op), asked first in plain eager mode;
- ``reshape``: the op is called with its callers' shapes and its bodies take others (LayerNorm:
  x ``(..., *normalized_shape)`` and parameters of ``normalized_shape`` as rows ``(M, N)`` and
  ``(N,)``); the eager Function reshapes inside, where autograd records no view nodes.

An op that writes its inputs (``adam_step``) passes ``mutates_args`` and no backward. An op
module that names its bodies by the convention of ``BODY_NAMES`` (``_forward``,
``_forward_fake``, ``_backward_body``...) passes them all at once: ``define_module_op(name,
globals())``.

The XLA lowering of each op (docs/contract.md, "The XLA lowering contract") lives in
``fusedops/xla/fused/<op>.py`` under the op's own name (above the op: it imports the lowering
registry of ``fusedops.xla``, so it does not sit with the Triton and CUDA kernels);
``fusedops.xla.lower`` registers every module listed in ``ops.OP_MODULES``, and
``tests/xla/test_fusedops_lowerings.py`` checks that every ``fusedops::`` op has one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._functorch import unwrap_if_dead as _unwrap_if_dead
from torch.autograd.function import once_differentiable

from fusedops import dispatch
from fusedops.ops._eager import PLAIN_TENSOR_TYPES, eager_fast_path


@dataclass(frozen=True)
class FusedOp:
    """One op wired into torch: ``op`` (the custom op), ``backward_op`` (or None) and
    ``function`` (the eager autograd.Function, or None for ops without a backward).

    Calling it, in plain eager mode (ops/_eager.py): ``eager(*args)`` where the op has that
    hook and it returns a result, else ``function.apply`` (an op without a backward: its body,
    recording no graph); elsewhere the custom op. Arguments are the forward body's, positionally
    (with ``reshape``: the callers' arguments it takes)."""

    name: str
    op: Any
    backward_op: Any | None
    function: type[torch.autograd.Function] | None
    forward_body: Callable
    eager: Callable | None = None
    reshape: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        return self.call(args, _plain(args) and eager_fast_path())

    def call(self, args: Sequence[Any], eager: bool) -> Any:
        """``self(*args)`` where the caller knows whether plain eager mode holds: ``eager``
        is ``eager_fast_path(<the tensors among args>)`` (a public function that has checked
        its tensors asks that, cheaper than ``__call__``'s scan of every argument)."""
        if eager:
            if self.eager is not None:
                result = self.eager(*args)
                if result is not None:
                    return result
            if self.function is not None:
                return apply_function(self.function, args)
            if not torch.is_grad_enabled():
                return self.forward_body(*args)
            with torch.no_grad():  # not differentiable: as the custom op, no graph recorded
                return self.forward_body(*args)
        if self.reshape is None:
            return self.op(*args)
        return self.op(*self.reshape(*args))[0].view(args[0].shape)


_FUNCTION_APPLY = torch._C._FunctionBase.__dict__["apply"]  # the C classmethod


def apply_function(function: type[torch.autograd.Function], args: Sequence[Any]) -> Any:
    """``function.apply(*args)`` in plain eager mode (``eager_fast_path()`` true) without
    ``Function.apply``'s Python wrapper (about 1 us): with no functorch transform active and a
    classic ``forward(ctx, ...)`` (no ``setup_context``, so no argument binding) the wrapper
    does exactly this: dead functorch wrappers unwrapped, then the C ``apply``."""
    return _FUNCTION_APPLY.__get__(None, function)(
        *[_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a for a in args]
    )


def _plain(args: Sequence[Any]) -> bool:
    """True when the tensors among ``args`` (those in tensor lists included) are plain tensors
    (``eager_fast_path``'s rule, checked here without unpacking the lists)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in PLAIN_TENSOR_TYPES:
                return False
        elif isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            plain = _PLAIN_TYPES.issuperset(map(type, a))
            if not plain:
                return False
    return True


_PLAIN_TYPES = frozenset(PLAIN_TENSOR_TYPES)


def define_op(
    name: str,
    *,
    forward: Callable,
    fake: Callable,
    backward: Callable | None = None,
    backward_fake: Callable | None = None,
    setup_context: Callable | None = None,
    grads: Callable | None = None,
    mutates_args: Sequence[str] = (),
    eager: Callable | None = None,
    reshape: Callable | None = None,
) -> FusedOp:
    """Register ``fusedops::<name>`` (and ``fusedops::<name>_backward``) and return the op.

    forward, backward: the bodies, annotated so torch.library can infer their schemas (tensors,
    ``Tensor | None``, floats, ints, bools, ``str | None``...), taking ``backend`` (the
    dispatch choice); they must not mutate their inputs (but those named in ``mutates_args``,
    for an op without a backward). A backward body returns one tensor, or a tuple with None for
    an absent gradient. fake, backward_fake: their fake (meta) implementations, same arguments
    (None for an absent gradient as the body).
    setup_context(ctx, inputs, output): save what the backward needs (as for
    ``register_autograd``; ``ctx.backend`` is already set); grads(ctx, backward, *grad_outputs)
    -> the gradients of the forward inputs, in order (one tensor, or a tuple that may stop
    before the last input), computed by calling ``backward(...)``; by default
    ``backward(grad_outputs[0], *ctx.saved_tensors, ctx.backend)``.
    An op without ``backward`` is not differentiable (e.g. NMS, Adam): no autograd is registered.
    eager(*args) -> result or None: the op's own eager fast path, asked first in plain eager
    mode (None: not for these arguments).
    reshape(*args) -> the bodies' arguments: the op is called with the callers' arguments (the
    bodies' positions, maybe followed by extra ones ``reshape`` needs) and each tensor it returns
    is a reshape of the caller's tensor at its position; the call returns the forward's first
    output in the first argument's shape, its other outputs (statistics) stay inside.
    """
    if (backward is None) != (setup_context is None) or (backward is None and grads is not None):
        raise ValueError(f"define_op({name!r}): backward, setup_context and grads go together")
    if backward is not None and mutates_args:
        raise ValueError(f"define_op({name!r}): an op that mutates its inputs has no backward")
    if backward is None and reshape is not None:
        raise ValueError(f"define_op({name!r}): reshape needs a backward")
    op = torch.library.custom_op(f"fusedops::{name}", forward, mutates_args=tuple(mutates_args))
    op.register_fake(fake)
    if backward is None:
        return FusedOp(name, op, None, None, forward, eager)
    if backward_fake is None:
        raise ValueError(f"define_op({name!r}): backward needs backward_fake")
    backward_op = torch.library.custom_op(
        f"fusedops::{name}_backward",
        _tensors_only(backward),
        mutates_args=(),
        schema=torch.library.infer_schema(backward, mutates_args=()),
    )
    backward_op.register_fake(_tensors_only(backward_fake))
    setup = _with_backend(name, forward, setup_context)
    grads = grads or _saved_grads
    op.register_autograd(
        lambda ctx, *grad_outputs: _per_input(ctx, grads(ctx, backward_op, *grad_outputs)),
        setup_context=setup,
    )
    methods = _function if reshape is None else _reshaping_function
    # named at creation: autograd names the backward node after it (LayerNormFunctionBackward)
    function = type(
        f"{_camel(name)}Function",
        (torch.autograd.Function,),
        methods(forward, backward, setup, grads, reshape),
    )
    return FusedOp(name, op, backward_op, function, forward, eager, reshape)


#: The names an op module gives its bodies, by ``define_op`` keyword (``define_module_op``).
BODY_NAMES = {
    "forward": "_forward",
    "fake": "_forward_fake",
    "backward": "_backward_body",
    "backward_fake": "_backward_fake",
    "setup_context": "_setup_context",
    "grads": "_grads",
}


def define_module_op(name: str, namespace: Mapping[str, Any], **options: Any) -> FusedOp:
    """``define_op(name, ...)`` with the bodies an op module names by the convention of
    ``BODY_NAMES`` (``_forward``, ``_forward_fake``, ``_backward_body``, ``_backward_fake``,
    ``_setup_context``, ``_grads``; a name the module lacks: that keyword is absent), read from
    ``namespace`` (the module's ``globals()``); ``options``: define_op's other keywords."""
    bodies = {key: namespace[attr] for key, attr in BODY_NAMES.items() if attr in namespace}
    return define_op(name, **bodies, **options)


def _with_backend(name: str, forward: Callable, setup_context: Callable) -> Callable:
    """setup_context preceded by ``ctx.backend = dispatch.requested(backend)``."""
    parameters = list(inspect.signature(forward).parameters.values())
    names = [p.name for p in parameters]
    if "backend" not in names:
        raise ValueError(f"define_op({name!r}): the forward body takes no backend argument")
    index = names.index("backend")
    default = parameters[index].default
    default = None if default is inspect.Parameter.empty else default

    def setup(ctx, inputs, output):
        # An explicit choice made around the forward (use_backend, env) also holds for the
        # backward.
        ctx.backend = dispatch.requested(inputs[index] if index < len(inputs) else default)
        setup_context(ctx, inputs, output)

    return setup


def _saved_grads(ctx, backward, grad, *_):
    """grads' default: the backward of the first output's gradient and the saved tensors."""
    return backward(grad, *ctx.saved_tensors, ctx.backend)


def _tensors_only(body: Callable) -> Callable:
    """body with None outputs replaced by empty tensors: custom ops return tensors only, so an
    absent gradient travels as an empty tensor (of the first argument's dtype and device, the
    incoming gradient's); ``_per_input`` drops it again."""

    def run(*args, **kwargs):
        out = body(*args, **kwargs)
        if isinstance(out, tuple):
            out = tuple(args[0].new_empty((0,)) if g is None else g for g in out)
        return out

    return run


def _per_input(ctx, result) -> tuple:
    """One gradient per forward input: ``result``'s in order, None after its last and wherever
    the input needs none."""
    if not isinstance(result, tuple):
        result = (result,)
    given = len(result)
    return tuple(
        result[i] if need and i < given else None for i, need in enumerate(ctx.needs_input_grad)
    )


def _function(forward, backward, setup, grads, reshape) -> dict:
    """The eager Function's methods. Classic ``forward(ctx, ...)``: a separate setup_context
    staticmethod would make ``apply`` bind its arguments through inspect.signature on every
    call."""

    def function_forward(ctx, *args):
        output = forward(*args)
        setup(ctx, args, output)
        return output

    def body(ctx, *grad_outputs):
        return _per_input(ctx, grads(ctx, backward, *grad_outputs))

    return {
        "forward": staticmethod(function_forward),
        "backward": staticmethod(lean_once_differentiable(body)),
    }


def _reshaping_function(forward, backward, setup, grads, reshape) -> dict:
    """The methods of a Function taking the callers' tensors and returning the forward's first
    output only: the reshapes happen inside, where autograd records no view nodes, and the
    other outputs need no zero gradients."""

    def function_forward(ctx, *args):
        inputs = reshape(*args)
        output = forward(*inputs)
        setup(ctx, inputs, output)
        ctx.shapes = [a.shape if isinstance(a, torch.Tensor) else None for a in args]
        y, shape = output[0], args[0].shape
        ctx.body_shape, ctx.outputs = y.shape, len(output)
        if y.shape == shape and y._base is None:  # rows in, rows out: y is returned as it is
            return y
        # a tensor of its own: a view returned from a Function's forward could not be modified
        # in place later (relu_); _unsafe_view shares the storage without being a view to
        # autograd
        return torch.ops.aten._unsafe_view(y, shape)

    def body(ctx, grad):
        shape = ctx.body_shape
        grad_outputs = (grad if grad.shape == shape else grad.reshape(shape),)
        grad_outputs += (None,) * (ctx.outputs - 1)
        result = _per_input(ctx, grads(ctx, backward, *grad_outputs))
        # a view only where the shape changes (a view costs 1-3 us; the caller's 2-D x and
        # 1-D parameters are the bodies' shapes)
        return tuple(
            g if g is None or g.shape == s else g.view(s) for g, s in zip(result, ctx.shapes)
        )

    return {
        "forward": staticmethod(function_forward),
        "backward": staticmethod(lean_once_differentiable(body)),
    }


def lean_once_differentiable(body: Callable) -> Callable:
    """``once_differentiable(body)`` without its per-call cost where it changes nothing: the
    autograd engine runs a backward with grad mode off unless ``create_graph=True``, and then
    torch's wrapper adds only a ``no_grad`` block around a body already running without grad.
    With grad mode on (``create_graph=True``) torch's wrapper runs: the body without grad and
    outputs that raise if differentiated again."""
    wrapped = once_differentiable(body)

    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            return wrapped(ctx, *grad_outputs)
        return body(ctx, *grad_outputs)

    return backward


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))

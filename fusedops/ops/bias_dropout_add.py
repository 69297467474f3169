"""Bias-dropout-add: ``residual + dropout(x + bias, p)`` in one pass, with no saved mask.

Shapes and dtypes: x (..., H) float16/bfloat16/float32 (float64 on the reference backend),
bias (H,) or None (a 0-d x takes no bias), residual broadcastable to x's shape. The output
has x's shape and residual's dtype: when x's dtype differs from residual's, x and bias are
converted to residual's dtype as Megatron does (an fp32 residual stream with bf16 x). Math
in fp32 (fp64 when any input is fp64), rounded once to the output dtype.

Design (docs/ops.md, "Bias-dropout-add"):

- The mask is Philox4x32-10 keyed by a ``seed`` tensor ``int64[2] = [key, offset]`` drawn with
  ``torch.randint`` from torch's generator (the default generator of x's device, or
  ``generator=``) on x's device. The draw advances the generator (by one small draw, not by
  the element count as torch's CUDA dropout does: nothing else reads that offset), so
  ``torch.manual_seed`` reproduces a run and two calls get different keys (hence different
  masks); no host synchronisation (kernels read the seed from device memory). Under
  torch.compile the draw is an ordinary random op of the graph (no graph break; aot_eager
  draws the eager seed, inductor its own RNG), and in an XLA region it is lowered like any
  ``aten.randint`` (fusedops/xla's key). Both values are drawn in [0, 2^62), so
  ``offset + i / 4`` never overflows int64.
- Element ``i`` (row-major index in x) takes word ``i % 4`` of Philox counter
  ``offset + i // 4`` (one Philox call per four elements, so the kernels stay memory-bound)
  and is kept iff that word is ``>= floor(p * 2^32)``. The reference
  (``kernels/shared/philox.py``, int64 arithmetic), Triton (``tl.randint4x``), CUDA and XLA
  compute the same words, so every backend keeps the same elements for the same seed: a GPU
  run's mask can be reproduced on a CPU.
- Kept elements are scaled by ``1 / (1 - p)``; dropped ones are 0 even where x is inf/NaN
  (a select, not a multiply by the mask). p = 0 (or ``training=False``) draws nothing and
  returns x + bias + residual; p = 1 draws nothing and returns residual (grad_x is 0).
- The backward regenerates the mask from the saved seed (nothing else is saved): grad_x =
  dropout(grad), grad_bias = sum of it over the leading dims in fp32 (per-program partial sums,
  then one fixed-order reduction; the same bits every run), grad_residual = grad (summed by
  autograd over residual's broadcast dims).
- A residual that broadcasts is expanded to x's shape (one copy) before the fused op; inputs
  are made contiguous.

- The native backend (the automatic pick on CPU and where no GPU-verified kernel runs) draws
  ``native_drop_mask``: on CPU tensors torch's uniform numbers below p, from a generator
  seeded with the seed's key, unless ``portable_mask=True`` / ``FUSEDOPS_PORTABLE_DROPOUT=1``
  asks for the Philox mask; on other devices (CUDA) always the Philox words, the kernels' mask
  bit for bit (a torch generator seeded from the seed tensor would need a host sync), so there
  ``portable_mask`` changes nothing. (Not torch's CUDA dropout stream, which keys Philox with
  the generator's own seed and offset: this key is a ``torch.randint`` draw.) In eager mode it
  runs with torch's autograd (the mask is kept, one byte an element); the custom ops
  (torch.compile, export) regenerate the same mask from the seed. The custom ops take
  ``portable`` after ``backend`` (the XLA lowering always computes the Philox mask). When x,
  bias and residual share a 16-bit dtype, native computes in it, rounding after each op as the
  torch code the op replaces (``residual + dropout(x + bias)``) does; mixed or fp32 inputs
  compute in fp32.

Every backend exposes ``forward(x, bias, residual, seed, p) -> out`` on contiguous x, bias (H,)
or None, residual of x's shape, and ``backward(grad, seed, p, x_dtype, bias_dtype) ->
(grad_x, grad_bias or None)``.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.kernels.device import same_device
from fusedops.kernels.shared import philox
from fusedops.ops._checks import check_same_device, check_tensor
from fusedops.ops._define import define_module_op
from fusedops.ops._dtypes import as_dtype, compute_dtype
from fusedops.ops._eager import eager_fast_path

__all__ = ["bias_dropout_add", "bias_dropout_add_fused_train", "bias_dropout_add_fused_inference"]

NAME = "bias_dropout_add"
#: Seed and offset are drawn in [0, SEED_BOUND).
SEED_BOUND = 2**62

# ------------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch): the CPU path and the test oracle.


def keep_mask(seed: torch.Tensor, p: float, n: int) -> torch.Tensor:
    """The dropout keep-mask (bool, n elements) of a call with ``seed`` and 0 < p < 1: element i
    is kept iff word ``i % 4`` of Philox counter ``offset + i // 4`` is ``>= floor(p 2^32)``."""
    counters = torch.arange(-(-n // 4), dtype=torch.int64, device=seed.device)
    words = philox.dropout_words(seed, counters, n, torch.stack)
    return words >= philox.keep_threshold(p)


def _dropout(v: torch.Tensor, seed: torch.Tensor | None, p: float) -> torch.Tensor:
    mode = philox.dropout_mode(p, seed is not None)
    if mode == philox.KEEP:
        return v
    if mode == philox.DROP:
        return torch.zeros_like(v)
    keep = keep_mask(seed, p, v.numel()).view(v.shape)
    return torch.where(keep, v * philox.dropout_scale(p), v.new_zeros(()))


def _forward_with(dropout, x, bias, residual, seed, p, rule=compute_dtype):
    compute = rule(x.dtype, residual.dtype, None if bias is None else bias.dtype)
    v = x.to(compute)
    if bias is not None:
        v = v + bias.to(compute)
    return (residual.to(compute) + dropout(v, seed, p)).to(residual.dtype)


def _backward_with(dropout, grad, seed, p, x_dtype, bias_dtype, rule=compute_dtype):
    g = dropout(grad.to(rule(grad.dtype, x_dtype, bias_dtype)), seed, p)
    grad_bias = None
    if bias_dtype is not None:
        width = grad.shape[-1] if grad.dim() else 1
        grad_bias = g.reshape(math.prod(grad.shape[:-1]), width).sum(0).to(bias_dtype)
    return g.to(x_dtype, copy=True), grad_bias


reference = SimpleNamespace(
    forward=functools.partial(_forward_with, _dropout),
    backward=functools.partial(_backward_with, _dropout),
)

# ------------------------------------------------------------------------------------------
# Native implementation: on CPU tensors torch's own random numbers instead of the Philox words
# (the default; ``portable_mask`` keeps the Philox mask). The mask is a function of the op's
# seed: on a CPU tensor torch's uniform draws below p, from a CPU generator seeded with the
# seed's key (reading it is free there); on other devices the Philox words (no host sync),
# whatever ``portable_mask`` says. Eager calls build the same mask and let torch's autograd keep it
# (``_native_eager``); the custom ops regenerate it in the backward.


def native_drop_mask(seed: torch.Tensor, p: float, shape) -> torch.Tensor:
    """The native backend's drop-mask (bool, ``shape``; True: dropped) for ``seed`` (int64[2])
    and 0 < p < 1: on the CPU ``torch.rand(shape) < p`` from a CPU generator seeded with the
    seed's key; on other devices the Philox words of ``keep_mask`` negated, the portable mask
    itself (seeding a generator would read the seed on the host, a synchronisation)."""
    if seed.device.type != "cpu":
        return keep_mask(seed, p, math.prod(shape)).view(shape).logical_not_()
    generator = _mask_generator().manual_seed(seed.tolist()[0])
    # uniform draws below p: P(dropped) = p, as bernoulli_(p), whose CPU kernel took 1.8x as
    # long (5.8 against 3.2 ms at (32, 65, 384), 2 threads)
    return torch.rand(shape, generator=generator) < p


_thread = threading.local()


def _mask_generator() -> torch.Generator:
    """This thread's CPU generator for native masks (reseeded at every use: ``manual_seed``
    resets all of its state), made once instead of per call (about 1 us)."""
    generator = getattr(_thread, "generator", None)
    if generator is None:
        generator = _thread.generator = torch.Generator()
    return generator


def _native_dropout(v: torch.Tensor, seed: torch.Tensor | None, p: float) -> torch.Tensor:
    if philox.dropout_mode(p, seed is not None) != philox.RANDOM:
        return _dropout(v, seed, p)
    return torch.where(native_drop_mask(seed, p, v.shape), 0.0, v * philox.dropout_scale(p))


def _native_compute(*dtypes: torch.dtype | None) -> torch.dtype:
    """The native backend's compute dtype: the inputs' own 16-bit dtype when they all share it
    (``residual + dropout(x + bias)`` in that dtype, rounding after each op as the torch code the
    op replaces does), else the kernels' rule (fp32, fp64 for fp64 inputs)."""
    given = {d for d in dtypes if d is not None}
    if len(given) == 1 and given <= {torch.float16, torch.bfloat16}:
        return given.pop()
    return compute_dtype(*dtypes)


native = SimpleNamespace(
    forward=functools.partial(_forward_with, _native_dropout, rule=_native_compute),
    backward=functools.partial(_backward_with, _native_dropout, rule=_native_compute),
)


def _native_eager(x, bias, residual, seed, p):
    """The native op with torch's autograd (eager mode; form (b)): the mask is kept by autograd
    (one byte an element) instead of regenerated. x contiguous, bias (H,) or None, residual
    broadcastable to x; p < 1 (p = 1 goes through the op: its gradient of x is zeros, not None).
    The same roundings as the custom op's native namespace (so compiled and eager code agree
    bit for bit)."""
    compute = _native_compute(x.dtype, residual.dtype, None if bias is None else bias.dtype)
    v = as_dtype(x, compute)
    if bias is not None:
        v = v + as_dtype(bias, compute)
    if seed is not None:
        # where(mask, 0, v * scale): masked_fill takes the scalar without making a tensor of
        # it (same values and gradient as torch.where)
        scaled = v * philox.dropout_scale(p)
        v = scaled.masked_fill(native_drop_mask(seed, p, x.shape), 0.0)
    return as_dtype(as_dtype(residual, compute) + v, residual.dtype)


def unsupported_reasons(backend: str, main, residual=None, bias=None) -> list[str]:
    """Why ``backend`` cannot take these tensors (empty list: it can).

    main: x ``(..., H)`` or the gradient (its dtype is dispatch's to check); residual, bias:
    the forward's, or None. The kernels compute in fp32: a residual or bias outside
    float32/float16/bfloat16 (an fp64 one means fp64 math) goes to the native backend or the
    reference, which take any float dtype.
    """
    if not dispatch.is_kernel(backend):
        return []
    return [
        f"{name} has dtype {t.dtype} (the kernels take float32, float16 or bfloat16)"
        for name, t in (("residual", residual), ("bias", bias))
        if t is not None and t.dtype not in dispatch.KERNEL_DTYPES
    ]


def _kernel_dtypes(*dtypes: torch.dtype | None) -> bool:
    return all(d is None or d in dispatch.KERNEL_DTYPES for d in dtypes)


dispatch.register_op(
    NAME,
    reference,
    kernels="bias_dropout_add",
    unsupported_reasons=unsupported_reasons,
    native=native,
)

# ------------------------------------------------------------------------------------------
# The custom ops: x contiguous, bias (H,) or None, residual contiguous of x's shape, seed
# int64[2] or None (p = 0 or 1), p in [0, 1].


def _forward(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    seed: torch.Tensor | None,
    p: float,
    backend: str | None = None,
    portable: bool = True,
) -> torch.Tensor:
    impl = _mask_source(dispatch.select(NAME, x, residual, bias, backend=backend), portable)
    return impl.forward(x, bias, residual, seed, p)


def _mask_source(impl, portable: bool):
    """The implementation to run: the native backend's Philox twin (the reference's
    arithmetic) where the portable mask is asked for."""
    return reference if portable and impl is native else impl


def _forward_fake(x, bias, residual, seed, p, backend=None, portable=True):
    return torch.empty_like(x, dtype=residual.dtype, memory_format=torch.contiguous_format)


def _backward_body(
    grad: torch.Tensor,
    seed: torch.Tensor | None,
    p: float,
    x_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    backend: str | None = None,
    portable: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    # x's and bias's dtypes decide as much as grad's (their gradients are written in them): a
    # float64 x or bias ran its forward on the reference (fp64 math), and so does its backward
    # (the same mask on every backend).
    if _kernel_dtypes(x_dtype, bias_dtype) or dispatch.requested(backend) is not None:
        impl = _mask_source(dispatch.select(NAME, grad, backend=backend), portable)
    elif portable:
        impl = reference
    else:
        impl = native
    return impl.backward(grad.contiguous(), seed, p, x_dtype, bias_dtype)


def _backward_fake(grad, seed, p, x_dtype, bias_dtype, backend=None, portable=True):
    grad_x = torch.empty_like(grad, dtype=x_dtype, memory_format=torch.contiguous_format)
    if bias_dtype is None:
        return grad_x, None
    return grad_x, grad.new_empty((grad.shape[-1] if grad.dim() else 1,), dtype=bias_dtype)


def _setup_context(ctx, inputs, output):
    x, bias, _, seed, p, _, portable = inputs
    ctx.save_for_backward(seed)
    ctx.p = p
    ctx.portable = portable
    ctx.x_dtype = x.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _grads(ctx, backward, grad):
    (seed,) = ctx.saved_tensors
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
        grad_x, grad_bias = backward(
            grad, seed, ctx.p, ctx.x_dtype, ctx.bias_dtype, ctx.backend, ctx.portable
        )
    return grad_x, grad_bias, grad


BIAS_DROPOUT_ADD = define_module_op(NAME, globals())

# ------------------------------------------------------------------------------------------
# Public functions


def _check_probability(p, name: str) -> float:
    # a float first: isinstance against the numbers.Real ABC costs about 0.3 us
    if type(p) is not float and (isinstance(p, bool) or not isinstance(p, numbers.Real)):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p <= 1.0:  # NaN fails too
        raise ValueError(f"{name} must be in [0, 1], got {p}")
    return p


def draw_seed(device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A fresh ``[key, offset]`` int64 tensor on ``device`` from ``generator`` (default: the
    device's default generator), advancing it; no host synchronisation."""
    return torch.randint(0, SEED_BOUND, (2,), dtype=torch.int64, device=device, generator=generator)


def portable_mask_default() -> bool:
    """Whether calls that do not say ``portable_mask=`` use the Philox mask on every backend:
    ``FUSEDOPS_PORTABLE_DROPOUT=1``."""
    return dispatch.getenv("FUSEDOPS_PORTABLE_DROPOUT", "0").strip() == "1"


def _broadcast(a, b):
    """``torch.broadcast_shapes(a, b)``, or None where they do not broadcast (about 10 us a
    call: asked only where the shapes differ)."""
    try:
        return torch.broadcast_shapes(a, b)
    except RuntimeError:
        return None


def _bias_dropout_add(x, bias, residual, p, training, generator, backend, names, portable=None):
    x_name, bias_name, residual_name, p_name = names
    if portable is None:
        portable = portable_mask_default()
    elif not isinstance(portable, bool):
        raise TypeError(f"portable_mask must be a bool or None, got {type(portable).__name__}")
    check_tensor(x, x_name)
    check_tensor(residual, residual_name)
    if bias is not None:
        check_tensor(bias, bias_name)
    p = _check_probability(p, p_name)
    check_same_device(x, x_name, **{bias_name: bias, residual_name: residual})
    if bias is not None and x.dim() == 0:
        raise ValueError(
            f"{x_name} is 0-d, but {bias_name} is added along {x_name}'s last dim: give "
            f"{x_name} at least one dim (or pass no {bias_name})"
        )
    width = x.shape[-1] if x.dim() else 1
    if bias is not None and (
        bias.numel() != width or (bias.dim() > 1 and any(s != 1 for s in bias.shape[:-1]))
    ):
        raise ValueError(
            f"{bias_name} has shape {tuple(bias.shape)}; expected ({width},), the last dim of "
            f"{x_name} {tuple(x.shape)}"
        )
    if residual.shape != x.shape and _broadcast(residual.shape, x.shape) != x.shape:
        raise ValueError(
            f"{residual_name} has shape {tuple(residual.shape)}, which does not broadcast to "
            f"the shape of {x_name} {tuple(x.shape)}"
        )
    rate = p if training else 0.0
    seed = None
    if 0.0 < rate < 1.0:
        if generator is not None and not same_device(generator.device, x.device):
            raise ValueError(f"generator is on {generator.device} but {x_name} is on {x.device}")
        seed = draw_seed(x.device, generator)
    if bias is not None:
        # a 1-D bias as it is (a reshape to its own shape is a view: about 1 us)
        bias = (bias if bias.dim() == 1 else bias.reshape(width)).contiguous()
    x = x.contiguous()
    eager = eager_fast_path(x, bias, residual)
    if (
        eager
        and rate < 1.0
        and not (portable and seed is not None)
        and dispatch.pick(NAME, x, residual, bias, backend=backend) == "native"
    ):
        return _native_eager(x, bias, residual, seed, rate)
    if residual.shape != x.shape:
        residual = residual.expand(x.shape)
    args = (x, bias, residual.contiguous(), seed, rate, backend, portable)
    return BIAS_DROPOUT_ADD.call(args, eager)  # the seed: a plain tensor of torch.randint


def bias_dropout_add(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    p: float,
    training: bool = True,
    generator: torch.Generator | None = None,
    *,
    backend: str | None = None,
    portable_mask: bool | None = None,
) -> torch.Tensor:
    """``residual + dropout(x + bias, p)`` fused: one kernel, no mask saved for the backward.

    x: (..., H) float16/bfloat16/float32 (float64 on the reference backend); bias: (H,) or None
    (a 0-d x takes no bias: ValueError); an fp64 residual or bias runs the reference (fp64 math);
    residual: broadcastable to x's shape, any float dtype (x and bias are converted to it).
    p: drop probability in [0, 1]; training=False (or p=0) returns x + bias + residual and
    draws no random numbers. generator: where the seed comes from (default: the default
    generator of x's device). Returns a contiguous tensor of x's shape and residual's dtype.
    Differentiable in x, bias and residual; works under torch.compile and torch.export.
    backend: "cuda" | "triton" | "native" | "reference" to force one (default: the dispatch
    rule). Where no fused kernel runs (CPU, unverified kernels) the native backend runs torch's
    own ops: in eager mode with torch's autograd, which keeps the mask (one byte an element).
    portable_mask: True draws the Philox mask, the same bits on every backend (kernels, native,
    reference, XLA) for the same seed; False (default; ``FUSEDOPS_PORTABLE_DROPOUT=1`` makes
    True the default) lets the native backend on CPU tensors draw torch's own random mask
    instead (from a generator seeded by the op's seed: reproducible under
    ``torch.manual_seed``, the same in eager and compiled code, not the kernels' bits). On other
    devices (CUDA) native always draws the Philox mask (no host sync), so there the flag changes
    nothing. The kernels always use Philox.
    """
    names = ("x", "bias", "residual", "p")
    return _bias_dropout_add(
        x, bias, residual, p, training, generator, backend, names, portable_mask
    )


def _split_x_with_bias(x_with_bias):
    if not isinstance(x_with_bias, (tuple, list)) or len(x_with_bias) != 2:
        raise TypeError(f"x_with_bias must be a pair (x, bias), got {type(x_with_bias).__name__}")
    return x_with_bias


_MEGATRON_NAMES = ("x_with_bias[0]", "x_with_bias[1]", "residual", "prob")


def bias_dropout_add_fused_train(x_with_bias, residual: torch.Tensor, prob: float):
    """Megatron-LM's name: ``residual + dropout(x + bias, prob)`` in training mode, with
    ``x_with_bias = (x, bias)`` (bias may be None). Shapes and dtypes as ``bias_dropout_add``."""
    x, bias = _split_x_with_bias(x_with_bias)
    return _bias_dropout_add(x, bias, residual, prob, True, None, None, _MEGATRON_NAMES)


def bias_dropout_add_fused_inference(x_with_bias, residual: torch.Tensor, prob: float):
    """Megatron-LM's name: ``residual + x + bias`` (inference: no dropout; prob is checked)."""
    x, bias = _split_x_with_bias(x_with_bias)
    return _bias_dropout_add(x, bias, residual, prob, False, None, None, _MEGATRON_NAMES)


def dropout_add(x, to_add, drop_rate, training: bool):
    """``to_add + dropout(x, drop_rate)`` (no bias), with the seed runtime's argument names."""
    names = ("x", "bias", "to_add", "drop_rate")
    return _bias_dropout_add(x, None, to_add, drop_rate, training, None, None, names)

"""Lowerings of elementwise ops, comparisons and activation backward formulas."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from fusedops.xla.lower_table import (
    _is_float,
    register,
)

aten = torch.ops.aten
prims = torch.ops.prims


# ----------------------------------------------------------------------------- elementwise unary
_UNARY = {
    aten.abs.default: jnp.abs,
    aten.neg.default: jnp.negative,
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log1p.default: jnp.log1p,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.relu.default: jax.nn.relu,
    aten.erf.default: jax.scipy.special.erf,
    aten.erfc.default: jax.scipy.special.erfc,
    aten.erfinv.default: jax.scipy.special.erfinv,
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.round.default: jnp.round,
    aten.trunc.default: jnp.trunc,
    aten.sign.default: jnp.sign,
    aten.sgn.default: jnp.sign,
    aten.reciprocal.default: jnp.reciprocal,
    aten.logical_not.default: jnp.logical_not,
    aten.bitwise_not.default: jnp.invert,
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isfinite.default: jnp.isfinite,
    aten.lgamma.default: jax.scipy.special.gammaln,
    aten.digamma.default: jax.scipy.special.digamma,
    aten.silu.default: jax.nn.silu,
    aten.mish.default: lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    aten.hardsigmoid.default: lambda x: jnp.clip(x / 6 + 0.5, 0, 1),
    aten.hardswish.default: lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1),
    aten.frac.default: lambda x: x - jnp.trunc(x),
    aten.square.default: jnp.square,
}
for _op, _fn in _UNARY.items():
    register(_op)(_fn)


@register(
    aten.clone.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.detach.default,
    aten.contiguous.default,
    aten.positive.default,
)
def _identity(x, *args, **kwargs):
    return x


@register(aten.gelu.default)
def _gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + jax.scipy.special.erf(x * (1 / math.sqrt(2))))


@register(aten.hardtanh.default)
def _hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val)


@register(aten.leaky_relu.default)
def _leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@register(aten.elu.default)
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@register(aten.softplus.default)
def _softplus(x, beta=1.0, threshold=20.0):
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@register(aten.threshold.default)
def _threshold(x, threshold, value):
    return jnp.where(x <= threshold, value, x)


@register(aten.nan_to_num.default)
def _nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


# ---------------------------------------------------------------------------- elementwise binary
@register(aten.add.Tensor, aten.add.Scalar)
def _add(a, b, alpha=1):
    return a + (b * alpha if alpha != 1 else b)


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(a, b, alpha=1):
    return a - (b * alpha if alpha != 1 else b)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(a, b, alpha=1):
    return b - (a * alpha if alpha != 1 else a)


@register(aten.mul.Tensor, aten.mul.Scalar)
def _mul(a, b):
    return a * b


@register(aten.div.Tensor, aten.div.Scalar)
def _div(a, b):
    return jnp.true_divide(a, b)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(a, b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    if _is_float(a) or _is_float(b):
        return jnp.trunc(jnp.true_divide(a, b))
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    return lax.div(a, b.astype(a.dtype))


_BINARY = {
    aten.remainder.Tensor: jnp.remainder,
    aten.remainder.Scalar: jnp.remainder,
    aten.fmod.Tensor: jnp.fmod,
    aten.fmod.Scalar: jnp.fmod,
    aten.pow.Tensor_Tensor: jnp.power,
    aten.pow.Tensor_Scalar: jnp.power,
    aten.pow.Scalar: jnp.power,
    aten.maximum.default: jnp.maximum,
    aten.minimum.default: jnp.minimum,
    aten.fmax.default: jnp.fmax,
    aten.fmin.default: jnp.fmin,
    aten.atan2.default: jnp.arctan2,
    aten.hypot.default: jnp.hypot,
    aten.copysign.Tensor: jnp.copysign,
    aten.floor_divide.default: jnp.floor_divide,
    aten.xlogy.Tensor: jax.scipy.special.xlogy,
    aten.eq.Tensor: jnp.equal,
    aten.eq.Scalar: jnp.equal,
    aten.ne.Tensor: jnp.not_equal,
    aten.ne.Scalar: jnp.not_equal,
    aten.lt.Tensor: jnp.less,
    aten.lt.Scalar: jnp.less,
    aten.le.Tensor: jnp.less_equal,
    aten.le.Scalar: jnp.less_equal,
    aten.gt.Tensor: jnp.greater,
    aten.gt.Scalar: jnp.greater,
    aten.ge.Tensor: jnp.greater_equal,
    aten.ge.Scalar: jnp.greater_equal,
    aten.logical_and.default: jnp.logical_and,
    aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor,
    aten.bitwise_and.Tensor: jnp.bitwise_and,
    aten.bitwise_and.Scalar: jnp.bitwise_and,
    aten.bitwise_or.Tensor: jnp.bitwise_or,
    aten.bitwise_or.Scalar: jnp.bitwise_or,
    aten.bitwise_xor.Tensor: jnp.bitwise_xor,
    aten.bitwise_xor.Scalar: jnp.bitwise_xor,
}
for _op, _fn in _BINARY.items():
    register(_op)(_fn)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond, a, b):
    return jnp.where(cond, a, b)


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x, min=None, max=None):  # noqa: A002
    if min is not None:
        x = jnp.maximum(x, jnp.asarray(min, x.dtype) if not hasattr(min, "shape") else min)
    if max is not None:
        x = jnp.minimum(x, jnp.asarray(max, x.dtype) if not hasattr(max, "shape") else max)
    return x


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x, min):  # noqa: A002
    return _clamp(x, min=min)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x, max):  # noqa: A002
    return _clamp(x, max=max)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(a, b, weight):
    return a + weight * (b - a)


@register(aten.addcmul.default)
def _addcmul(x, t1, t2, value=1):
    return x + value * t1 * t2


@register(aten.addcdiv.default)
def _addcdiv(x, t1, t2, value=1):
    return x + value * t1 / t2


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


# ------------------------------------------------------------------ activation backward formulas
@register(aten.threshold_backward.default)
def _threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@register(aten.sigmoid_backward.default)
def _sigmoid_backward(grad, out):
    return grad * out * (1 - out)


@register(aten.tanh_backward.default)
def _tanh_backward(grad, out):
    return grad * (1 - out * out)


def _vjp_unary(forward):
    def backward(grad, x, *args):
        _, pullback = jax.vjp(lambda v: forward(v, *args), x)
        return pullback(grad)[0]

    return backward


register(aten.gelu_backward.default)(
    lambda grad, x, approximate="none": _vjp_unary(_gelu)(grad, x, approximate)
)
register(aten.silu_backward.default)(_vjp_unary(jax.nn.silu))
register(aten.hardtanh_backward.default)(_vjp_unary(_hardtanh))
register(aten.softplus_backward.default)(_vjp_unary(_softplus))
register(aten.mish_backward.default)(_vjp_unary(_UNARY[aten.mish.default]))
register(aten.hardsigmoid_backward.default)(_vjp_unary(_UNARY[aten.hardsigmoid.default]))
register(aten.hardswish_backward.default)(_vjp_unary(_UNARY[aten.hardswish.default]))


@register(aten.leaky_relu_backward.default)
def _leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


# --------------------------------------------------------------------------- foreach (lists) ops
def _foreach(fn):
    """The lowering of ``_foreach_<op>``: ``fn`` on each element of the first list, with each
    other list argument's element at the same position (scalars and single tensors as they
    are)."""

    def lowering(tensors, *args, **kwargs):
        def at(value, i):
            return value[i] if isinstance(value, (list, tuple)) else value

        return [
            fn(t, *[at(a, i) for a in args], **{k: at(v, i) for k, v in kwargs.items()})
            for i, t in enumerate(tensors)
        ]

    return lowering


_FOREACH = {
    "add": (_add, ("Scalar", "List", "ScalarList", "Tensor")),
    "sub": (_sub, ("Scalar", "List", "ScalarList")),
    "mul": (_mul, ("Scalar", "List", "ScalarList", "Tensor")),
    "div": (_div, ("Scalar", "List", "ScalarList", "Tensor")),
    "maximum": (jnp.maximum, ("Scalar", "List", "ScalarList")),
    "minimum": (jnp.minimum, ("Scalar", "List", "ScalarList")),
    "pow": (jnp.power, ("Scalar", "List", "ScalarList")),
    "addcmul": (_addcmul, ("Scalar", "ScalarList", "Tensor")),
    "addcdiv": (_addcdiv, ("Scalar", "ScalarList", "Tensor")),
    "lerp": (_lerp, ("Scalar", "List", "ScalarList")),
    **{name: (_UNARY[getattr(aten, name).default], ("default",)) for name in
       ("sqrt", "neg", "exp", "abs", "reciprocal", "sign")},
}  # fmt: skip
for _name, (_fn, _overloads) in _FOREACH.items():
    for _overload in _overloads:
        register(getattr(getattr(aten, f"_foreach_{_name}"), _overload))(_foreach(_fn))


# ------------------------------------------------------------------------------- complex numbers
@register(aten.view_as_complex.default)
def _view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@register(aten.view_as_real.default)
def _view_as_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@register(aten.complex.default)
def _complex(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@register(aten.polar.default)
def _polar(magnitude, angle):
    return _complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


register(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)(jnp.conj)


@register(aten.round.decimals)
def _round_decimals(x, *, decimals):
    """torch.round(x, decimals=d): half to even at the d-th decimal, the power of ten in x's
    dtype as ATen computes it."""
    if decimals == 0:
        return jnp.round(x)
    scale = jnp.asarray(10.0 ** abs(decimals), x.dtype)
    if decimals > 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


def _trigamma(x):
    """psi'(x), with the reflection psi'(x) + psi'(1 - x) = pi^2 / sin^2(pi x) below 1/2 (the
    series behind jax's polygamma holds for x > 0 only)."""
    small = x < 0.5
    z = jnp.where(small, 1 - x, x)
    value = jax.scipy.special.polygamma(1, z)
    return jnp.where(small, (jnp.pi / jnp.sin(jnp.pi * x)) ** 2 - value, value)


#: Euler-Maclaurin coefficients of the Hurwitz zeta tail: (2k)! / B_2k, k = 1..12
_ZETA_TAIL = (
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18,
)  # fmt: skip


def _hurwitz_zeta(s: int, q):
    """zeta(s, q) = sum_i (q + i)^-s for an integer s > 1 and any real q (a pole at q = 0, -1,
    ...): terms summed directly until q + i > 9 (a data-dependent count: a while loop), then
    the Euler-Maclaurin tail, as Cephes (and so ATen) computes it for negative q too."""
    dtype = q.dtype
    eps = jnp.finfo(dtype).eps

    def cond(state):
        i, a, _ = state
        return jnp.any((i < 9) | (a <= 9.0))

    def body(state):
        i, a, total = state
        active = (i < 9) | (a <= 9.0)
        a_next = a + 1
        return (i + active, jnp.where(active, a_next, a),
                total + jnp.where(active, a_next ** (-s), 0))  # fmt: skip

    i0 = jnp.zeros(q.shape, jnp.int32)
    _, a, total = lax.while_loop(cond, body, (i0, q, q ** (-s)))
    b = a ** (-s)
    total = total + b * a / (s - 1) - 0.5 * b
    factor, k, term_b = jnp.ones_like(q), 0.0, b
    for coefficient in _ZETA_TAIL:
        factor = factor * (s + k)
        term_b = term_b / a
        term = factor * term_b / coefficient
        total = total + jnp.where(jnp.abs(term) >= eps * jnp.abs(total), term, 0)
        k += 1
        factor = factor * (s + k)
        term_b = term_b / a
        k += 1
    poles = (q <= 0) & (q == jnp.floor(q))
    return jnp.where(poles, jnp.inf, total).astype(dtype)


@register(aten.polygamma.default)
def _polygamma(n, x):
    """psi^(n)(x): digamma, trigamma (with its reflection), else
    (-1)^(n+1) n! zeta(n + 1, x), for negative x too."""
    if n == 0:
        return jax.scipy.special.digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.factorial(n) * _hurwitz_zeta(n + 1, x)


# --------------------------------------------------------------------------- special functions
def _spherical_bessel_j0(x):
    safe = jnp.where(x == 0, 1, x)
    return jnp.where(x == 0, jnp.ones((), x.dtype), jnp.sin(safe) / safe)


_SPECIAL = {
    aten.i0.default: jax.scipy.special.i0,
    aten.special_i0e.default: jax.scipy.special.i0e,
    aten.special_i1.default: jax.scipy.special.i1,
    aten.special_i1e.default: jax.scipy.special.i1e,
    aten.special_modified_bessel_i0.default: jax.scipy.special.i0,
    aten.special_modified_bessel_i1.default: jax.scipy.special.i1,
    aten.special_ndtri.default: jax.scipy.special.ndtri,
    aten.special_ndtr.default: jax.scipy.special.ndtr,
    aten.special_log_ndtr.default: jax.scipy.special.log_ndtr,
    aten.special_erfcx.default: jax.scipy.special.erfcx,
    aten.special_entr.default: jax.scipy.special.entr,
    aten.special_spherical_bessel_j0.default: _spherical_bessel_j0,
    aten.signbit.default: jnp.signbit,
    aten.angle.default: jnp.angle,
}
for _op, _fn in _SPECIAL.items():
    register(_op)(_fn)

_SPECIAL_BINARY = {
    aten.special_zeta.default: jax.scipy.special.zeta,
    aten.igamma.default: jax.scipy.special.gammainc,
    aten.igammac.default: jax.scipy.special.gammaincc,
    aten.nextafter.default: jnp.nextafter,
    aten.special_xlog1py.default: jax.scipy.special.xlog1py,
}
for _op, _fn in _SPECIAL_BINARY.items():
    register(_op)(_fn)


@register(aten.ldexp.Tensor)
def _ldexp(x, exponent):
    return x * jnp.exp2(exponent.astype(jnp.result_type(x, jnp.float32)))


@register(aten.frexp.Tensor)
def _frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)

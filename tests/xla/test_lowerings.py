"""Every lowering in the table against eager torch, forward and (where differentiable) backward.

Inputs are random each run (``fusedops.testing.random_tensor``). A lowering runs on JAX arrays
exactly as inside a program (64-bit types on, result cast to the dtype torch gives) and is
compared with ``fusedops.testing.assert_close`` at the tolerance of the result's dtype.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.utils._pytree as pytree

from fusedops.testing import assert_close, random_tensor

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from fusedops.xla import lower  # noqa: E402

aten = torch.ops.aten
F32, F64, BF16, I64 = torch.float32, torch.float64, torch.bfloat16, torch.int64


def R(*shape, dtype=F32, low=-3.0, high=3.0):
    return random_tensor(shape, dtype, low=low, high=high)


def P(*shape, dtype=F32):
    return random_tensor(shape, dtype, low=0.5, high=3.0)


def U(*shape, dtype=F32):
    return random_tensor(shape, dtype, low=-0.9, high=0.9)


def I(*shape, high=5, low=0):  # noqa: E743
    return torch.randint(low, high, shape)


def B(*shape):
    return torch.rand(shape) > 0.5


def _to_jax(x):
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return jnp.asarray(x.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(x.numpy())
    if isinstance(x, (list, tuple)):
        return type(x)(_to_jax(v) for v in x)
    return x


def _to_torch(x):
    if x is None:
        return None
    if x.dtype == jnp.bfloat16:
        return torch.from_numpy(jax.numpy.asarray(x, jnp.float32).__array__().copy()).bfloat16()
    return torch.from_numpy(jax.device_get(x).copy())


def run_lowering(op, args, kwargs, expected):
    """The lowering of ``op`` on ``args`` as a program runs it (x64, dtype fixed by torch's)."""
    from fusedops.xla.program import _fix

    class _Node:
        target, name = op, "sample"

    fn = lower.LOWERINGS[op]
    leaves, spec = pytree.tree_flatten((list(args), dict(kwargs)))
    tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def call(*arrays):
        full = list(leaves)
        for i, a in zip(tensor_at, arrays):
            full[i] = a
        a, kw = pytree.tree_unflatten(full, spec)
        if op in lower.NEEDS_META:
            kw["meta"] = expected
        return _fix(fn(*a, **kw), expected, _Node)

    with jax.enable_x64(True):
        return jax.jit(call)(*[_to_jax(leaves[i]) for i in tensor_at])


def _compare(actual, expected, msg):
    if isinstance(expected, torch.Tensor):
        actual_t = _to_torch(actual)
        if expected.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            assert_close(actual_t, expected, dtype=expected.dtype, scale=4.0, msg=msg)
        else:
            assert actual_t.dtype == expected.dtype, msg
            assert torch.equal(actual_t, expected), msg
    elif isinstance(expected, (tuple, list)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            if e is not None:
                _compare(a, e, f"{msg}[{i}]")


# (op, builder -> (args, kwargs), differentiable argument positions to check the vjp of)
SAMPLES: list[tuple] = []


def sample(op, build, grad=(), ident=None):
    SAMPLES.append(pytest.param(op, build, grad, id=ident or str(op).replace("aten.", "")))


for _op in [
    aten.abs.default,
    aten.neg.default,
    aten.exp.default,
    aten.exp2.default,
    aten.expm1.default,
    aten.sin.default,
    aten.cos.default,
    aten.tan.default,
    aten.atan.default,
    aten.sinh.default,
    aten.cosh.default,
    aten.tanh.default,
    aten.asinh.default,
    aten.sigmoid.default,
    aten.relu.default,
    aten.erf.default,
    aten.erfc.default,
    aten.floor.default,
    aten.ceil.default,
    aten.round.default,
    aten.trunc.default,
    aten.sign.default,
    aten.sgn.default,
    aten.silu.default,
    aten.mish.default,
    aten.hardsigmoid.default,
    aten.hardswish.default,
    aten.frac.default,
    aten.square.default,
    aten.clone.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.positive.default,
]:
    for _dt in (F32, F64) if _op in (aten.exp.default, aten.tanh.default) else (F32,):
        sample(
            _op,
            lambda dt=_dt: ((R(4, 7, dtype=dt),), {}),
            grad=(0,),
            ident=f"{_op}-{_dt}".replace("aten.", "").replace("torch.", ""),
        )
for _op in [
    aten.log.default,
    aten.log1p.default,
    aten.log2.default,
    aten.log10.default,
    aten.sqrt.default,
    aten.rsqrt.default,
    aten.reciprocal.default,
    aten.lgamma.default,
    aten.digamma.default,
    aten.acosh.default,
]:
    sample(_op, lambda: ((P(4, 7) + 1,), {}), grad=(0,))
for _op in [aten.asin.default, aten.acos.default, aten.atanh.default, aten.erfinv.default]:
    sample(_op, lambda: ((U(4, 7),), {}), grad=(0,))
for _op in [
    aten.logical_not.default,
    aten.isnan.default,
    aten.isinf.default,
    aten.isfinite.default,
]:
    sample(_op, lambda: ((R(3, 5),), {}))
sample(aten.bitwise_not.default, lambda: ((I(3, 5, high=100),), {}))
sample(aten.relu.default, lambda: ((R(5, 6, dtype=BF16),), {}), ident="relu-bf16")
sample(aten.gelu.default, lambda: ((R(4, 9),), {}), grad=(0,))
sample(
    aten.gelu.default, lambda: ((R(4, 9),), {"approximate": "tanh"}), grad=(0,), ident="gelu-tanh"
)
sample(aten.hardtanh.default, lambda: ((R(4, 9), -1.5, 2.0), {}), grad=(0,))
sample(aten.leaky_relu.default, lambda: ((R(4, 9), 0.2), {}), grad=(0,))
sample(aten.elu.default, lambda: ((R(4, 9), 1.3), {}), grad=(0,))
sample(aten.softplus.default, lambda: ((R(4, 9) * 5, 2.0, 3.0), {}), grad=(0,))
sample(aten.threshold.default, lambda: ((R(4, 9), 0.5, -2.0), {}))
sample(
    aten.nan_to_num.default,
    lambda: ((torch.tensor([1.0, math.nan, math.inf, -math.inf]) * R(4),), {"nan": 0.5}),
)

for _op in [
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.maximum.default,
    aten.minimum.default,
    aten.atan2.default,
    aten.hypot.default,
    aten.fmax.default,
    aten.fmin.default,
    aten.copysign.Tensor,
]:
    for _dt in (F32, F64):
        sample(
            _op,
            lambda dt=_dt: ((R(4, 6, dtype=dt), R(1, 6, dtype=dt)), {}),
            grad=(0, 1),
            ident=f"{_op}-{_dt}".replace("aten.", "").replace("torch.", ""),
        )
sample(aten.add.Tensor, lambda: ((R(3, 4), R(3, 4)), {"alpha": 0.5}), ident="add-alpha")
sample(aten.add.Tensor, lambda: ((I(3, 4, high=50), I(3, 4, high=50)), {}), ident="add-int64")
sample(
    aten.add.Tensor, lambda: ((R(3, 4), torch.tensor(2.5, dtype=F64)), {}), ident="add-0d-promotion"
)
sample(aten.add.Tensor, lambda: ((R(3, 4, dtype=BF16), R(3, 4, dtype=BF16)), {}), ident="add-bf16")
sample(aten.add.Scalar, lambda: ((R(3, 4), 1.5), {}))
sample(aten.sub.Tensor, lambda: ((R(3, 4), R(3, 4)), {"alpha": 2}), ident="sub-alpha")
sample(aten.rsub.Scalar, lambda: ((R(3, 4), 2.0), {}))
sample(aten.rsub.Tensor, lambda: ((R(3, 4), R(3, 4)), {}))
sample(aten.mul.Scalar, lambda: ((R(3, 4), -1.5), {}))
sample(aten.mul.Tensor, lambda: ((I(3, 4, high=9), R(3, 4)), {}), ident="mul-int-float")
sample(aten.div.Scalar, lambda: ((R(3, 4), 3.0), {}))
sample(
    aten.div.Tensor, lambda: ((I(3, 4, high=9), I(3, 4, low=1, high=5)), {}), ident="div-int-true"
)
sample(
    aten.div.Tensor_mode,
    lambda: ((R(3, 4) * 4, P(3, 4)), {"rounding_mode": "floor"}),
    ident="div-floor",
)
sample(
    aten.div.Tensor_mode,
    lambda: ((R(3, 4) * 4, P(3, 4)), {"rounding_mode": "trunc"}),
    ident="div-trunc",
)
sample(
    aten.div.Tensor_mode,
    lambda: ((I(3, 4, low=-20, high=20), I(3, 4, low=1, high=6)), {"rounding_mode": "trunc"}),
    ident="div-trunc-int",
)
sample(
    aten.div.Tensor_mode,
    lambda: ((I(3, 4, low=-20, high=20), I(3, 4, low=1, high=6)), {"rounding_mode": "floor"}),
    ident="div-floor-int",
)
sample(aten.remainder.Tensor, lambda: ((R(3, 4) * 4, P(3, 4)), {}))
sample(aten.remainder.Scalar, lambda: ((I(3, 4, low=-9, high=9), 4), {}))
sample(aten.fmod.Tensor, lambda: ((R(3, 4) * 4, P(3, 4)), {}))
sample(aten.fmod.Scalar, lambda: ((R(3, 4) * 4, 1.5), {}))
sample(aten.floor_divide.default, lambda: ((I(3, 4, low=-9, high=9), I(3, 4, low=1, high=4)), {}))
sample(aten.pow.Tensor_Scalar, lambda: ((P(3, 4), 2.5), {}), grad=(0,))
sample(aten.pow.Tensor_Scalar, lambda: ((R(3, 4), 2), {}), ident="pow-int-exp")
sample(aten.pow.Tensor_Tensor, lambda: ((P(3, 4), R(3, 4)), {}), grad=(0, 1))
sample(aten.pow.Scalar, lambda: ((0.9, R(3, 4)), {}))
sample(aten.xlogy.Tensor, lambda: ((P(3, 4), P(3, 4)), {}))
for _op in [
    aten.eq.Tensor,
    aten.ne.Tensor,
    aten.lt.Tensor,
    aten.le.Tensor,
    aten.gt.Tensor,
    aten.ge.Tensor,
]:
    sample(_op, lambda: ((I(4, 5), I(4, 5)), {}))
for _op in [
    aten.eq.Scalar,
    aten.ne.Scalar,
    aten.lt.Scalar,
    aten.le.Scalar,
    aten.gt.Scalar,
    aten.ge.Scalar,
]:
    sample(_op, lambda: ((R(4, 5), 0.5), {}))
for _op in [aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default]:
    sample(_op, lambda: ((B(4, 5), B(4, 5)), {}))
for _op in [aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor]:
    sample(_op, lambda: ((I(4, 5, high=64), I(4, 5, high=64)), {}))
sample(aten.bitwise_and.Tensor, lambda: ((B(4, 5), B(4, 5)), {}), ident="bitwise_and-bool")
sample(aten.where.self, lambda: ((B(4, 5), R(4, 5), R(1, 5)), {}), grad=(1, 2))
sample(aten.clamp.default, lambda: ((R(4, 5), -1.0, 1.5), {}), grad=(0,))
sample(aten.clamp.default, lambda: ((R(4, 5), None, 0.5), {}), ident="clamp-max-only")
sample(aten.clamp.Tensor, lambda: ((R(4, 5), R(4, 5) - 1, R(4, 5) + 1), {}))
sample(aten.clamp_min.default, lambda: ((R(4, 5), 0.1), {}))
sample(aten.clamp_max.default, lambda: ((R(4, 5), 0.1), {}))
sample(aten.lerp.Scalar, lambda: ((R(4, 5), R(4, 5), 0.3), {}), grad=(0, 1))
sample(aten.lerp.Tensor, lambda: ((R(4, 5), R(4, 5), P(4, 5) / 3), {}))
sample(aten.addcmul.default, lambda: ((R(4, 5), R(4, 5), R(4, 5)), {"value": 0.5}))
sample(aten.addcdiv.default, lambda: ((R(4, 5), R(4, 5), P(4, 5)), {"value": -0.5}))
sample(aten.masked_fill.Scalar, lambda: ((R(4, 5), B(4, 5), -7.0), {}))
sample(aten.masked_fill.Tensor, lambda: ((R(4, 5), B(4, 5), torch.tensor(2.0)), {}))

# activation backward formulas (as AOTAutograd's backward graphs call them)
sample(aten.threshold_backward.default, lambda: ((R(4, 6), R(4, 6), 0.0), {}))
sample(aten.sigmoid_backward.default, lambda: ((R(4, 6), torch.sigmoid(R(4, 6))), {}))
sample(aten.tanh_backward.default, lambda: ((R(4, 6), torch.tanh(R(4, 6))), {}))
sample(aten.gelu_backward.default, lambda: ((R(4, 6), R(4, 6)), {}))
sample(
    aten.gelu_backward.default,
    lambda: ((R(4, 6), R(4, 6)), {"approximate": "tanh"}),
    ident="gelu_backward-tanh",
)
sample(aten.silu_backward.default, lambda: ((R(4, 6), R(4, 6)), {}))
sample(aten.hardtanh_backward.default, lambda: ((R(4, 6), R(4, 6), -1.0, 1.0), {}))
sample(aten.softplus_backward.default, lambda: ((R(4, 6), R(4, 6), 1.0, 20.0), {}))
sample(aten.mish_backward.default, lambda: ((R(4, 6), R(4, 6)), {}))
sample(aten.hardsigmoid_backward.default, lambda: ((R(4, 6), R(4, 6)), {}))
sample(aten.hardswish_backward.default, lambda: ((R(4, 6), R(4, 6)), {}))
sample(aten.leaky_relu_backward.default, lambda: ((R(4, 6), R(4, 6), 0.1, False), {}))

# reductions
sample(aten.sum.default, lambda: ((R(4, 5),), {}), grad=(0,))
sample(aten.sum.dim_IntList, lambda: ((R(3, 4, 5), [0, 2], True), {}), grad=(0,))
sample(aten.sum.dim_IntList, lambda: ((B(3, 4), [1]), {}), ident="sum-bool")
sample(aten.sum.dim_IntList, lambda: ((I(3, 4), []), {}), ident="sum-int-all")
sample(aten.mean.default, lambda: ((R(4, 5),), {}))
sample(aten.mean.dim, lambda: ((R(3, 4, 5), [-1]), {}), grad=(0,))
sample(aten.prod.default, lambda: ((U(3, 4) + 1.5,), {}))
sample(aten.prod.dim_int, lambda: ((U(3, 4) + 1.5, 1, True), {}), grad=(0,))
sample(aten.amax.default, lambda: ((R(3, 4, 5), [1, 2]), {}), grad=(0,))
sample(aten.amin.default, lambda: ((R(3, 4, 5), [0], True), {}))
sample(aten.max.default, lambda: ((R(3, 4),), {}))
sample(aten.min.default, lambda: ((R(3, 4),), {}))
sample(aten.max.dim, lambda: ((R(3, 4), 1), {}))
sample(aten.min.dim, lambda: ((R(3, 4), 0, True), {}))
sample(aten.argmax.default, lambda: ((R(3, 4), 1), {}))
sample(aten.argmax.default, lambda: ((R(3, 4),), {}), ident="argmax-flat")
sample(aten.argmin.default, lambda: ((R(3, 4), 0, True), {}))
sample(aten.var.correction, lambda: ((R(3, 4, 5), [1, 2]), {"correction": 1}), grad=(0,))
sample(
    aten.var.correction,
    lambda: ((R(3, 4),), {"correction": 0, "keepdim": True}),
    ident="var-biased",
)
sample(aten.std.correction, lambda: ((R(3, 4), [1]), {"correction": 1}))
sample(aten.var_mean.correction, lambda: ((R(3, 4), [1]), {"correction": 0}))
sample(aten.any.default, lambda: ((B(3, 4),), {}))
sample(aten.any.dim, lambda: ((B(3, 4), 1), {}))
sample(aten.any.dims, lambda: ((B(3, 4), [0]), {}))
sample(aten.all.default, lambda: ((B(3, 4),), {}))
sample(aten.all.dim, lambda: ((B(3, 4), 0, True), {}))
sample(aten.logsumexp.default, lambda: ((R(3, 4), [1]), {}), grad=(0,))
sample(aten.cumsum.default, lambda: ((R(3, 4), 1), {}), grad=(0,))
sample(aten.cumsum.default, lambda: ((I(3, 4), 0), {}), ident="cumsum-int")
sample(aten.cumprod.default, lambda: ((U(3, 4) + 1.2, 1), {}))
sample(aten.linalg_vector_norm.default, lambda: ((R(3, 4), 2, [1]), {}))
sample(aten.linalg_vector_norm.default, lambda: ((R(3, 4), math.inf), {}), ident="norm-inf")
sample(aten.sort.default, lambda: ((torch.randperm(12).reshape(3, 4).float(), 1, True), {}))
sample(
    aten.sort.stable,
    lambda: ((torch.randperm(12).reshape(3, 4).float(),), {"stable": True, "dim": 0}),
)
sample(aten.topk.default, lambda: ((torch.randperm(20).reshape(4, 5).float(), 2, 1), {}))
sample(
    aten.topk.default,
    lambda: ((torch.randperm(20).reshape(4, 5).float(), 3, 0, False), {}),
    ident="topk-small",
)

# linear algebra
for _dt in (F32, F64):
    sample(
        aten.mm.default,
        lambda dt=_dt: ((R(5, 7, dtype=dt), R(7, 3, dtype=dt)), {}),
        grad=(0, 1),
        ident=f"mm-{_dt}",
    )
sample(aten.mm.default, lambda: ((R(5, 7, dtype=BF16), R(7, 3, dtype=BF16)), {}), ident="mm-bf16")
sample(aten.bmm.default, lambda: ((R(2, 5, 7), R(2, 7, 3)), {}), grad=(0, 1))
sample(aten.addmm.default, lambda: ((R(3), R(5, 7), R(7, 3)), {}), grad=(0, 1, 2))
sample(
    aten.addmm.default,
    lambda: ((R(5, 3), R(5, 7), R(7, 3)), {"beta": 0.5, "alpha": 2.0}),
    ident="addmm-alpha-beta",
)
sample(aten.baddbmm.default, lambda: ((R(2, 5, 3), R(2, 5, 7), R(2, 7, 3)), {}))
sample(aten.matmul.default, lambda: ((R(2, 5, 7), R(7, 3)), {}))
sample(aten.dot.default, lambda: ((R(7), R(7)), {}))
sample(aten.mv.default, lambda: ((R(5, 7), R(7)), {}))
sample(aten.addmv.default, lambda: ((R(5), R(5, 7), R(7)), {}))
sample(aten.linear.default, lambda: ((R(4, 7), R(3, 7), R(3)), {}), grad=(0, 1, 2))

# shapes, views, indexing
sample(aten.view.default, lambda: ((R(3, 4, 5), [12, -1]), {}), grad=(0,))
sample(aten._unsafe_view.default, lambda: ((R(3, 4), [2, 6]), {}))
sample(aten.reshape.default, lambda: ((R(3, 4), [4, 3]), {}))
sample(
    prims.collapse_view.default if (prims := torch.ops.prims) else None,
    lambda: ((R(2, 3, 4, 5), 1, 3), {}),
)
sample(aten.permute.default, lambda: ((R(2, 3, 4), [2, 0, 1]), {}), grad=(0,))
sample(aten.transpose.int, lambda: ((R(2, 3, 4), 0, -1), {}))
sample(aten.t.default, lambda: ((R(3, 4),), {}))
sample(aten.expand.default, lambda: ((R(3, 1), [2, 3, 4]), {}), grad=(0,))
sample(aten.expand.default, lambda: ((R(3, 1), [-1, 5]), {}), ident="expand-minus-one")
sample(aten.squeeze.dim, lambda: ((R(3, 1, 4), 1), {}))
sample(aten.squeeze.dims, lambda: ((R(1, 3, 1), [0, 2]), {}))
sample(aten.squeeze.default, lambda: ((R(1, 3, 1),), {}))
sample(aten.unsqueeze.default, lambda: ((R(3, 4), -1), {}))
sample(aten.slice.Tensor, lambda: ((R(6, 7), 1, 1, 6, 2), {}), grad=(0,))
sample(aten.slice.Tensor, lambda: ((R(6, 7), 0, -3, 2**63 - 1), {}), ident="slice-open-end")
sample(aten.slice_scatter.default, lambda: ((R(6, 7), R(6, 3), 1, 1, 6, 2), {}))
sample(aten.select.int, lambda: ((R(3, 4, 5), 1, -1), {}), grad=(0,))
sample(aten.select_scatter.default, lambda: ((R(3, 4, 5), R(3, 5), 1, 2), {}))
sample(aten.narrow.default, lambda: ((R(6, 7), 1, 2, 3), {}))
sample(aten.cat.default, lambda: (([R(2, 3), R(4, 3)], 0), {}), grad=())
sample(aten.cat.default, lambda: (([R(2, 3), R(2, 1), R(2, 2)], -1), {}), ident="cat-last")
sample(aten.stack.default, lambda: (([R(2, 3), R(2, 3)], 1), {}))
sample(aten.split.Tensor, lambda: ((R(7, 3), 3), {}))
sample(aten.split_with_sizes.default, lambda: ((R(3, 7), [2, 5], 1), {}))
sample(aten.unbind.int, lambda: ((R(3, 4), 1), {}))
sample(aten.flip.default, lambda: ((R(3, 4), [0, 1]), {}))
sample(aten.roll.default, lambda: ((R(3, 4), [1], [1]), {}))
sample(aten.roll.default, lambda: ((R(3, 4), [5]), {}), ident="roll-flat")
sample(aten.repeat.default, lambda: ((R(2, 3), [2, 1, 2]), {}))
sample(aten.tril.default, lambda: ((R(4, 4), -1), {}))
sample(aten.triu.default, lambda: ((R(4, 5), 1), {}))
sample(aten.constant_pad_nd.default, lambda: ((R(2, 3, 4), [1, 2, 0, 1], 0.5), {}), grad=(0,))
sample(aten.constant_pad_nd.default, lambda: ((R(2, 3, 4), [-1, 2]), {}), ident="pad-negative")
sample(aten.as_strided.default, lambda: ((R(4, 6), [3, 3], [6, 2], 1), {}))
sample(aten.gather.default, lambda: ((R(4, 6), 1, I(4, 3, high=6)), {}), grad=(0,))
sample(aten.gather.default, lambda: ((R(4, 6), 0, I(2, 6, high=4)), {}), ident="gather-dim0")
sample(
    aten.scatter.src,
    lambda: ((R(4, 6), 1, torch.stack([torch.randperm(6)[:3] for _ in range(4)]), R(4, 3)), {}),
)
sample(
    aten.scatter.value,
    lambda: ((R(4, 6), 1, torch.stack([torch.randperm(6)[:2] for _ in range(4)]), -1.0), {}),
)
sample(aten.scatter_add.default, lambda: ((R(4, 6), 1, I(4, 5, high=6), R(4, 5)), {}))
sample(aten.scatter_reduce.two, lambda: ((R(4, 6), 1, I(4, 5, high=6), R(4, 5), "sum"), {}))
sample(
    aten.scatter_reduce.two,
    lambda: ((R(4, 6), 1, I(4, 5, high=6), R(4, 5), "amax"), {"include_self": False}),
    ident="scatter_reduce-amax",
)
sample(aten.index.Tensor, lambda: ((R(5, 6), [I(3, high=5)]), {}), grad=(0,))
sample(
    aten.index.Tensor,
    lambda: ((R(5, 6, 7), [None, I(2, 3, high=6), I(2, 3, high=7)]), {}),
    ident="index-two-tensors",
)
sample(
    aten.index_put.default,
    lambda: ((R(5, 6), [torch.randperm(5)[:3]], R(3, 6)), {}),
    ident="index_put-set",
)
sample(
    aten.index_put.default,
    lambda: ((R(5, 6), [I(7, high=5)], R(7, 6), True), {}),
    ident="index_put-accumulate",
)
sample(aten.index_select.default, lambda: ((R(5, 6), 1, I(4, high=6)), {}))
sample(aten.index_add.default, lambda: ((R(5, 6), 0, I(3, high=5), R(3, 6)), {}))

# factories and casts (the result's shape/dtype come from torch's meta)
sample(aten.full.default, lambda: (([2, 3], 1.5), {}))
sample(aten.full_like.default, lambda: ((R(2, 3), 7), {}))
sample(aten.scalar_tensor.default, lambda: ((2.5,), {}))
sample(aten.zeros.default, lambda: (([2, 3],), {"dtype": I64}))
sample(aten.zeros_like.default, lambda: ((R(2, 3),), {}))
sample(aten.ones.default, lambda: (([4],), {}))
sample(aten.ones_like.default, lambda: ((I(2, 3),), {}))
sample(aten.new_zeros.default, lambda: ((R(2, 3), [4, 1]), {}))
sample(aten.new_ones.default, lambda: ((R(2, 3), [4, 1]), {}))
sample(aten.new_full.default, lambda: ((R(2, 3), [4, 1], 3.0), {}))
sample(aten.arange.default, lambda: ((7,), {}))
sample(aten.arange.start, lambda: ((2, 9), {}))
sample(aten.arange.start_step, lambda: ((1.0, 4.0, 0.5), {}))
sample(aten.linspace.default, lambda: ((0.0, 1.0, 7), {}))
sample(aten._to_copy.default, lambda: ((R(3, 4),), {"dtype": F64}))
sample(aten._to_copy.default, lambda: ((R(3, 4) * 10,), {"dtype": I64}), ident="to_copy-int")
sample(aten._to_copy.default, lambda: ((R(3, 4),), {"dtype": BF16}), ident="to_copy-bf16")
sample(aten.to.dtype, lambda: ((I(3, 4), F32), {}))
sample(torch.ops.prims.convert_element_type.default, lambda: ((R(3, 4), F64), {}))
sample(aten.copy.default, lambda: ((R(3, 4), R(4)), {}))
sample(aten.native_dropout_backward.default, lambda: ((R(3, 4), B(3, 4), 1.25), {}))

# convolution
sample(
    aten.convolution.default,
    lambda: ((R(2, 3, 9), R(4, 3, 3), R(4), [2], [1], [1], False, [0], 1), {}),
    grad=(0, 1, 2),
    ident="conv1d",
)
sample(
    aten.convolution.default,
    lambda: ((R(2, 4, 8, 7), R(6, 2, 3, 2), R(6), [1, 2], [1, 0], [2, 1], False, [0, 0], 2), {}),
    grad=(0, 1),
    ident="conv2d-groups-dilation",
)
sample(
    aten.convolution.default,
    lambda: ((R(1, 2, 5, 5, 4), R(3, 2, 2, 3, 2), None, [1], [1], [1], False, [0], 1), {}),
    ident="conv3d",
)
sample(
    aten.convolution.default,
    lambda: ((R(2, 4, 5, 6), R(4, 3, 3, 3), R(6), [2, 2], [1, 1], [1, 1], True, [1, 0], 2), {}),
    grad=(0, 1),
    ident="conv-transpose2d",
)
sample(
    aten.convolution_backward.default,
    lambda: (
        (
            R(2, 6, 6, 3),
            R(2, 4, 8, 7),
            R(6, 2, 3, 2),
            [6],
            [1, 2],
            [1, 0],
            [2, 1],
            False,
            [0, 0],
            2,
            [True, True, True],
        ),
        {},
    ),
    ident="convolution_backward",
)
sample(  # a 1x1 convolution: matrix products on the CPU (lower_nn._pointwise)
    aten.convolution.default,
    lambda: ((R(2, 5, 6, 7), R(4, 5, 1, 1), R(4), [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}),
    grad=(0, 1, 2),
    ident="conv2d-1x1",
)
sample(  # strided: every second position on each side (odd sizes: the last one kept)
    aten.convolution.default,
    lambda: ((R(2, 5, 7, 6), R(4, 5, 1, 1), None, [2, 2], [0], [1], False, [0, 0], 1), {}),
    grad=(0, 1),
    ident="conv2d-1x1-stride2",
)
sample(
    aten.convolution.default,
    lambda: ((R(2, 3, 5, 4, 3), R(6, 3, 1, 1, 1), None, [1, 2, 3], [0], [1], False, [0], 1), {}),
    grad=(0, 1),
    ident="conv3d-1x1-strides",
)
sample(
    aten.convolution_backward.default,
    lambda: (
        (
            R(2, 6, 4, 3),
            R(2, 4, 7, 6),
            R(6, 4, 1, 1),
            [6],
            [2, 2],
            [0, 0],
            [1, 1],
            False,
            [0, 0],
            1,
            [True, True, True],
        ),
        {},
    ),  # fmt: skip
    ident="convolution_backward-1x1-stride2",
)

# pooling
sample(aten.max_pool2d_with_indices.default, lambda: ((R(2, 3, 9, 8), [3, 2], [2, 2], [1, 1]), {}))
sample(
    aten.max_pool2d_with_indices.default,
    lambda: ((R(2, 3, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1], True), {}),
    ident="maxpool-ceil",
)
sample(
    aten.max_pool2d_with_indices.default,
    lambda: ((R(2, 3, 10, 10), [2, 2], [2, 2], [0, 0], [2, 2]), {}),
    ident="maxpool-dilation",
)
sample(aten.avg_pool2d.default, lambda: ((R(2, 3, 9, 8), [3, 2], [2, 2], [1, 1]), {}), grad=(0,))
sample(
    aten.avg_pool2d.default,
    lambda: ((R(2, 3, 9, 8), [3, 3], [2, 2], [1, 1], True, False), {}),
    ident="avgpool-ceil",
)
sample(
    aten.avg_pool2d.default,
    lambda: ((R(2, 3, 9, 8), [3, 3], [2, 2], [1, 1], True, True), {}),
    ident="avgpool-ceil-include-pad",
)
sample(
    aten.avg_pool2d.default,
    lambda: ((R(2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, 3), {}),
    ident="avgpool-divisor",
)
sample(
    aten.avg_pool2d_backward.default,
    lambda: ((R(2, 3, 5, 5), R(2, 3, 9, 8), [3, 2], [2, 2], [1, 1], False, True, None), {}),
)
sample(aten._adaptive_avg_pool2d.default, lambda: ((R(2, 3, 7, 9), [3, 4]), {}), grad=(0,))
sample(aten._adaptive_avg_pool2d_backward.default, lambda: ((R(2, 3, 3, 4), R(2, 3, 7, 9)), {}))

# normalization
sample(
    aten._native_batch_norm_legit_functional.default,
    lambda: ((R(4, 3, 5, 2), R(3), R(3), R(3), P(3), True, 0.1, 1e-5), {}),
    grad=(0, 1, 2),
    ident="batch_norm-train",
)
sample(
    aten._native_batch_norm_legit_functional.default,
    lambda: ((R(4, 3, 5), R(3), R(3), R(3), P(3), False, 0.1, 1e-5), {}),
    ident="batch_norm-eval",
)
sample(
    aten.native_batch_norm.default, lambda: ((R(4, 3), R(3), R(3), R(3), P(3), True, 0.1, 1e-5), {})
)
sample(
    aten._native_batch_norm_legit_no_training.default,
    lambda: ((R(4, 3, 2), R(3), R(3), R(3), P(3), 0.1, 1e-5), {}),
)
sample(
    aten._native_batch_norm_legit.no_stats, lambda: ((R(4, 3, 2), R(3), R(3), True, 0.1, 1e-5), {})
)


def _bn_backward_args(train):
    x, w, rm, rv = R(4, 3, 5), R(3), R(3), P(3)
    mean, invstd = x.mean((0, 2)), (x.var((0, 2), unbiased=False) + 1e-5).rsqrt()
    return (R(4, 3, 5), x, w, rm, rv, mean, invstd, train, 1e-5, [True, True, True]), {}


sample(
    aten.native_batch_norm_backward.default,
    lambda: _bn_backward_args(True),
    ident="batch_norm_backward-train",
)
sample(
    aten.native_batch_norm_backward.default,
    lambda: _bn_backward_args(False),
    ident="batch_norm_backward-eval",
)
sample(
    aten.native_layer_norm.default,
    lambda: ((R(3, 4, 6), [6], R(6), R(6), 1e-5), {}),
    grad=(0, 2, 3),
)
sample(
    aten.native_layer_norm.default,
    lambda: ((R(3, 4, 6), [4, 6], None, None, 1e-5), {}),
    ident="layer_norm-no-affine",
)


def _ln_backward_args():
    x = R(3, 4, 6)
    mean = x.mean(-1, keepdim=True)
    rstd = (x.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    return (R(3, 4, 6), x, [6], mean, rstd, R(6), R(6), [True, True, True]), {}


sample(aten.native_layer_norm_backward.default, lambda: _ln_backward_args())
sample(
    aten.native_group_norm.default,
    lambda: ((R(2, 6, 5), R(6), R(6), 2, 6, 5, 3, 1e-5), {}),
    grad=(0, 1, 2),
)


def _gn_backward_args():
    x = R(2, 6, 5)
    xg = x.reshape(2, 3, -1)
    mean, rstd = xg.mean(-1), (xg.var(-1, unbiased=False) + 1e-5).rsqrt()
    return (R(2, 6, 5), x, mean, rstd, R(6), 2, 6, 5, 3, [True, True, True]), {}


sample(aten.native_group_norm_backward.default, lambda: _gn_backward_args())

# softmax, losses, embedding, attention
sample(aten._softmax.default, lambda: ((R(3, 7), 1, False), {}), grad=(0,))
sample(aten._log_softmax.default, lambda: ((R(3, 7), 0, False), {}), grad=(0,))
sample(
    aten._softmax_backward_data.default, lambda: ((R(3, 7), torch.softmax(R(3, 7), 1), 1, F32), {})
)
sample(
    aten._log_softmax_backward_data.default,
    lambda: ((R(3, 7), torch.log_softmax(R(3, 7), 1), 1, F32), {}),
)


def _nll_args(reduction, weight=False, ignore=-100, spatial=False):
    x = torch.log_softmax(R(5, 4, 3, 2) if spatial else R(5, 4), 1)
    target = I(5, 3, 2, high=4) if spatial else I(5, high=4)
    if ignore >= 0:
        target[0] = ignore
    return x, target, (P(4) if weight else None), reduction, ignore


for _red in (0, 1, 2):
    sample(
        aten.nll_loss_forward.default,
        lambda r=_red: (_nll_args(r, weight=True), {}),
        grad=(0,),
        ident=f"nll_loss-reduction{_red}",
    )
sample(aten.nll_loss_forward.default, lambda: (_nll_args(1, ignore=2), {}), ident="nll-ignore")
sample(
    aten.nll_loss2d_forward.default, lambda: (_nll_args(1, spatial=True)[:2] + (None, 1, -100), {})
)


def _nll_backward_args(reduction):
    x, target, weight, red, ignore = _nll_args(reduction, weight=True, ignore=1)
    total = weight[target[target != 1]].sum()
    grad = R(5) if reduction == 0 else R()
    return (grad, x, target, weight, red, ignore, total), {}


for _red in (0, 1, 2):
    sample(
        aten.nll_loss_backward.default,
        lambda r=_red: _nll_backward_args(r),
        ident=f"nll_loss_backward-reduction{_red}",
    )
sample(aten.embedding.default, lambda: ((R(10, 4), I(3, 5, high=10)), {}), grad=(0,))
sample(
    aten.embedding_dense_backward.default,
    lambda: ((R(3, 5, 4), I(3, 5, high=10), 10, 2, False), {}),
)
sample(
    aten.embedding_dense_backward.default,
    lambda: ((R(3, 5, 4), I(3, 5, high=10), 10, -1, True), {}),
    ident="embedding_dense_backward-freq",
)
sample(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    lambda: ((R(2, 3, 5, 4), R(2, 3, 6, 4), R(2, 3, 6, 4)), {}),
    grad=(0, 1, 2),
)
sample(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    lambda: ((R(2, 3, 5, 4), R(2, 3, 5, 4), R(2, 3, 5, 4), 0.0, True), {"scale": 0.3}),
    ident="sdpa-causal",
)


sample(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    lambda: ((R(2, 3, 5, 4), R(2, 3, 6, 4), R(2, 3, 6, 4)), {"attn_mask": _additive_mask(5, 6)}),
    ident="sdpa-float-mask",
)


def _additive_mask(rows: int, cols: int) -> torch.Tensor:
    """A random additive attention mask, -inf on about half the keys (at least one key per
    query row kept)."""
    keep = torch.rand(rows, cols) > 0.5
    keep[torch.arange(rows), torch.randint(cols, (rows,))] = True
    return torch.where(keep, R(rows, cols), float("-inf"))


def _mask_with_a_hidden_row(rows: int, cols: int) -> torch.Tensor:
    """``_additive_mask`` whose second query row sees no key at all (torch: output 0 there)."""
    mask = _additive_mask(rows, cols)
    mask[1] = float("-inf")
    return mask


sample(
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    lambda: (
        (R(2, 3, 5, 4), R(2, 3, 6, 4), R(2, 3, 6, 4)),
        {"attn_mask": _mask_with_a_hidden_row(5, 6)},
    ),
    ident="sdpa-hidden-row",
)


def _sdpa_backward_args(causal=False, scale=None, mask=None):
    q, k, v = R(2, 3, 5, 4), R(2, 3, 6, 4), R(2, 3, 6, 4)
    if causal:
        k, v = k[:, :, :5], v[:, :, :5]
    options = {"scale": scale, "attn_mask": mask}
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, causal, **options
    )
    return (R(*out.shape), q, k, v, out, lse, 0.0, causal), options


sample(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, _sdpa_backward_args)
for _ident, _options in {
    "causal-scale": {"causal": True, "scale": 0.3},
    "float-mask": {"mask": _additive_mask(5, 6)},
    "hidden-row": {"mask": _mask_with_a_hidden_row(5, 6)},
}.items():
    sample(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        lambda o=_options: _sdpa_backward_args(**o),
        ident=f"sdpa_backward-{_ident}",
    )
for _op in (aten.view_copy.default, aten.permute_copy.default):
    sample(_op, lambda op=_op: ((R(3, 4), [4, 3] if op is aten.view_copy.default else [1, 0]), {}))


@pytest.mark.parametrize(("op", "build", "grad_args"), SAMPLES)
def test_lowering_matches_eager(op, build, grad_args):
    args, kwargs = build()
    expected = op(*args, **kwargs)
    actual = run_lowering(op, args, kwargs, expected)
    _compare(actual, expected, str(op))
    if grad_args:
        _check_vjp(op, args, kwargs, grad_args, expected)


def _check_vjp(op, args, kwargs, positions, expected):
    """jax.vjp of the lowering against torch.autograd.grad, for the float output(s)."""
    leaves = [
        a.detach().clone().requires_grad_(True) if i in positions else a for i, a in enumerate(args)
    ]
    out = op(*leaves, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    cotangents = [
        R(*o.shape, dtype=o.dtype)
        if o is not None and o.is_floating_point() and o.requires_grad
        else None
        for o in outs
    ]
    pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None]
    grads = torch.autograd.grad(
        [o for o, _ in pairs],
        [leaves[i] for i in positions],
        [c for _, c in pairs],
        allow_unused=True,
    )

    fn = lower.LOWERINGS[op]

    def f(*diff):
        full = list(_to_jax(list(args)))
        for i, d in zip(positions, diff):
            full[i] = d
        kw = dict(_to_jax(kwargs))
        if op in lower.NEEDS_META:
            kw["meta"] = expected
        res = fn(*full, **kw)
        res = res if isinstance(res, tuple) else (res,)
        return tuple(r for r, c in zip(res, cotangents) if c is not None)

    def vjp(primals, cts):
        return jax.vjp(f, *primals)[1](cts)

    with jax.enable_x64(True):
        primals = [_to_jax(args[i]) for i in positions]
        jgrads = jax.jit(vjp)(primals, tuple(_to_jax(c) for c in cotangents if c is not None))
    for i, (g, jg) in enumerate(zip(grads, jgrads)):
        if g is not None:
            assert_close(
                _to_torch(jg).to(g.dtype),
                g,
                dtype=g.dtype,
                scale=4.0,
                msg=f"{op} grad of arg {positions[i]}",
            )


def test_table_size():
    """The table covers the core ATen ops models use (forward and backward)."""
    assert len(lower.LOWERINGS) >= 150


def test_dropout_lowering_statistics_and_mask():
    x = P(200, 50)
    key = jax.random.key(0)
    with jax.enable_x64(True):
        out, mask = lower.LOWERINGS[aten.native_dropout.default](
            jnp.asarray(x.numpy()), 0.3, True, key=key
        )
    out, mask = _to_torch(out), _to_torch(mask)
    assert mask.dtype == torch.bool
    assert abs(mask.float().mean().item() - 0.7) < 0.02
    assert_close(out[mask], x[mask] / 0.7, dtype=F32)
    assert torch.all(out[~mask] == 0)


@pytest.mark.parametrize(
    ("op", "args", "mean", "std"),
    [
        (aten.rand.default, ([400, 50],), 0.5, (1 / 12) ** 0.5),
        (aten.randn.default, ([400, 50],), 0.0, 1.0),
        (aten.bernoulli.p, (torch.empty(400, 50), 0.3), 0.3, (0.3 * 0.7) ** 0.5),
        (aten.bernoulli.default, (torch.full((400, 50), 0.8),), 0.8, (0.8 * 0.2) ** 0.5),
    ],
)
def test_random_lowerings_have_torch_shapes_and_distributions(op, args, mean, std):
    from fusedops.xla import rng

    expected = op(*args)  # shape/dtype reference
    fn = lower.LOWERINGS[op]
    jargs = [_to_jax(a) for a in args]
    with jax.enable_x64(True):
        seed = jnp.asarray(rng.next_seed())
        a = _to_torch(fn(*jargs, meta=expected, key=rng.key_for(seed, 0)))
        b = _to_torch(fn(*jargs, meta=expected, key=rng.key_for(seed, 1)))
    assert a.shape == expected.shape and a.dtype == expected.dtype
    assert abs(a.double().mean().item() - mean) < 0.03
    assert abs(a.double().std().item() - std) < 0.03
    assert not torch.equal(a, b), "two random ops in one program must not share a stream"

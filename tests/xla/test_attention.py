"""Lowerings of CUDA's fused attention ops (flash, memory-efficient, cuDNN), checked on the CPU.

Those ops only run on a GPU, so each lowering is checked against float64 attention computed by
torch on the CPU, with the op's output layout (shapes of logsumexp and bookkeeping outputs)
taken from its meta kernel. On a GPU the model tests run them through partial_trace.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusedops.testing import assert_close, random_tensor, unit_roundoff
from fusedops.xla import lower

aten = torch.ops.aten
L, S, E = 5, 7, 8  # queries, keys, head size


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):  # as inside a program
        yield


def _jax(t: torch.Tensor):
    return jnp.asarray(t.detach().float().numpy()).astype(lower.jax_dtype(t.dtype))


def _torch(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a.astype(jnp.float32)))


def _inputs(dtype, bias: bool):
    q, k, v = (random_tensor((2, 3, n, E), dtype=dtype) for n in (L, S, S))
    mask = None
    if bias:
        keep = torch.rand(L, S) > 0.4
        keep[torch.arange(L), torch.randint(S, (L,))] = True
        mask = torch.where(keep, random_tensor((L, S)), float("-inf")).expand(2, 3, L, S)
        mask = mask.to(dtype)
    return q, k, v, mask


def _reference(q, k, v, mask, causal, scale, grad):
    """float64 attention output and (dq, dk, dv, dmask) through torch's math."""
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    m64 = None if mask is None else mask.double().requires_grad_(True)
    out = F.scaled_dot_product_attention(q64, k64, v64, m64, is_causal=causal, scale=scale)
    out.backward(grad.double())
    dmask = None if m64 is None else torch.nan_to_num(m64.grad)
    return out.detach(), (q64.grad, k64.grad, v64.grad, dmask)


def _magnitudes(q, k, v, mask, causal, scale, grad, dtype):
    """Per element, the sum of |terms| behind out and (dq, dk, dv, dmask) (float64), in units
    of the result dtype's roundoff: one rounding of each 16-bit intermediate (P, out, dS) moves
    them by that much. dS = P * (dP - delta) with dP = grad @ v^T and delta = rowsum(grad *
    out), so |dS| <= P * (|grad| @ |v|^T + rowsum(|grad * out|)). P = exp(s - lse) is computed
    in fp32 whatever the dtype: its relative error is fp32's roundoff times |s| + |lse| (the
    exponent's size), weighed here by u(fp32) / u(dtype) so that one tolerance rule covers
    both."""
    q64, k64, v64, g64 = (t.double() for t in (q, k, v, grad))
    scale = 1.0 / E**0.5 if scale is None else scale
    scores = q64 @ k64.transpose(-1, -2) * scale
    sizes = q64.abs() @ k64.abs().transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        scores = scores + mask.double()
        sizes = sizes + mask.double().abs()
    probs = scores.softmax(-1)
    lse = scores.logsumexp(-1, keepdim=True)
    weight = unit_roundoff(torch.float32) / unit_roundoff(dtype)
    exponent = torch.where(probs > 0, sizes + lse.abs(), 0.0)  # masked keys: P = 0 exactly
    p_size = probs * (1 + weight * exponent)
    out = probs @ v64
    ds = p_size * (g64.abs() @ v64.abs().transpose(-1, -2) + (g64 * out).abs().sum(-1, True))
    return p_size @ v64.abs(), (
        scale * ds @ k64.abs(),
        scale * ds.transpose(-1, -2) @ q64.abs(),
        p_size.transpose(-1, -2) @ g64.abs(),
        ds,
    )


def _meta(op, *args, **kwargs):
    def to_meta(x):
        return x.to("meta") if isinstance(x, torch.Tensor) else x

    return op(*[to_meta(a) for a in args], **{k: to_meta(v) for k, v in kwargs.items()})


def _check_layout(results, meta):
    assert len(results) == len(meta)
    for got, want in zip(results, meta):
        if isinstance(want, torch.Tensor):
            assert tuple(got.shape) == tuple(want.shape)
        else:
            assert got == want


CASES = [
    pytest.param("flash", False, False, None, id="flash"),
    pytest.param("flash", False, True, 0.3, id="flash-causal-scale"),
    pytest.param("efficient", False, False, None, id="efficient"),
    pytest.param("efficient", True, False, None, id="efficient-bias"),
    pytest.param("efficient", False, True, 0.3, id="efficient-causal-scale"),
    pytest.param("cudnn", False, False, None, id="cudnn"),
    pytest.param("cudnn", True, False, 0.3, id="cudnn-bias-scale"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "bias", "causal", "scale"), CASES)
def test_cuda_attention_lowerings_match_float64(kind, bias, causal, scale, dtype):
    q, k, v, mask = _inputs(dtype, bias)
    grad = random_tensor((2, 3, L, E), dtype=dtype)
    want_out, want_grads = _reference(q, k, v, mask, causal, scale, grad)
    out_size, grad_sizes = _magnitudes(q, k, v, mask, causal, scale, grad, dtype)
    jq, jk, jv, jgrad = map(_jax, (q, k, v, grad))
    jmask = None if mask is None else _jax(mask)
    if kind == "flash":
        op = aten._scaled_dot_product_flash_attention.default
        args, kwargs = (q, k, v, 0.0, causal), {"scale": scale}
        jargs = (jq, jk, jv, 0.0, causal)
    else:
        op = getattr(aten, f"_scaled_dot_product_{kind}_attention").default
        args, kwargs = (q, k, v, mask, True, 0.0, causal), {"scale": scale}
        jargs = (jq, jk, jv, jmask, True, 0.0, causal)
    meta = _meta(op, *args, **kwargs)
    results = lower.LOWERINGS[op](*jargs, scale=scale, meta=meta)
    _check_layout(results, meta)
    out, lse = results[0], results[1]
    assert_close(_torch(out), want_out, dtype=dtype, terms=S, magnitude=out_size, msg="out")

    if kind == "flash":
        backward = aten._scaled_dot_product_flash_attention_backward.default
        rest = results[2:]
        grads = lower.LOWERINGS[backward](
            jgrad, jq, jk, jv, out, lse, *rest[:4], 0.0, causal, *rest[4:6], scale=scale
        )
    elif kind == "efficient":
        backward = aten._scaled_dot_product_efficient_attention_backward.default
        mask_grad = mask is not None
        bwd_args = (grad, q, k, v, mask, want_out.to(dtype), torch.zeros(2, 3, 32))
        bwd_meta = _meta(
            backward, *bwd_args, torch.zeros(()), torch.zeros(()), 0.0,
            [True, True, True, mask_grad], causal, scale=scale,
        )  # fmt: skip
        grads = lower.LOWERINGS[backward](
            jgrad, jq, jk, jv, jmask, out, lse, results[2], results[3], 0.0,
            [True, True, True, mask_grad], causal, scale=scale, meta=bwd_meta,
        )  # fmt: skip
        assert (grads[3] is None) == (not mask_grad)
    else:
        backward = aten._scaled_dot_product_cudnn_attention_backward.default
        grads = lower.LOWERINGS[backward](
            jgrad, jq, jk, jv, out, lse, results[6], results[7], jmask, results[2], results[3],
            results[4], results[5], 0.0, causal, scale=scale,
        )  # fmt: skip
    for name, got, want, size in zip(("dq", "dk", "dv", "dbias"), grads, want_grads, grad_sizes):
        if got is None:
            continue
        assert_close(_torch(got), want, dtype=dtype, terms=max(L, S), magnitude=size, msg=name)


def test_dropout_in_fused_attention_is_refused():
    q = jnp.ones((1, 1, 2, 4), jnp.float32)
    meta = _meta(aten._scaled_dot_product_flash_attention.default, *[torch.ones(1, 1, 2, 4)] * 3)
    op = lower.LOWERINGS[aten._scaled_dot_product_flash_attention.default]
    with pytest.raises(NotImplementedError, match="dropout"):
        op(q, q, q, 0.1, meta=meta)


def test_flash_lowering_with_fewer_key_value_heads_matches_float64():
    """Grouped-query attention: 4 query heads share 2 key/value heads."""
    q = random_tensor((2, 4, L, E))
    k, v = random_tensor((2, 2, S, E)), random_tensor((2, 2, S, E))
    grad = random_tensor((2, 4, L, E))
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    want = F.scaled_dot_product_attention(q64, k64, v64, enable_gqa=True)
    want.backward(grad.double())
    forward = aten._scaled_dot_product_flash_attention.default
    meta = _meta(forward, q, k, v)
    jq, jk, jv, jgrad = map(_jax, (q, k, v, grad))
    results = lower.LOWERINGS[forward](jq, jk, jv, meta=meta)
    _check_layout(results, meta)
    assert_close(_torch(results[0]), want.detach().float(), dtype=torch.float32, scale=2.0)
    backward = lower.LOWERINGS[aten._scaled_dot_product_flash_attention_backward.default]
    rest = results[2:]
    grads = backward(jgrad, jq, jk, jv, *results[:2], *rest[:4], 0.0, False, *rest[4:6])
    for name, got, t in zip(("dq", "dk", "dv"), grads, (q64, k64, v64)):
        assert tuple(got.shape) == tuple(t.shape)
        assert_close(_torch(got), t.grad.float(), dtype=torch.float32, scale=4.0, msg=name)


def test_efficient_backward_without_saved_logsumexp_recomputes_it():
    q, k, v, mask = _inputs(torch.float32, bias=True)
    grad = random_tensor((2, 3, L, E))
    _, want_grads = _reference(q, k, v, mask, False, None, grad)
    forward = aten._scaled_dot_product_efficient_attention.default
    meta = _meta(forward, q, k, v, mask, False)
    jq, jk, jv, jgrad, jmask = map(_jax, (q, k, v, grad, mask))
    out, lse, seed, offset = lower.LOWERINGS[forward](jq, jk, jv, jmask, False, meta=meta)
    assert lse.shape == (2, 3, 0)
    backward = aten._scaled_dot_product_efficient_attention_backward.default
    grads = lower.LOWERINGS[backward](
        jgrad, jq, jk, jv, jmask, out, lse, seed, offset, 0.0, [True, True, True, False],
        meta=(None, None, None, None),
    )  # fmt: skip
    for name, got, want in zip(("dq", "dk", "dv"), grads[:3], want_grads):
        assert_close(_torch(got), want.float(), dtype=torch.float32, scale=4.0, msg=name)

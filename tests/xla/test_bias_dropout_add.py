"""Bias-dropout-add in XLA: the lowering computes the same mask bits as eager torch for the
same seed, and a block using the op is one XLA program per direction under fullgraph=True."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fusedops.ops.bias_dropout_add import draw_seed, reference
from fusedops.testing import assert_close, random_tensor
from fusedops.xla import partial_trace
from fusedops.xla.lower import LOWERINGS
from tests.test_bias_dropout_add import Block

ops = torch.ops.fusedops


def _jax(t: torch.Tensor):
    return jnp.asarray(t.detach().numpy())


def _torch(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a))


@pytest.mark.parametrize(
    ("shape", "with_bias", "p"), [((6, 36), True, 0.1), ((5, 7), True, 0.5), ((999,), False, 0.9)]
)
def test_lowering_matches_eager_bit_for_bit(shape, with_bias, p):
    x = random_tensor(shape)
    bias = random_tensor(shape[-1:]) if with_bias else None
    residual = random_tensor(shape)
    grad = random_tensor(shape)
    seed = draw_seed(torch.device("cpu"))
    out = reference.forward(x, bias, residual, seed, p)
    bias_dtype = torch.float32 if with_bias else None
    grad_x, grad_bias = reference.backward(grad, seed, p, torch.float32, bias_dtype)
    with jax.enable_x64(True):
        jbias = None if bias is None else _jax(bias)
        forward = LOWERINGS[ops.bias_dropout_add.default]
        got = forward(_jax(x), jbias, _jax(residual), _jax(seed), p)
        backward = LOWERINGS[ops.bias_dropout_add_backward.default]
        got_x, got_bias = backward(_jax(grad), _jax(seed), p, torch.float32, bias_dtype)
    got, got_x = _torch(got), _torch(got_x)
    # the same elements dropped (exactly residual) and kept, the same values
    assert torch.equal(got == residual, out == residual)
    assert torch.equal(got_x == 0, grad_x == 0)
    assert_close(got, out.double())
    assert_close(got_x, grad_x.double())
    if with_bias:
        assert_close(_torch(got_bias), grad_bias.double())


def test_block_is_one_program_per_direction_and_consistent():
    """Under partial_trace(fullgraph=True) the seed is drawn in the program (its random key);
    the output and the backward must agree on one mask: out = x where dropped, x + h * 2 where
    kept; grad of h's input is zero exactly where dropped."""
    torch.manual_seed(0)
    block = Block(p=0.5)
    traced = partial_trace(block, fullgraph=True)
    x = random_tensor((16, 8)).requires_grad_()
    out = traced(x)
    out.backward(torch.ones_like(out))
    assert traced.stats.programs == 2
    h = torch.nn.functional.linear(x.detach(), block.linear.weight.detach())
    v = h + block.linear.bias.detach()
    kept = (out.detach() - x.detach()).abs() > 1e-6
    assert 0 < kept.float().mean() < 1
    assert_close(out.detach()[kept], (x.detach() + 2 * v)[kept].double())
    assert_close(out.detach()[~kept], x.detach()[~kept].double())
    # d out / d bias = 2 where kept: the backward regenerated the forward's mask
    assert_close(block.linear.bias.grad, 2 * kept.double().sum(0))
    # another call draws another seed: another mask
    again = traced(x)
    assert not torch.equal((again.detach() - x.detach()).abs() > 1e-6, kept)


@pytest.mark.parametrize(
    ("op", "args", "low", "high"),
    [
        (torch.ops.aten.randint.low, (5, 17, [4000]), 5, 17),
        (torch.ops.aten.randint.default, (9, [4000]), 0, 9),
        (torch.ops.aten.randint.low, (0, 2**62, [2000]), 0, 2**62),  # the seed's draw
    ],
)
def test_randint_lowering_range_and_dtype(op, args, low, high):
    from fusedops.xla import rng

    meta = op(*args)
    with jax.enable_x64(True):
        seed = jnp.asarray(rng.next_seed())
        got = _torch(LOWERINGS[op](*args, meta=meta, key=rng.key_for(seed, 0)))
    assert got.dtype == torch.int64 and got.shape == meta.shape
    assert low <= got.min() and got.max() < high
    if high - low < 100:
        assert torch.equal(got.unique(), torch.arange(low, high))  # every value drawn
    else:
        assert got.max() >= high // 2 and got.double().mean() / high == pytest.approx(0.5, abs=0.05)

"""Random keys for XLA regions, drawn from torch's default generator.

Each call of a region that draws random numbers (dropout, rand, bernoulli) takes a fresh seed
from ``torch.default_generator``: results are reproducible under ``torch.manual_seed`` and
masks change from call to call. Inside the program each random op folds its own index into the
key, so two dropout layers never share a mask.
"""

from __future__ import annotations

import numpy as np
import torch

#: XLA's own RngBitGenerator: compiles far faster on CPU than threefry (which XLA unrolls)
IMPL = "unsafe_rbg"
SEED_WORDS = 4


def next_seed() -> np.ndarray:
    """A uint32[4] seed (an rbg key's data) drawn from torch's default CPU generator."""
    return torch.randint(0, 2**32, (SEED_WORDS,), dtype=torch.int64).numpy().astype(np.uint32)


def key_for(seed, index: int):
    """The ``jax.random`` key of random op number ``index`` for this call's ``seed``."""
    import jax
    import jax.numpy as jnp

    data = seed.at[0].set(seed[0] ^ jnp.uint32(index * 0x9E3779B9 % 2**32))
    return jax.random.wrap_key_data(data, impl=IMPL)

"""Zero-copy crossings between torch CPU tensors and JAX arrays.

torch -> JAX: parameters (``nn.Parameter``) are imported once and their JAX views cached, keyed
by storage pointer, shape, stride and dtype; a view that aliases the torch memory stays valid
when the optimizer updates the parameter in place, one that had to be copied is renewed when the
tensor's ``_version`` moves. Other tensors cross as NumPy views of their memory, which ``jax.jit``
takes without a copy. JAX -> torch: DLPack. bfloat16 (which NumPy lacks) crosses by DLPack.
"""

from __future__ import annotations

from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import torch

_CACHE_SIZE = 4096
_param_cache: OrderedDict[int, tuple] = OrderedDict()


def _import(t: torch.Tensor):
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return jnp.from_dlpack(t)
    return t.numpy()


def _cached_param(t: torch.Tensor):
    ptr = t.data_ptr()
    entry = _param_cache.get(ptr)
    if entry is not None:
        shape, stride, dtype, version, aliased, array = entry
        if (
            shape == t.shape
            and dtype == t.dtype
            and stride == t.stride()
            and (aliased or version == t._version)
        ):
            return array
    view = _import(t)
    array = view if isinstance(view, jax.Array) else jax.device_put(view)
    aliased = array.unsafe_buffer_pointer() == ptr
    _param_cache[ptr] = (t.shape, t.stride(), t.dtype, t._version, aliased, array)
    if len(_param_cache) > _CACHE_SIZE:
        _param_cache.popitem(last=False)
    return array


def to_jax(t):
    """A torch CPU tensor (any dtype XLA holds, any shape) as something ``jax.jit`` takes
    without a copy: a cached ``jax.Array`` for parameters, a NumPy view otherwise. Non-tensors
    pass through."""
    if not isinstance(t, torch.Tensor):
        return t
    if isinstance(t, torch.nn.Parameter):
        return _cached_param(t)
    return _import(t)


def to_torch(a) -> torch.Tensor:
    """A JAX array (computation finished) as a torch tensor sharing its memory (DLPack)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    return torch.from_dlpack(a)


def clear_cache() -> None:
    """Forget every cached parameter view."""
    _param_cache.clear()

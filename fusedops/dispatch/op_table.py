"""The table of registered ops: each op module registers its op here (``register_op``) with
its reference namespace and the options of ``Op``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: The dtypes fusedops' kernels take (an op's default ``dtypes``).
KERNEL_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

_OPS: dict[str, Op] = {}
_lock = threading.Lock()


@dataclass(eq=False)
class Op:
    """One op's registration.

    name: the dispatch name (``fusedops::<name>`` custom op).
    reference: namespace of the plain-PyTorch implementation's functions.
    kernels: the kernel modules' name (``fusedops.kernels.<family>.<kernels>``); None: the op
        has no kernels.
    dtypes: main-input dtypes its kernels take.
    preference: kernel backends in the order the automatic pick tries them for this op (only
        those named); None: every kernel backend at its own position (cuda, then triton).
    unsupported_reasons: the op module's ``unsupported_reasons(backend, *tensors) -> list[str]``,
        its limits per backend name (empty list: that backend takes these tensors). None: no
        limits beyond ``dtypes``.
    native: namespace with the reference's function names written with PyTorch's native ops;
        None: the reference serves as the native backend.
    """

    name: str
    reference: Any
    kernels: str | None = None
    dtypes: frozenset = KERNEL_DTYPES
    preference: tuple[str, ...] | None = None
    unsupported_reasons: Callable[..., list[str]] | None = None
    native: Any = None
    #: backend name -> implementation, filled on first selection
    _impls: dict = field(default_factory=dict, compare=False, repr=False)
    #: derived data (verified source files, forced refusals), dropped when backends change
    _cache: dict = field(default_factory=dict, compare=False, repr=False)
    #: the automatic rule's plan (``fusedops.dispatch``), dropped when backends change
    _plan: Any = field(default=None, compare=False, repr=False)


def register_op(name: str, reference: Any, **options: Any) -> Op:
    """Register (or re-register) op ``name`` with its reference namespace and the options of
    ``Op`` (``kernels="<module>"``: its kernels are ``fusedops.kernels.<family>.<module>``)."""
    op = Op(name=name, reference=reference, **options)
    with _lock:
        _OPS[name] = op
    return op

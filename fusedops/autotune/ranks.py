"""Decisions shared by the ranks of ``torch.distributed``.

A region's first call comes on every rank at the same step (DDP calls the forward on every
rank), so there the ranks compare their signatures (``same``, one collective). Where they are
equal the decision is shared: every rank runs the same trials in the same order, a candidate
that failed on any rank is dropped, rank 0's times decide and its decision (cache hits
included, and each fused module's backend pick made inside those trials) is broadcast.

A signature met later may come to one rank alone (text padded per batch, a last batch of
another size), and first calls may differ in the same way, so those decisions are the rank's
own, with no collective: no rank ever waits on a collective another skips. Each candidate
computes the model's function within the tolerance table, so ranks running different picks for
such a signature still agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_sharing = False


def several() -> bool:
    """Whether torch.distributed runs with more than one rank."""
    distributed = torch.distributed
    return (
        distributed.is_available()
        and distributed.is_initialized()
        and distributed.get_world_size() > 1
    )


def same(value: Any) -> bool:
    """Whether every rank holds the same ``value`` (a collective: every rank calls it at the
    same point); True with one rank."""
    if not several():
        return True
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return all(item == gathered[0] for item in gathered)


@contextlib.contextmanager
def shared(collective: bool) -> Iterator[None]:
    """Within the block, ``from_rank0`` and ``union`` are collectives (every rank runs the
    block at the same point) where ``collective`` and there are several ranks; else they
    return the rank's own value."""
    global _sharing
    before = _sharing
    _sharing = collective and several()
    try:
        yield
    finally:
        _sharing = before


def sharing() -> bool:
    """Whether the current decision is shared by the ranks (``shared``)."""
    return _sharing


def from_rank0(value: Any) -> Any:
    """``value`` as rank 0 has it, in a shared decision; else ``value``."""
    if not _sharing:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def union(values: set) -> set:
    """The union of ``values`` over the ranks, in a shared decision; else ``values``."""
    if not _sharing:
        return values
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, sorted(values))
    return {v for found in gathered for v in found}


def rank0() -> bool:
    """Whether this process decides for the others (rank 0, or the only one), in a shared
    decision; every rank decides for itself otherwise."""
    return not _sharing or torch.distributed.get_rank() == 0

"""The SGD step's backend interface, shared by every backend's ``step`` (the reference and
native ones in fusedops/ops/sgd.py, the Triton and CUDA kernels): ``step(*lists, **options)``,
the five lists of ``LISTS`` (layout: fusedops.ops.sgd's docstring) positionally and the
hyperparameters of ``StepOptions`` by keyword."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

#: The lists a backend's ``step`` takes, in order.
LISTS = ("params", "grads", "momentum_buffers", "masters", "firsts")


class StepOptions(NamedTuple):
    """The hyperparameters a backend's ``step`` takes by keyword: floats and bools, and 0-d
    float32 tensors on the params' device or None (``lr_tensor``: the learning rate read on the
    device, ``lr`` is then ignored; ``grad_scale``, ``found_inf``)."""

    lr: float
    lr_tensor: torch.Tensor | None
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    maximize: bool
    grad_scale: torch.Tensor | None
    found_inf: torch.Tensor | None


def step_arguments(
    lists: Sequence[list[torch.Tensor]], options: dict[str, Any]
) -> tuple[list[list[torch.Tensor]], StepOptions]:
    """A backend ``step(*lists, **options)``'s arguments checked: the five lists of ``LISTS``
    and the options as a ``StepOptions`` (TypeError naming a missing or unknown option)."""
    if len(lists) != len(LISTS):
        raise TypeError(f"step takes the {len(LISTS)} lists {', '.join(LISTS)}, got {len(lists)}")
    try:
        return list(lists), StepOptions(**options)
    except TypeError as error:
        raise TypeError(f"step's options ({', '.join(StepOptions._fields)}): {error}") from None

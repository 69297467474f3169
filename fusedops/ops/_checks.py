"""Input validation shared by every op: errors name the argument at fault."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(value, name: str, dtypes=FLOAT_DTYPES) -> torch.Tensor:
    """``value`` must be a tensor of one of ``dtypes``; raise TypeError naming ``name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} has dtype {value.dtype}; expected one of {allowed}")
    return value


def check_same_device(reference: torch.Tensor, reference_name: str, **others) -> None:
    """Every tensor in ``others`` (name=tensor or None) must be on ``reference``'s device."""
    for name, tensor in others.items():
        if tensor is not None and tensor.device != reference.device:
            raise ValueError(
                f"{name} is on {tensor.device} but {reference_name} is on {reference.device}"
            )

"""Argument checks shared by the seed runtime's Swin classes (``window_process``, ``fmha``)."""

from __future__ import annotations

import torch


def check_dims(t: torch.Tensor, name: str, expected: tuple, what: str) -> None:
    """``t`` must be a tensor of shape ``expected`` (given by the arguments named ``what``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, but {what} give {tuple(expected)}")

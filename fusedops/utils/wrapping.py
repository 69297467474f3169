"""``ModelWrapper``: a module that runs a model another way while the rest of PyTorch sees the
model itself: its parameters, buffers, submodules and ``state_dict`` keys, without a
``module.`` prefix.

This is the one implementation of that for fusedops' whole-model wrappers: the module
``fusedops.xla.partial_trace(model)`` returns subclasses it; a subclass defines ``forward``
(and whatever it keeps of its own) and nothing else. (``fusedops.optimize(model)`` needs no
wrapper: it returns the model itself, its ``forward`` replaced on the instance.) A checkpoint
saved from the wrapper loads into the plain model and back.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from torch import nn

#: The tables of ``nn.Module`` the wrapper shares with the model it wraps (the same dict and
#: set objects): parameters, buffers, submodules and the state-dict hooks.
SHARED_TABLES = (
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_modules",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


class ModelWrapper(nn.Module):
    """A module around ``model`` that holds the model's own tables: to ``state_dict``,
    ``parameters``, ``named_modules``, optimizers, DDP and FSDP2 it is the model.

    - ``state_dict()`` / ``load_state_dict()`` are the model's, with its keys (no ``module.``
      prefix, also as a submodule of a larger model: ``parent.backbone = wrapper`` saves
      ``backbone.<key>``), its metadata and its hooks; a checkpoint saved from the wrapper loads
      into the plain model and the other way round.
    - ``parameters()`` / ``named_parameters()`` / ``buffers()`` are the model's tensors (the same
      objects) under the model's names; ``named_modules()`` gives the wrapper in the model's
      place, then the model's submodules under their names.
    - ``train()`` / ``eval()`` switch the model (and the wrapper's own flag); ``to()`` /
      ``cuda()`` / ``half()`` ... and ``apply(fn)`` act on the model (``fn`` sees the model).
    - Reading an attribute the wrapper does not have reads the model's (``wrapper.config``,
      ``wrapper.generate``); parameters, buffers and submodules set on the wrapper land in the
      model (the tables are shared); other attributes set on the wrapper stay on it.
    - ``module``: the wrapped model (as ``DistributedDataParallel.module``; a submodule the
      model itself names ``module`` is ``wrapper.module.module``).
    - Forward hooks registered on the wrapper run around the wrapper's call, the model's own
      around the model's call inside ``forward``; state-dict hooks registered on either are
      the model's (one table).

    Subclasses define ``forward``; this one calls the model. A subclass keeps a module of its
    own (a compiled copy...) with ``object.__setattr__``: assigned as an attribute it would
    become a submodule of the model, whose submodule table the wrapper shares.
    """

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        super().__init__()
        object.__setattr__(self, "_wrapped", model)
        for name in SHARED_TABLES:
            object.__setattr__(self, name, model.__dict__[name])
        object.__setattr__(self, "training", model.training)

    @property
    def module(self) -> nn.Module:
        """The wrapped model."""
        return self.__dict__["_wrapped"]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # the model's parameters, buffers, submodules
        except AttributeError:
            wrapped = self.__dict__.get("_wrapped")
            if wrapped is None or name.startswith("__"):
                raise
            return getattr(wrapped, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self.module)))

    # ------------------------------------------------------------------ state dict
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The model's ``state_dict``: its keys (under ``prefix``), metadata and hooks."""
        return self.module.state_dict(
            *args, destination=destination, prefix=prefix, keep_vars=keep_vars
        )

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """The model's ``load_state_dict``: keys as ``state_dict()`` gives them."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        # Inside a parent's load_state_dict: the model loads its own entries under the
        # wrapper's prefix; the parent then walks the (shared) submodules.
        self.module._load_from_state_dict(*args, **kwargs)

    # ------------------------------------------------------------------ modes, devices
    def train(self, mode: bool = True) -> ModelWrapper:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        object.__setattr__(self, "training", mode)
        self.module.train(mode)
        return self

    def _apply(self, fn: Callable, recurse: bool = True) -> ModelWrapper:
        self.module._apply(fn, recurse)
        return self

    def apply(self, fn: Callable[[nn.Module], None]) -> ModelWrapper:
        self.module.apply(fn)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(\n{textwrap.indent(repr(self.module), '  ')}\n)"

"""``auto_checkpoint``: activation checkpointing of the fewest repeated blocks of a model that
brings its saved activations under a memory budget, measured on the model's first forward.

``model = auto_checkpoint(model)`` (TorchAcc's ``torchacc.auto_checkpoint``) checkpoints the
model in place and returns it; ``checkpoint_plan(model)`` is what was measured and wrapped (a
``CheckpointPlan``), ``undo_checkpoint(model)`` restores the model's own forwards.
"""

from __future__ import annotations

import types
from collections import defaultdict

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fusedops.utils._streams import tensors_in

_OUTSIDE = "<outside blocks>"
#: Where a checkpointed model keeps its plan (an instance attribute: copies and pickles of the
#: model carry it along with the wrapped forwards; ``checkpoint_plan`` reads it).
_PLAN = "_fusedops_checkpoint_plan"


def _checkpointed_forward(self, *args, **kwargs):
    """The block's class forward under non-reentrant checkpointing (RNG state preserved, so
    dropout recomputes the same masks); plain when no graph is being recorded."""
    forward = type(self).forward.__get__(self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def _storage(t: torch.Tensor) -> tuple[object, int]:
    """(identity, bytes) of the memory behind ``t``; views of one storage count once."""
    try:
        storage = t.untyped_storage()
        return (t.device, storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # storage-less tensor subclasses
        return ("id", id(t)), t.numel() * t.element_size()


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of ``model``: children of an ``nn.ModuleList``/``nn.Sequential``
    that share their class with another child of it and have submodules of their own (a lone
    Linear is no block: checkpointing it keeps its input, all it saves), the outermost such
    containers (nothing inside a chosen block is chosen), as (qualified name, module) in model
    order."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        if any(name.startswith(f"{b}.") or name == b for b, _ in blocks):
            continue
        by_class: dict[type, int] = defaultdict(int)
        for child in container.children():
            by_class[type(child)] += 1
        prefix = f"{name}." if name else ""
        blocks += [
            (prefix + child_name, child)
            for child_name, child in container.named_children()
            if by_class[type(child)] >= 2 and next(child.children(), None) is not None
        ]
    return blocks


def _budget_bytes(memory_budget, total: int, device: torch.device) -> int:
    if memory_budget is None:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        return total // 2
    if isinstance(memory_budget, float):
        return int(memory_budget * total)
    return memory_budget


class CheckpointPlan:
    """What ``auto_checkpoint`` measured and wrapped. Attributes (valid once ``measured``):

    blocks: candidate block names; saved: bytes each block's forward saved for backward
    (parameters excluded, each storage counted once); total: all saved bytes of the forward;
    savings: bytes checkpointing each block frees (its saved bytes minus the inputs the
    checkpoint keeps); wrapped: the checkpointed block names; expected_saving; budget (bytes).
    ``report()`` says it in words; ``measure(*inputs)`` measures and wraps now; ``undo()``
    restores the model (``undo_checkpoint(model)``). Read it with ``checkpoint_plan(model)``.
    """

    def __init__(self, model: nn.Module, memory_budget):
        self.model = model
        self.memory_budget = memory_budget
        self._blocks = find_blocks(model)
        self.blocks = [name for name, _ in self._blocks]
        self.measured = False
        self.saved: dict[str, int] = {}
        self.savings: dict[str, int] = {}
        self.total = 0
        self.budget = 0
        self.wrapped: list[str] = []
        self.expected_saving = 0
        self._handles: list = []
        self._hooks_context = None
        self._stack: list[str] = []
        self._owner: dict[object, str] = {}
        self._bytes: dict[object, int] = {}
        self._inputs: dict[str, set] = defaultdict(set)
        self._device = torch.device("cpu")
        if self._blocks:
            self._install()

    # ------------------------------------------------------------ measuring
    def _install(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._start))
        self._handles.append(self.model.register_forward_hook(self._finish, always_call=True))
        for name, block in self._blocks:
            self._handles.append(block.register_forward_pre_hook(self._enter(name)))
            self._handles.append(block.register_forward_hook(self._leave, always_call=True))

    def _measuring(self) -> bool:
        return self._hooks_context is not None

    def _start(self, module, args) -> None:
        if self._measuring() or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return
        params = {_storage(t)[0] for t in (*module.parameters(), *module.buffers())}
        owner, sizes = self._owner, self._bytes

        def pack(t):
            key, nbytes = _storage(t)
            if key not in params and key not in owner:
                owner[key] = self._stack[-1] if self._stack else _OUTSIDE
                sizes[key] = nbytes
            return t

        self._hooks_context = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks_context.__enter__()

    def _enter(self, name: str):
        def hook(module, args, kwargs=None) -> None:
            if self._measuring():
                self._stack.append(name)
                for t in tensors_in(args):
                    key, nbytes = _storage(t)
                    self._inputs[name].add(key)
                    self._bytes.setdefault(key, nbytes)
                    self._device = t.device

        return hook

    def _leave(self, module, args, output) -> None:
        if self._measuring() and self._stack:
            self._stack.pop()

    def _finish(self, module, args, output) -> None:
        if not self._measuring():
            return
        self._hooks_context.__exit__(None, None, None)
        self._hooks_context = None
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._plan()

    def _plan(self) -> None:
        saved: dict[str, int] = defaultdict(int)
        for key, name in self._owner.items():
            saved[name] += self._bytes[key]
        self.total = sum(saved.values())
        self.saved = {name: saved.get(name, 0) for name in self.blocks}
        for name in self.blocks:
            kept = sum(
                self._bytes[key]
                for key in self._inputs[name]
                if self._owner.get(key) in (None, name)
            )
            self.savings[name] = max(self.saved[name] - kept, 0)
        self.budget = _budget_bytes(self.memory_budget, self.total, self._device)
        remaining = self.total
        chosen = []
        for name in sorted(self.blocks, key=lambda n: -self.savings[n]):
            if remaining <= self.budget or self.savings[name] == 0:
                break
            chosen.append(name)
            remaining -= self.savings[name]
        self.wrapped = [name for name in self.blocks if name in chosen]
        self.expected_saving = self.total - remaining
        for name, block in self._blocks:
            if name in chosen:
                block.forward = types.MethodType(_checkpointed_forward, block)
        self.measured = True
        self._owner, self._bytes, self._inputs = {}, {}, defaultdict(set)

    def measure(self, *args, **kwargs) -> CheckpointPlan:
        """Run one forward of the model on ``args``/``kwargs`` with grad enabled (eagerly) to
        measure and wrap now, e.g. before ``torch.compile``; the output is discarded."""
        if not self.measured and self._blocks:
            with torch.enable_grad():
                self.model(*args, **kwargs)
        return self

    # ------------------------------------------------------------- results
    def undo(self) -> None:
        """Unwrap every block and drop the measuring hooks: the model is as before."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for _, block in self._blocks:
            if getattr(block.__dict__.get("forward"), "__func__", None) is _checkpointed_forward:
                del block.__dict__["forward"]
        self.wrapped = []
        self.expected_saving = 0

    def report(self) -> str:
        """What was found, measured and wrapped, in a few lines."""
        if not self._blocks:
            return (
                "auto_checkpoint: no repeated blocks (ModuleList/Sequential children of one class)"
            )
        lines = [f"auto_checkpoint: {len(self.blocks)} repeated blocks"]
        if not self.measured:
            lines.append(
                "  not measured yet: the first forward with grad enabled measures and wraps"
            )
            return "\n".join(lines)
        lines.append(
            f"  saved activations {_mib(self.total)} unchecked, budget {_mib(self.budget)}"
        )
        lines.append(
            f"  wrapped {len(self.wrapped)}: {', '.join(self.wrapped) or 'none'}; expected saving "
            f"{_mib(self.expected_saving)} -> {_mib(self.total - self.expected_saving)}"
        )
        if self.total - self.expected_saving > self.budget:
            lines.append("  the budget is not reached even with every block checkpointed")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.report()


def auto_checkpoint(model: nn.Module, memory_budget: float | int | None = None) -> nn.Module:
    """Checkpoint the fewest repeated blocks of ``model`` so its saved activations fit a budget;
    returns ``model``, checkpointed in place (``model = fusedops.auto_checkpoint(model)``, as
    TorchAcc's ``torchacc.auto_checkpoint``).

    Finds the repeated blocks (``find_blocks``), measures on the model's first forward with grad
    enabled the bytes each block saves for backward (``saved_tensors_hooks``), then wraps the
    blocks that free the most, largest first, in non-reentrant ``torch.utils.checkpoint``
    (``use_reentrant=False``, RNG state preserved) until the saved bytes fit. Forward outputs,
    losses and gradients are bit for bit those of the unchecked model (dropout included); the
    blocks are wrapped through an instance-level ``forward``, so module names, ``state_dict``
    keys and fusedops hooks are unchanged. The measuring forward runs eagerly: under
    ``torch.compile`` / ``fusedops.xla.partial_trace``, run one step (or
    ``checkpoint_plan(model).measure(...)``) before compiling.

    memory_budget: a float in (0, 1], the fraction of the unchecked saved bytes to keep; an int
    >= 0, bytes; None: the device's free memory on CUDA, half the unchecked amount on CPU.
    ``checkpoint_plan(model)`` gives the ``CheckpointPlan`` (``report()``, ``wrapped``,
    ``expected_saving``, ``measure(...)``); ``undo_checkpoint(model)`` restores the model.
    Called again on the same model, the earlier plan is undone first and a new one made.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(memory_budget, bool):
        raise TypeError("memory_budget must be a float in (0, 1], an int of bytes or None")
    if isinstance(memory_budget, float):
        if not 0.0 < memory_budget <= 1.0:
            raise ValueError(f"memory_budget as a fraction must be in (0, 1], got {memory_budget}")
    elif isinstance(memory_budget, int):
        if memory_budget < 0:
            raise ValueError(f"memory_budget in bytes must be >= 0, got {memory_budget}")
    elif memory_budget is not None:
        raise TypeError(
            "memory_budget must be a float in (0, 1], an int of bytes or None, "
            f"got {type(memory_budget).__name__}"
        )
    if model.__dict__.get(_PLAN) is not None:
        undo_checkpoint(model)
    model.__dict__[_PLAN] = CheckpointPlan(model, memory_budget)
    return model


def checkpoint_plan(model: nn.Module) -> CheckpointPlan:
    """The ``CheckpointPlan`` of a model ``auto_checkpoint`` checkpointed: what it found,
    measured and wrapped (``report()``, ``wrapped``, ``expected_saving``...), and
    ``measure(*inputs)`` to measure before compiling. ValueError for any other model."""
    plan = model.__dict__.get(_PLAN) if isinstance(model, nn.Module) else None
    if plan is None:
        raise ValueError(
            f"{type(model).__name__} was not checkpointed by fusedops.auto_checkpoint "
            "(or undo_checkpoint restored it)"
        )
    return plan


def undo_checkpoint(model: nn.Module) -> nn.Module:
    """Restore a model ``auto_checkpoint`` checkpointed: its blocks' own forwards back, the
    measuring hooks removed, the plan dropped; returns ``model``. ValueError for a model that
    is not checkpointed."""
    checkpoint_plan(model).undo()
    del model.__dict__[_PLAN]
    return model

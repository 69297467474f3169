"""ModelWrapper (fusedops.utils.wrapping): the wrapped model's state_dict keys, parameters,
buffers, modes, attributes and hooks, alone and as a submodule; checkpoints move between the
wrapper and the plain model both ways."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from fusedops.testing import assert_close, random_tensor
from fusedops.utils.wrapping import ModelWrapper

CPU = torch.device("cpu")


class Net(nn.Module):
    """Parameters at the root and below, a persistent and a non-persistent buffer, BatchNorm
    (metadata version 2), dropout (train/eval) and a plain attribute."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(random_tensor((6,), device=CPU))
        self.body = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Dropout(0.5))
        self.head = nn.Linear(6, 3)
        self.register_buffer("offset", random_tensor((6,), device=CPU))
        self.register_buffer("cache", torch.zeros(2, device=CPU), persistent=False)
        self.config = {"width": 6}

    def forward(self, x):
        return self.head(self.body(x * self.scale + self.offset))

    def width(self) -> int:
        return self.config["width"]


class Doubled(ModelWrapper):
    """A subclass as partial_trace's and optimize's: only forward of its own."""

    def forward(self, x):
        return 2 * self.module(x)


def _randomised(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if t.is_floating_point():
                t.copy_(random_tensor(t.shape, device=CPU))
    return model


def test_state_dict_is_the_models_and_loads_both_ways():
    plain = Net()
    wrapped = Doubled(plain)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert all(k == k.removeprefix("module.") for k in wrapped.state_dict())
    for key, value in plain.state_dict(keep_vars=True).items():
        assert wrapped.state_dict(keep_vars=True)[key] is value
    assert wrapped.state_dict()._metadata == plain.state_dict()._metadata
    # saved from the wrapper, loaded into a fresh plain model and into a fresh wrapper
    buffer = io.BytesIO()
    torch.save(wrapped.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    other = _randomised(Net())
    incompatible = other.load_state_dict(saved)
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    other_wrapped = Doubled(_randomised(Net()))
    incompatible = other_wrapped.load_state_dict(plain.state_dict())
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    for model in (other, other_wrapped):
        for key, value in plain.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), key
    # strict loading still names a key that is not the model's
    with pytest.raises(RuntimeError, match="module.head.weight"):
        Net().load_state_dict({f"module.{k}": v for k, v in plain.state_dict().items()})
    with pytest.raises(RuntimeError, match="module.head.weight"):
        other_wrapped.load_state_dict({f"module.{k}": v for k, v in plain.state_dict().items()})


def test_as_a_submodule_keys_have_no_extra_level():
    parent = nn.Sequential(nn.Linear(6, 6), Doubled(Net()))
    reference = nn.Sequential(nn.Linear(6, 6), Net())
    assert list(parent.state_dict()) == list(reference.state_dict())
    reference.load_state_dict(parent.state_dict())
    fresh = nn.Sequential(nn.Linear(6, 6), Doubled(_randomised(Net())))
    incompatible = fresh.load_state_dict(reference.state_dict())
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    for key, value in reference.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert [n for n, _ in parent.named_parameters()] == [n for n, _ in reference.named_parameters()]


def test_parameters_buffers_and_modules_are_the_models():
    plain = Net()
    wrapped = Doubled(plain)
    assert wrapped.module is plain
    pairs = zip(wrapped.named_parameters(), plain.named_parameters(), strict=True)
    assert all(a[0] == b[0] and a[1] is b[1] for a, b in pairs)
    assert [n for n, _ in wrapped.named_buffers()] == [n for n, _ in plain.named_buffers()]
    assert all(a is b for a, b in zip(wrapped.buffers(), plain.buffers(), strict=True))
    assert [n for n, _ in wrapped.named_modules()][1:] == [n for n, _ in plain.named_modules()][1:]
    assert wrapped.head is plain.head and wrapped.scale is plain.scale
    wrapped.extra = nn.Linear(2, 2)  # a submodule set on the wrapper lands in the model
    assert plain.extra is wrapped.extra
    # an optimizer over the wrapper's parameters trains the model
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    before = plain.head.weight.detach().clone()
    wrapped(random_tensor((4, 6), device=CPU)).square().mean().backward()
    optimizer.step()
    assert not torch.equal(plain.head.weight, before)


def test_attributes_modes_devices_and_hooks():
    plain = Net()
    wrapped = Doubled(plain)
    assert wrapped.config is plain.config and wrapped.width() == 6
    with pytest.raises(AttributeError, match="missing"):
        wrapped.missing  # noqa: B018
    wrapped.eval()
    assert not wrapped.training and not plain.training
    assert not any(m.training for m in plain.modules())
    x = random_tensor((4, 6), device=CPU)
    assert_close(wrapped(x), 2 * plain(x), msg="eval forward")
    wrapped.train()
    assert wrapped.training and all(m.training for m in plain.modules())
    nn.Sequential(wrapped).eval()  # a parent's mode reaches the model
    assert not plain.training and not plain.body[2].training
    wrapped.double()
    assert plain.head.weight.dtype == torch.float64 and plain.offset.dtype == torch.float64
    seen = []
    wrapped.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net"  # fn sees the model, not the wrapper
    calls = []
    outer = wrapped.register_forward_hook(lambda m, a, out: calls.append(("wrapper", m)))
    inner = plain.register_forward_hook(lambda m, a, out: calls.append(("model", m)))
    wrapped(random_tensor((4, 6), torch.float64, CPU))
    assert calls == [("model", plain), ("wrapper", wrapped)]
    outer.remove()
    inner.remove()
    # a state-dict hook registered through the wrapper is the model's
    handle = wrapped.register_state_dict_pre_hook(lambda m, prefix, keep: calls.append("saved"))
    plain.state_dict()
    assert calls[-1] == "saved"
    handle.remove()
    assert "Net(" in repr(wrapped) and repr(wrapped).startswith("Doubled(")


def test_copies_keep_the_tables_shared():
    wrapped = Doubled(Net())
    copied = copy.deepcopy(wrapped)
    assert copied.module is not wrapped.module
    assert copied._parameters is copied.module._parameters
    assert all(a is b for a, b in zip(copied.parameters(), copied.module.parameters()))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ModelWrapper(lambda x: x)

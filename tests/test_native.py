"""The native backend as a whole: a hooked model on CPU runs PyTorch's native ops (never the
functions or classes the hooks patch: no recursion), gives the unhooked model's results, and each
op's native namespace (the custom-op path: torch.compile, export) matches the reference."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import fusedops
from fusedops import demo, dispatch, hooks
from fusedops.ops import bias_dropout_add, layer_norm
from fusedops.testing import assert_close, random_tensor

DEVICE = torch.device("cpu")


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(24)
        self.rms = nn.RMSNorm(24)
        self.fc = nn.Linear(24, 24)
        self.act = demo.QuickGELU()  # looked up when built: the hook replaces the class

    def forward(self, x):
        h = self.fc(self.act(self.rms(self.norm(x))))
        return fusedops.bias_dropout_add(h, None, x, 0.0)


def _train_step(model, x, optimizer_class):
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    loss = model(x).square().sum()
    loss.backward()
    optimizer.step()
    return loss.detach(), [p.detach().clone() for p in model.parameters()]


def _refuse(*args, **kwargs):
    raise AssertionError("a native path called a function that hooks may replace")


def test_hooked_model_runs_native_ops_without_recursion(monkeypatch):
    x = random_tensor((3, 5, 24), torch.float32, DEVICE)
    torch.manual_seed(0)
    plain = _Model().to(DEVICE)
    want_loss, want_params = _train_step(plain, x, torch.optim.AdamW)
    dispatch.last_used.clear()
    with hooks.patched(
        "layer_norm", "rms_norm", "adamw", "quick_gelu", classes=["fusedops.demo.QuickGELU"]
    ):
        torch.manual_seed(0)
        model = _Model().to(DEVICE)
        assert type(model.norm).__module__.startswith("fusedops")
        assert type(model.rms).__module__.startswith("fusedops")
        # what the hooks (or a user's patch) may replace must not be called by native code
        for name in ("layer_norm", "rms_norm", "dropout"):
            monkeypatch.setattr(F, name, _refuse)
        loss, params = _train_step(model, x, torch.optim.AdamW)
        monkeypatch.undo()
        assert torch.optim.AdamW.__module__.startswith("fusedops")
    for op in ("layer_norm", "rms_norm", "quick_gelu", "adam", "bias_dropout_add"):
        assert dispatch.last_used[op] == "native", op
    assert_close(loss, want_loss.double(), scale=x.numel())
    for mine, theirs in zip(params, want_params):
        assert_close(mine, theirs.double(), scale=4.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_namespaces_match_the_reference(dtype):
    """The custom ops' native functions (torch.native_layer_norm, aten._fused_rms_norm, their
    backwards) against the reference's, statistics included."""
    x = random_tensor((7, 40), dtype, DEVICE)
    w, b = random_tensor((40,), dtype, DEVICE), random_tensor((40,), dtype, DEVICE)
    dy = random_tensor((7, 40), dtype, DEVICE)
    native, reference = layer_norm.native, layer_norm.reference
    got = native.layer_norm_forward(x, w, b, 1e-5)
    want = reference.layer_norm_forward(x, w, b, 1e-5)
    for mine, theirs in zip(got, want):
        assert mine.dtype == theirs.dtype
        assert_close(mine, theirs.double(), dtype=dtype, scale=4.0)
    grads = native.layer_norm_backward(dy, x, w, b, *want[1:])
    for mine, theirs in zip(grads, reference.layer_norm_backward(dy, x, w, b, *want[1:])):
        assert mine.dtype == theirs.dtype
        assert_close(mine, theirs.double(), dtype=dtype, scale=8.0)
    y, rstd = native.rms_norm_forward(x, w, 1e-6)
    want_y, want_rstd = reference.rms_norm_forward(x, w, 1e-6)
    assert_close(y, want_y.double(), scale=4.0)
    assert_close(rstd, want_rstd.double(), dtype=dtype)


def test_bias_dropout_add_namespace_and_eager_agree():
    """The native namespace (custom op) and the eager path give the same bits for one seed."""
    x, residual = (random_tensor((6, 16), torch.float32, DEVICE) for _ in range(2))
    bias = random_tensor((16,), torch.float32, DEVICE)
    seed = bias_dropout_add.draw_seed(DEVICE)
    eager = bias_dropout_add._native_eager(x, bias, residual, seed, 0.4)
    op = bias_dropout_add.native.forward(x, bias, residual, seed, 0.4)
    assert torch.equal(eager, op)
    assert 0 < (eager == residual).sum() < eager.numel()

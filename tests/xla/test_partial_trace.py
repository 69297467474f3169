"""partial_trace(backend="xla") on whole models: outputs, gradients and buffers match eager."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from fusedops.testing import assert_close, random_tensor
from fusedops.xla import UnsupportedOpsError, XLATraceError, partial_trace
from tests.xla import models

pytest.importorskip("jax")


def _check_step(model, traced_call, *inputs, loss=lambda out, *_: out.square().mean()):
    """One forward+backward through eager and through ``traced_call``; compare everything."""
    model.zero_grad(set_to_none=True)
    ref = copy.deepcopy(model)
    out = traced_call(model, *inputs)
    loss(out, *inputs).backward()
    expected = ref(*inputs)
    loss(expected, *inputs).backward()
    assert_close(out, expected, dtype=torch.float32, scale=2.0, msg="output")
    got, want = models.grads(model), models.grads(ref)
    assert got.keys() == want.keys() and got
    for name in want:
        assert_close(got[name], want[name], dtype=torch.float32, scale=4.0, msg=name)
    return ref


def test_mlp_forward_backward_match_eager():
    model = models.mlp()

    @partial_trace
    def backbone(model, x):
        return model(x)

    x = random_tensor((6, 8)).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = copy.deepcopy(model)
    backbone(model, x).square().mean().backward()
    ref(x_ref).square().mean().backward()
    assert_close(x.grad, x_ref.grad, dtype=torch.float32, scale=4.0)
    _check_step(model, backbone, random_tensor((6, 8)))
    # x with / without requires_grad: two regions, each one forward and one backward program
    assert backbone.stats.regions == 2 and backbone.stats.programs == 4


@pytest.mark.parametrize("training", [True, False])
def test_vit_stack_matches_eager(training):
    torch.manual_seed(0)
    model = models.ViT(depth=1, p=0.0 if training else 0.1).train(training)

    @partial_trace(backend="xla")
    def backbone(model, x):
        return model(x)

    _check_step(model, backbone, random_tensor((2, 6, 12)))


def test_dropout_masks_follow_the_torch_seed_and_backward_uses_the_same_mask():
    @partial_trace
    def drop(x):
        return F.dropout(x, 0.5, training=True) * 3.0

    x = random_tensor((64, 32), low=0.5, high=2.0)
    torch.manual_seed(7)
    a = drop(x)
    b = drop(x)
    torch.manual_seed(7)
    c = drop(x)
    assert torch.equal(a, c), "same seed must give the same mask"
    assert not torch.equal(a != 0, b != 0), "two calls must draw different masks"
    kept = (a != 0).float().mean().item()
    assert 0.4 < kept < 0.6
    assert_close(a[a != 0], (x * 6.0)[a != 0], dtype=torch.float32)

    xg = x.clone().requires_grad_(True)
    out = drop(xg)
    out.sum().backward()
    assert_close(xg.grad, (out != 0).float() * 6.0, dtype=torch.float32)


def test_vit_with_dropout_trains_reproducibly():
    model = models.ViT(depth=1, p=0.1).train()
    traced = partial_trace(model)
    x = random_tensor((2, 6, 12))
    torch.manual_seed(3)
    first = traced(x)
    torch.manual_seed(3)
    again = traced(x)
    other = traced(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    first.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_conv_batchnorm_train_mode_buffers_match_eager():
    model = models.ConvBN().train()
    ref = copy.deepcopy(model)

    @partial_trace
    def backbone(model, x):
        return model(x)

    for _ in range(2):
        x = random_tensor((4, 3, 9, 9))
        out = backbone(model, x)
        out.square().mean().backward()
        expected = ref(x)
        expected.square().mean().backward()
        assert_close(out, expected, dtype=torch.float32, scale=4.0)
    for name, buf in ref.named_buffers():
        got = dict(model.named_buffers())[name]
        if buf.dtype == torch.int64:
            assert torch.equal(got, buf), name
        else:
            assert_close(got, buf, dtype=torch.float32, scale=2.0, msg=name)
    for name, g in models.grads(ref).items():
        assert_close(models.grads(model)[name], g, dtype=torch.float32, scale=8.0, msg=name)
    programs = backbone.stats.programs
    model.eval()
    ref.eval()
    x = random_tensor((4, 3, 9, 9))
    assert_close(backbone(model, x), ref(x), dtype=torch.float32, scale=4.0)
    assert backbone.stats.programs > programs  # train -> eval compiled new programs


def test_embedding_cross_entropy_matches_eager():
    model = models.EmbedClassifier()
    tokens = torch.randint(0, 20, (5, 7))
    labels = torch.randint(0, 3, (5,))

    @partial_trace
    def loss_fn(model, tokens, labels):
        return F.cross_entropy(model(tokens), labels, label_smoothing=0.1)

    ref = copy.deepcopy(model)
    loss = loss_fn(model, tokens, labels)
    loss.backward()
    expected = F.cross_entropy(ref(tokens), labels, label_smoothing=0.1)
    expected.backward()
    assert_close(loss, expected, dtype=torch.float32)
    for name, g in models.grads(ref).items():
        assert_close(models.grads(model)[name], g, dtype=torch.float32, scale=2.0, msg=name)


def test_graph_break_on_item_gives_two_regions_and_correct_gradients():
    w = random_tensor((8, 8)).requires_grad_(True)

    def fn(x, w):
        h = torch.tanh(x @ w)
        scale = float(h.abs().max().item())  # graph break
        return (h / scale).sigmoid().sum()

    traced = partial_trace(fn)
    x = random_tensor((4, 8))
    w_ref = w.detach().clone().requires_grad_(True)
    out = traced(x, w)
    out.backward()
    expected = fn(x, w_ref)
    expected.backward()
    assert_close(out, expected, dtype=torch.float32)
    assert_close(w.grad, w_ref.grad, dtype=torch.float32, scale=2.0)
    assert traced.stats.regions >= 2


def _with_mode(x, w):
    return torch.mode(x @ w, -1).values.mean() + (x * 2).sum()  # aten.mode has no lowering


def test_op_outside_the_table_runs_eagerly_with_one_warning():
    w = random_tensor((6, 5), low=-0.5, high=0.5).requires_grad_(True)
    w_ref = w.detach().clone().requires_grad_(True)
    traced = partial_trace(_with_mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = random_tensor((3, 6))
            out = traced(x, w)
    named = [w for w in caught if "aten.mode" in str(w.message)]
    assert len(named) == 1
    out.backward()
    expected = _with_mode(x, w_ref)
    expected.backward()
    assert_close(out, expected, dtype=torch.float32)
    assert_close(w.grad, w_ref.grad, dtype=torch.float32, scale=2.0)
    assert "aten.mode.default" in traced.stats.eager_ops


def test_op_outside_the_table_under_fullgraph_raises_naming_it():
    traced = partial_trace(_with_mode, fullgraph=True)
    with pytest.raises(UnsupportedOpsError, match=r"aten\.mode"):
        traced(random_tensor((3, 6)), random_tensor((6, 5)))


def test_new_batch_size_recompiles_and_stays_correct(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_XLA_RECOMPILE_LIMIT", "1")
    model = models.mlp()
    traced = partial_trace(model)
    with torch.no_grad():
        for batch in (4, 4):
            x = random_tensor((batch, 8))
            assert_close(traced(x), model(x), dtype=torch.float32, scale=2.0)
        x = random_tensor((9, 8))
        with pytest.warns(UserWarning, match="XLA programs compiled"):
            out = traced(x)
        assert_close(out, model(x), dtype=torch.float32, scale=2.0)
    assert traced.stats.programs == 2  # one inference program per batch size


def test_int64_and_float64_are_exact():
    @partial_trace
    def fn(idx, x):
        big = idx * 3_000_000_000 + 7  # beyond int32
        return big // 5, x * (1.0 + 1e-12)

    idx = torch.randint(0, 1000, (16,))
    x = random_tensor((16,), torch.float64)
    big, y = fn(idx, x)
    assert big.dtype == torch.int64 and torch.equal(big, (idx * 3_000_000_000 + 7) // 5)
    assert y.dtype == torch.float64 and torch.equal(y, x * (1.0 + 1e-12))


def test_outputs_can_be_edited_in_place_without_corrupting_later_results():
    model = models.mlp()
    traced = partial_trace(model)
    x = random_tensor((4, 8))
    with torch.no_grad():
        first = traced(x)
        expected = model(x)
        first.mul_(0.0).add_(5.0)
        assert_close(traced(x), expected, dtype=torch.float32, scale=2.0)


def test_closed_over_tensors_inputs_or_constants():
    table = random_tensor((5,))

    def fn(x):
        return x * table

    as_input = partial_trace(fn)
    as_const = partial_trace(fn, capture_as_const=True)
    x = random_tensor((5,))
    before = x * table
    assert_close(as_input(x), before, dtype=torch.float32)
    assert_close(as_const(x), before, dtype=torch.float32)
    table.add_(1.0)
    assert_close(as_input(x), x * table, dtype=torch.float32)
    assert_close(as_const(x), before, dtype=torch.float32)


def test_eager_backend_runs_the_function_itself():
    def fn(x):
        return x + 1

    assert partial_trace(fn, backend="eager") is fn


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="tpu"):
        partial_trace(lambda x: x, backend="tpu")


def test_data_dependent_shape_under_fullgraph_is_a_clear_error():
    traced = partial_trace(lambda x: torch.nonzero(x > 0), fullgraph=True)
    with pytest.raises(XLATraceError, match="nonzero"):
        traced(random_tensor((6,)))


def test_item_under_fullgraph_is_a_clear_error():
    def fn(x):
        n = int(x.sum().item())
        return x * n

    with pytest.raises(XLATraceError, match="data-dependent|cannot capture"):
        partial_trace(fn, fullgraph=True)(random_tensor((4,)))


def test_traced_module_has_the_models_state_dict_parameters_and_modes(tmp_path):
    """partial_trace(model) is a ModelWrapper: the model's state_dict keys (no ``module.``;
    saved from it, loaded into the plain model and back), its parameters (the same objects),
    its attributes, train()/eval() reaching it, and the same outputs as eager in both modes."""
    from fusedops.utils.wrapping import ModelWrapper

    model = models.ConvBN()
    model.label = "convbn"
    ref = copy.deepcopy(model)
    traced = partial_trace(model)
    assert isinstance(traced, ModelWrapper) and traced.module is model
    assert list(traced.state_dict()) == list(model.state_dict())
    assert not any(key.startswith("module.") for key in traced.state_dict())
    assert all(p is q for p, q in zip(traced.parameters(), model.parameters(), strict=True))
    assert [n for n, _ in traced.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert traced.label == "convbn" and traced.bn1 is model.bn1
    x = random_tensor((2, 3, 9, 9))
    for mode in ("train", "eval"):
        getattr(traced, mode)()
        getattr(ref, mode)()
        assert model.training == (mode == "train") == model.bn2.training
        assert_close(traced(x), ref(x), dtype=torch.float32, scale=4.0, msg=mode)
    assert traced.stats.programs >= 2  # train and eval each compiled
    # the running statistics the traced train step wrote, saved from the traced module
    path = tmp_path / "traced.pt"
    torch.save(traced.state_dict(), path)
    plain = models.ConvBN()
    incompatible = plain.load_state_dict(torch.load(path))
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    for key, value in ref.state_dict().items():
        got = plain.state_dict()[key]
        if value.dtype == torch.int64:
            assert torch.equal(got, value), key
        else:
            assert_close(got, value, dtype=torch.float32, scale=2.0, msg=key)
    # and back: a plain model's checkpoint into a traced one
    other = partial_trace(models.ConvBN())
    other.load_state_dict(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key
    assert_close(other.eval()(x), ref.eval()(x), dtype=torch.float32, scale=4.0, msg="loaded")
    # inductor too: torch.compile's module would prefix the keys with _orig_mod.
    # (torch.compile's first use imports torch.jit's deprecated parts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = partial_trace(models.ConvBN(), backend="inductor")
    assert isinstance(compiled, ModelWrapper)
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert list(compiled.module._modules) == ["conv1", "bn1", "conv2", "bn2", "fc"]

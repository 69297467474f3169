"""The ported blocks of docs/migrating.md run on the CPU and give the unfused code's results.

The blocks are read from the page (fenced ```` ```python port=<name> ```` blocks, and the guides'
own ```` ```python original=<name> ````), so the page and this test cannot drift apart: every
port block has a check here and every check a block. Each check runs its block with ``exec``
in a namespace holding what the block takes from its surroundings (a model, a loader,
``self``...), at small sizes, and compares with the unfused code: the block's own ``if not
fused`` branch, the same block with fusedops' decorators as the identity, the torch class a
hook replaced, or plain PyTorch written here. What a check changes in a block to run it on a
CPU (``SUBSTITUTIONS``) must occur in the block. TorchAcc's runtime ports are their originals
with ``torchacc.runtime`` (``torchacc``) replaced by ``fusedops`` in the import lines only.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import re
import sys
import types
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusedops
from fusedops.testing import assert_close, random_tensor
from tests.checkpoint_models import Stack

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "migrating.md"
CPU = torch.device("cpu")
DEVICE_TYPE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = re.compile(r"^```python (original|port)=([\w-]+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def page_blocks(text: str) -> dict[str, dict[str, str]]:
    """{"port": {name: code}, "original": {name: code}} from the page's marked blocks."""
    found: dict[str, dict[str, str]] = {"port": {}, "original": {}}
    for kind, name, code in BLOCK.findall(text):
        assert name not in found[kind], f"two {kind} blocks named {name}"
        found[kind][name] = code
    return found


BLOCKS = page_blocks(PAGE.read_text(encoding="utf-8"))
PORTS, ORIGINALS = BLOCKS["port"], BLOCKS["original"]

#: The guides' blocks whose port changes the import lines only: name -> the library renamed.
IMPORT_ONLY = {
    **dict.fromkeys(
        (
            "prefetcher",
            "fused_layer_norm",
            "fused_adam",
            "quick_gelu",
            "dropout_add",
            "window_process",
            "fused_swin_fmha",
            "nms",
            "dcn",
            "multi_stream",
            "auto_checkpoint",
        ),
        "torchacc",
    ),  # fmt: skip
    "optimize": "agspeed",
}
#: How each library's name becomes fusedops' in a port: (pattern, replacement).
RENAMES = {
    "torchacc": [(r"\btorchacc\.runtime\b", "fusedops"), (r"\btorchacc\b", "fusedops")],
    "agspeed": [(r"\bagspeed\b", "fusedops")],
}

#: What each check changes in its block to run it on a CPU at small sizes: (old, new, why).
SUBSTITUTIONS = {
    "multi_stream": [
        ("torch.device('cuda')", f"torch.device('{DEVICE_TYPE}')", "the CPU path without a GPU")
    ],
    "pack_dataset": [
        ("max_tokens=4096", "max_tokens=64", "small rows"),
        ("num_workers=4", "num_workers=0", "no worker processes in a unit test"),
        ("pin_memory=True", "pin_memory=torch.cuda.is_available()", "pinning needs a GPU"),
    ],
    "xla_trace_softmax": [("(256, 1000, 1000)", "(2, 3, 16)", "small input")],
    "optimize": [("dataloader = ...", "dataloader = make_dataloader()", "the guide's elision")],
}


def run_block(name: str, namespace: dict) -> dict:
    """Run port block ``name`` in ``namespace`` (after ``SUBSTITUTIONS``); the value of a final
    expression statement is kept as ``namespace["_"]``. Returns the namespace."""
    code = PORTS[name]
    for old, new, _ in SUBSTITUTIONS.get(name, ()):
        assert old in code, f"{name}: {old!r} is no longer in the block"
        code = code.replace(old, new)
    tree = ast.parse(code, f"docs/migrating.md[{name}]")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.Assign(targets=[ast.Name("_", ast.Store())], value=last.value)
        ast.copy_location(tree.body[-1], last)
        ast.fix_missing_locations(tree)
    exec(compile(tree, f"docs/migrating.md[{name}]", "exec"), namespace)
    return namespace


def _rename(code: str, rule: str) -> str:
    for pattern, repl in RENAMES[rule]:
        code = re.sub(pattern, repl, code)
    return code


def _is_import(line: str) -> bool:
    return bool(re.match(r"\s*(import|from)\s", line))


# ------------------------------------------------------------------------------------------
# The page


def test_every_port_block_has_a_check_and_every_check_a_block():
    assert sorted(PORTS) == sorted(CHECKS)
    assert set(ORIGINALS) <= set(PORTS), "an original without its port"
    assert set(IMPORT_ONLY) <= set(ORIGINALS) and set(SUBSTITUTIONS) <= set(PORTS)
    for name, code in PORTS.items():
        ast.parse(code, name)


@pytest.mark.parametrize("name", sorted(IMPORT_ONLY))
def test_ports_change_the_import_lines_only(name):
    """The port is the guide's block with its library renamed to fusedops, and the lines that
    change are import lines (or ``torchacc.auto_checkpoint``'s call, the one the issue
    names)."""
    original, port = ORIGINALS[name], PORTS[name]
    assert _rename(original, IMPORT_ONLY[name]) == port
    changed = [b for a, b in zip(original.splitlines(), port.splitlines()) if a != b]
    assert changed, f"{name}: nothing to port"
    for line in changed:
        assert _is_import(line) or re.search(r"\bfusedops\.(auto_checkpoint|optimize)\(", line)


def _fusedops_imports() -> list[tuple[str, str]]:
    """(module, name) of every ``from fusedops... import name`` of the runtime ports."""
    found = []
    for name in IMPORT_ONLY:
        for node in ast.walk(ast.parse(PORTS[name])):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("fusedops"):
                found += [(node.module, alias.name) for alias in node.names]
    return found


def test_seed_import_paths_are_homes_or_declared_re_exports():
    """Every name a ported TorchAcc runtime line imports exists there, as one object: the
    module is its home, or lists it in ``__reexports__`` and holds its home's object."""
    imports = _fusedops_imports()
    assert {module for module, _ in imports} >= {
        "fusedops",
        "fusedops.io.prefetcher",
        "fusedops.nn",
        "fusedops.nn.quick_gelu",
        "fusedops.nn.window_process",
        "fusedops.nn.fmha",
        "fusedops.nn.nms",
        "fusedops.nn.dcn_v2",
        "fusedops.utils.misc",
    }
    for module_name, name in imports:
        module = importlib.import_module(module_name)
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):  # from fusedops import hooks
            assert value.__name__ == f"{module_name}.{name}"
            continue
        home = sys.modules[value.__module__]
        assert getattr(home, name) is value, f"{module_name}.{name}"
        if home is not module and module_name != "fusedops.nn":  # fusedops.nn: lazy table
            assert name in getattr(module, "__reexports__", ()), f"{module_name}.{name}"
    assert fusedops.nn.QuickGelu is fusedops.nn.QuickGELU


# ------------------------------------------------------------------------------------------
# TorchAcc runtime blocks


class _LossModel(nn.Module):
    """A small model whose forward returns a scalar loss and records the batches it saw."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x)
        return self.fc(x).square().mean()


def check_prefetcher(monkeypatch):
    batches = [random_tensor((4, 6), device=CPU) for _ in range(5)]
    model = _LossModel()
    ref = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run_block(
        "prefetcher",
        {
            "build_data_loader": lambda: batches,
            "build_model": lambda: model,
            "build_optimizer": lambda: optimizer,
        },
    )
    # unfused: the loop over the loader itself
    ref_optimizer = torch.optim.SGD(ref.parameters(), lr=0.1)
    for samples in batches:
        ref(samples).backward()
        ref_optimizer.step()
    assert len(model.seen) == len(batches)
    assert all(torch.equal(a, b) for a, b in zip(model.seen, batches))
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def check_pack_dataset(monkeypatch):
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    lengths = torch.randint(1, 40, (30,), generator=generator).tolist()
    samples = [
        {"input_ids": torch.randint(1, 100, (n,), generator=generator).tolist()} for n in lengths
    ]
    namespace = run_block(
        "pack_dataset",
        {"tokenized": samples, "tokenizer": types.SimpleNamespace(pad_token_id=0), "torch": torch},
    )
    unpacked = []
    for batch in namespace["loader"]:
        ids, cu = batch["input_ids"][0], batch["cu_seq_lens"].tolist()
        assert ids.numel() % 64 == 0 and cu[-1] == ids.numel()
        for start, stop in zip(cu, cu[1:]):
            segment = ids[start:stop].tolist()
            if any(segment):  # not padding (pad_id 0, tokens 1..99)
                unpacked.append(segment)
    # unfused: the samples themselves, each once and intact
    assert sorted(unpacked) == sorted(s["input_ids"] for s in samples)


def _disable_hooks(*names):
    from fusedops import hooks

    for name in names:
        hooks.disable(name)


def check_fused_layer_norm(monkeypatch):
    original = torch.nn.LayerNorm
    try:
        run_block("fused_layer_norm", {})
        assert torch.nn.LayerNorm is fusedops.nn.LayerNorm
        norm = torch.nn.LayerNorm(16)
        with torch.no_grad():
            norm.weight.copy_(random_tensor((16,), device=CPU))
            norm.bias.copy_(random_tensor((16,), device=CPU))
        x = random_tensor((4, 16), device=CPU).requires_grad_()
        out = norm(x)
        out.backward(torch.ones_like(out))
        # unfused: torch's LayerNorm with the same parameters
        ref = original(16)
        ref.load_state_dict(norm.state_dict())
        x_ref = x.detach().clone().requires_grad_()
        expected = ref(x_ref)
        expected.backward(torch.ones_like(expected))
        assert_close(out, expected, msg="layer norm")
        assert_close(x.grad, x_ref.grad, msg="dx")
        assert_close(norm.weight.grad, ref.weight.grad, terms=4, magnitude=16.0, msg="dweight")
    finally:
        _disable_hooks("layer_norm")
    assert torch.nn.LayerNorm is original


def check_fused_adam(monkeypatch):
    torch_adam, torch_adamw = torch.optim.Adam, torch.optim.AdamW
    try:
        run_block("fused_adam", {})
        assert torch.optim.Adam is fusedops.optim.FusedAdam
        assert torch.optim.AdamW is fusedops.optim.FusedAdamW
        pairs = ((torch.optim.Adam, torch_adam), (torch.optim.AdamW, torch_adamw))
        for fused_class, torch_class in pairs:
            params = [random_tensor(s, device=CPU).requires_grad_() for s in ((5, 3), (7,))]
            ref_params = [p.detach().clone().requires_grad_() for p in params]
            optimizer = fused_class(params, lr=1e-2, weight_decay=1e-2)
            ref_optimizer = torch_class(ref_params, lr=1e-2, weight_decay=1e-2)
            for _ in range(3):
                for p, q in zip(params, ref_params):
                    p.grad = random_tensor(p.shape, device=CPU)
                    q.grad = p.grad.clone()
                optimizer.step()
                ref_optimizer.step()
            for p, q in zip(params, ref_params):
                assert_close(p, q, dtype=torch.float32, scale=2.0, msg=torch_class.__name__)
    finally:
        _disable_hooks("adam")
    assert torch.optim.Adam is torch_adam and torch.optim.AdamW is torch_adamw


def check_quick_gelu(monkeypatch):
    namespace = run_block("quick_gelu", {})
    x = random_tensor((3, 8), device=CPU).requires_grad_()
    out = namespace["QuickGelu"]()(x)
    out.backward(torch.ones_like(out))
    x_ref = x.detach().clone().requires_grad_()
    expected = x_ref * torch.sigmoid(1.702 * x_ref)  # unfused: CLIP's QuickGELU
    expected.backward(torch.ones_like(expected))
    assert_close(out, expected, msg="quick gelu")
    assert_close(x.grad, x_ref.grad, msg="dx")


def check_dropout_add(monkeypatch):
    drop_rate = 0.3
    x = random_tensor((64, 32), device=CPU)
    to_add = random_tensor((64, 32), device=CPU)
    # inference: to_add + x
    namespace = run_block(
        "dropout_add",
        {"self": types.SimpleNamespace(training=False), "torch": torch, "x": x, "to_add": to_add,
         "drop_rate": drop_rate},
    )  # fmt: skip
    assert_close(namespace["x"], to_add + x, msg="inference")
    # training: each element to_add (dropped) or to_add + x / (1 - p), as F.dropout's
    x_train = x.clone().requires_grad_()
    namespace = run_block(
        "dropout_add",
        {"self": types.SimpleNamespace(training=True), "torch": torch, "x": x_train,
         "to_add": to_add, "drop_rate": drop_rate},
    )  # fmt: skip
    out = namespace["x"]
    kept = out != to_add
    assert_close(out[kept], (to_add + x / (1 - drop_rate))[kept], msg="kept")
    assert 0.2 < 1 - kept.float().mean().item() < 0.4  # about drop_rate of 2048 elements
    out.sum().backward()
    assert_close(x_train.grad, kept.float() / (1 - drop_rate), msg="dx")


def _window_partition(x, window_size):
    """Swin Transformer's window_partition (B, H, W, C) -> (nW*B, ws, ws, C)."""
    B, H, W, C = x.shape  # noqa: N806 - Swin's names
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def _window_reverse(windows, window_size, H, W):  # noqa: N803
    """Swin Transformer's window_reverse (nW*B, ws, ws, C) -> (B, H, W, C)."""
    B = int(windows.shape[0] / (H * W / window_size / window_size))  # noqa: N806
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


def check_window_process(monkeypatch):
    B, H, W, C, window_size, shift_size = 2, 8, 12, 5, 4, 2  # noqa: N806
    inputs = {
        "x": random_tensor((B, H, W, C), device=CPU),
        "attn_windows": random_tensor((B * H * W // window_size**2, window_size, window_size, C),
                                      device=CPU),
        "B": B, "H": H, "W": W, "C": C, "torch": torch,
        "self": types.SimpleNamespace(shift_size=shift_size, window_size=window_size),
        "window_partition": _window_partition, "window_reverse": _window_reverse,
    }  # fmt: skip
    fused = run_block("window_process", {**inputs, "fused": True})
    unfused = run_block("window_process", {**inputs, "fused": False})
    assert torch.equal(fused["x_windows"], unfused["x_windows"])
    assert torch.equal(fused["x"], unfused["x"])


def check_fused_swin_fmha(monkeypatch):
    batch_size, window_num, num_head, window_len = 2, 4, 3, 16
    attn = random_tensor((batch_size * window_num, num_head, window_len, window_len), device=CPU)
    bias = random_tensor((num_head, window_len, window_len), device=CPU)
    coin = random_tensor((window_num, window_len, window_len), device=CPU)
    mask = torch.where(coin > 0, 0.0, -100.0)  # Swin's shift mask: 0 or -100
    namespace = run_block(
        "fused_swin_fmha",
        {"attn": attn, "relative_pos_bias": bias, "attn_mask": mask, "batch_size": batch_size,
         "window_num": window_num, "num_head": num_head, "window_len": window_len},
    )  # fmt: skip
    # unfused: Swin Transformer's WindowAttention (bias, then the shift mask, then softmax)
    expected = attn + bias.unsqueeze(0)
    expected = expected.view(batch_size, window_num, num_head, window_len, window_len)
    expected = (expected + mask.unsqueeze(1).unsqueeze(0)).view(
        -1, num_head, window_len, window_len
    )
    assert_close(namespace["_"], expected.softmax(-1), terms=window_len, msg="fmha")


def _iou(a, b) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _greedy_nms(boxes, scores, threshold) -> list[int]:
    keep: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if all(_iou(boxes[i], boxes[k]) <= threshold for k in keep):
            keep.append(i)
    return keep


def _linear_soft_nms(boxes, scores, members, threshold, min_score) -> list[tuple[int, float]]:
    """mmcv's linear soft-NMS over ``members``: (index, final score) in pick order."""
    score = {i: scores[i] for i in members}
    left, picked = set(members), []
    while left:
        i = min(left, key=lambda j: (-score[j], j))
        picked.append((i, score[i]))
        left.discard(i)
        for j in left:
            overlap = _iou(boxes[i], boxes[j])
            if overlap >= threshold:
                score[j] *= 1 - overlap
        left = {j for j in left if score[j] >= min_score}
    return picked


def check_nms(monkeypatch):
    namespace = run_block("nms", {})
    n = 40
    corners = random_tensor((n, 2), device=CPU, low=0.0, high=20.0)
    sizes = random_tensor((n, 2), device=CPU, low=2.0, high=8.0)
    boxes = torch.cat([corners, corners + sizes], dim=1)
    scores = random_tensor((n,), device=CPU, low=0.05, high=1.0)
    idxs = torch.randint(0, 3, (n,), device=CPU)
    b, s = boxes.double().tolist(), scores.double().tolist()
    # unfused: greedy NMS and soft-NMS written out in Python (float64)
    expected = _greedy_nms(b, s, 0.5)
    assert namespace["nms"](boxes, scores, 0.5).tolist() == expected
    dets, inds = namespace["nms_normal"](boxes, scores, 0.5)
    assert inds.tolist() == expected and torch.equal(dets[:, 4], scores[inds])
    soft = _linear_soft_nms(b, s, range(n), 0.3, 1e-3)
    dets, inds = namespace["soft_nms"](boxes, scores, 0.3, sigma=0.5, min_score=1e-3)
    assert inds.tolist() == [i for i, _ in soft]
    assert_close(dets[:, 4], torch.tensor([v for _, v in soft]), dtype=torch.float32, msg="soft")
    per_class = [
        pick
        for c in range(3)
        for pick in _linear_soft_nms(b, s, [i for i in range(n) if idxs[i] == c], 0.3, 1e-3)
    ]
    per_class.sort(key=lambda pick: (-pick[1], pick[0]))
    dets, inds = namespace["batched_soft_nms"](boxes, scores, idxs, 0.3)
    assert inds.tolist() == [i for i, _ in per_class]


def check_dcn(monkeypatch):
    inputs = dict(chi=4, cho=6, kernel_size=3, stride=1, padding=1, dilation=1,
                  deformable_groups=1)  # fmt: skip
    namespace = run_block("dcn", {"self": types.SimpleNamespace(), **inputs})
    conv = namespace["self"].conv
    with torch.no_grad():
        conv.bias.copy_(random_tensor((6,), device=CPU))
    x = random_tensor((2, 4, 7, 7), device=CPU).requires_grad_()
    out = conv(x)
    out.backward(torch.ones_like(out))
    # unfused: a fresh DCN samples the plain grid (zero offsets) with mask sigmoid(0) = 1/2
    x_ref = x.detach().clone().requires_grad_()
    weight = conv.weight.detach().clone().requires_grad_()
    expected = F.conv2d(x_ref, 0.5 * weight, conv.bias.detach(), stride=1, padding=1)
    expected.backward(torch.ones_like(expected))
    # the magnitudes: the same sums over the terms' absolute values
    x_abs = x.detach().abs().requires_grad_()
    w_abs = weight.detach().abs().requires_grad_()
    bound = F.conv2d(x_abs, 0.5 * w_abs, conv.bias.detach().abs(), padding=1)
    dx_bound, dw_bound = torch.autograd.grad(bound.sum(), (x_abs, w_abs))
    assert_close(out, expected, terms=36, magnitude=bound, msg="dcn")
    assert_close(x.grad, x_ref.grad, terms=54, magnitude=dx_bound, msg="dx")
    assert_close(conv.weight.grad, weight.grad, terms=98, magnitude=dw_bound, msg="dweight")
    assert isinstance(conv, namespace["DCNv2"])


def _mmdet_multi_apply(func, *args, **kwargs):
    """mmdet.core.multi_apply, as mmdet writes it (the unfused code)."""
    pfunc = partial(func, **kwargs) if kwargs else func
    map_results = map(pfunc, *args)
    return tuple(map(list, zip(*map_results)))


def check_multi_stream(monkeypatch):
    mmdet = types.ModuleType("mmdet")
    core = types.ModuleType("mmdet.core")
    core.multi_apply = _mmdet_multi_apply
    mmdet.core = core
    monkeypatch.setitem(sys.modules, "mmdet", mmdet)
    monkeypatch.setitem(sys.modules, "mmdet.core", core)
    seed = int(torch.randint(0, 2**31, (1,)))
    results = {}
    for enabled in (True, False):
        torch.manual_seed(seed)  # the block draws t1, t2, t3 itself
        namespace = run_block("multi_stream", {"torch": torch, "enable_torchacc": enabled})
        results[enabled] = namespace["result"]
    fused, unfused = results[True], results[False]
    assert len(fused) == len(unfused) == 3
    for a, b in zip(fused, unfused):
        assert len(a) == len(b) == 100 and all(torch.equal(x, y) for x, y in zip(a, b))


def check_auto_checkpoint(monkeypatch):
    from fusedops.utils import checkpoint_plan

    model = Stack(n=4, p=0.0)
    ref = copy.deepcopy(model)
    namespace = run_block("auto_checkpoint", {"model": model})
    assert namespace["model"] is model
    x = random_tensor((2, 6, 8), device=CPU)
    for _ in range(2):
        loss, ref_loss = model(x).square().mean(), ref(x).square().mean()
        loss.backward()
        ref_loss.backward()
        assert_close(loss, ref_loss, msg="loss")
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert_close(p.grad, q.grad, msg=name)
    assert checkpoint_plan(model).wrapped


def check_syncfree(monkeypatch):
    model = nn.Linear(6, 3)
    namespace = run_block("syncfree", {"model": model})
    for name, torch_class in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW),
                              ("sgd", torch.optim.SGD)):  # fmt: skip
        optimizer = namespace[f"{name}_optimizer"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        ref_params = [p.detach().clone().requires_grad_() for p in params]
        ref_optimizer = torch_class(ref_params, lr=1e-3)
        for _ in range(3):
            for p, q in zip(params, ref_params):
                p.grad = random_tensor(p.shape, device=CPU)
                q.grad = p.grad.clone()
            optimizer.step()
            ref_optimizer.step()
        for p, q in zip(params, ref_params):
            assert_close(p, q, dtype=torch.float32, scale=2.0, msg=name)
        with torch.no_grad():
            for p, q in zip(params, ref_params):
                p.copy_(q)  # the next optimizer starts from torch's state of the parameters


# ------------------------------------------------------------------------------------------
# MegEngine blocks: the unfused run is the same block with fusedops.xla's decorators as the
# identity (eager PyTorch)


def _identity_decorator(fn=None, **options):
    return (lambda f: f) if fn is None else fn


def _as_eager(monkeypatch):
    import fusedops.xla

    monkeypatch.setattr(fusedops.xla, "xla_trace", _identity_decorator, raising=False)
    monkeypatch.setattr(fusedops.xla, "partial_trace", _identity_decorator, raising=False)


def _loop_inputs():
    """A small classifier and a loader of (NumPy data, NumPy labels) batches."""
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    data = [
        (
            random_tensor((8, 12), device=CPU).numpy(),
            torch.randint(0, 4, (8,), device=CPU).numpy(),
        )
        for _ in range(3)
    ]
    return model, data


def _run_loop(name, monkeypatch, inputs, model_key, optimizer_key, eager: bool):
    """Run a training-loop block on a copy of ``inputs``' model (fusedops.xla's decorators as
    the identity when ``eager``); returns the trained model and the namespace."""
    model, data = inputs
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with monkeypatch.context() as patch:
        if eager:
            _as_eager(patch)
        namespace = run_block(
            name,
            {"total_epochs": 2, "dataloader": data, model_key: model, optimizer_key: optimizer},
        )
    return model, namespace


def _check_loop(name, monkeypatch, model_key, optimizer_key):
    pytest.importorskip("jax")
    inputs = _loop_inputs()
    traced, traced_ns = _run_loop(name, monkeypatch, inputs, model_key, optimizer_key, False)
    eager, eager_ns = _run_loop(name, monkeypatch, inputs, model_key, optimizer_key, True)
    assert_close(
        torch.tensor(traced_ns["total_loss"]),
        torch.tensor(eager_ns["total_loss"]),
        dtype=torch.float32,
        scale=8.0,
        msg="loss",
    )
    for (key, p), q in zip(traced.named_parameters(), eager.parameters()):
        assert_close(p, q, dtype=torch.float32, scale=8.0, terms=16, msg=key)
    return traced_ns


def check_xla_trace_softmax(monkeypatch):
    pytest.importorskip("jax")
    namespace = run_block("xla_trace_softmax", {})
    inp = namespace["inp"]
    assert inp.dtype == torch.float64 and inp.shape == (2, 3, 16)
    got = namespace["xla_fused_softmax"](inp)
    assert namespace["xla_fused_softmax"].programs == 1
    assert_close(got, namespace["softmax"](inp), terms=16, msg="softmax")
    assert_close(got, torch.softmax(inp, -1), terms=16, msg="softmax (torch)")


def check_xla_trace_train(monkeypatch):
    namespace = _check_loop("xla_trace_train", monkeypatch, "model", "optimizer")
    assert namespace["train_func"].programs == 1


def check_partial_trace_backbone(monkeypatch):
    namespace = _check_loop("partial_trace_backbone", monkeypatch, "net", "opt")
    assert namespace["backbone"].stats.programs >= 2  # a forward and a backward program


# ------------------------------------------------------------------------------------------
# AGSpeed


class _ResNetLike(nn.Module):
    """Stands in for the guide's ResNet: a small conv net returning its loss."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        features = F.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(features).square().mean()


def check_optimize(monkeypatch):
    import tempfile

    from fusedops.autotune import candidates

    # no compiles in the suite (tests/test_optimize.py tests the trials): torch.compile and XLA
    # left out as unavailable; decisions in a directory of this test's own
    def not_here(module, forward):
        raise candidates.Unavailable("not compiled in the test suite")

    monkeypatch.setitem(candidates.BUILDERS, "compile", not_here)
    monkeypatch.setitem(candidates.BUILDERS, "xla", not_here)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", tempfile.mkdtemp(prefix="fusedops-test-"))
    batches = [(random_tensor((2, 3, 8, 8), device=CPU), None) for _ in range(3)]
    built: list[nn.Module] = []

    def resnet():
        built.append(_ResNetLike())
        built.append(copy.deepcopy(built[0]))  # the unfused run starts from the same weights
        return built[0]

    namespace = run_block(
        "optimize",
        {"torch": torch, "ResNet": resnet, "device": CPU, "distributed": False,
         "DDP": nn.parallel.DistributedDataParallel, "make_dataloader": lambda: batches},
    )  # fmt: skip
    model, ref = built
    assert list(namespace["model"].state_dict()) == list(ref.state_dict())
    # unfused: the same loop on the model as it was built
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.01)
    for data, _target in batches:
        ref(data).backward()
        optimizer.step()
        optimizer.zero_grad()
    for (key, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_close(p, q, dtype=torch.float32, scale=8.0, terms=64, msg=key)


CHECKS = {
    name.removeprefix("check_"): value
    for name, value in dict(globals()).items()
    if name.startswith("check_") and callable(value)
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_ported_block_gives_the_unfused_result(name, monkeypatch):
    CHECKS[name](monkeypatch)

"""CPU fallback: every fusedops op on the automatic pick (native: PyTorch's own ops) against the
torch code it replaces, forward + backward, same process, interleaved repeats, median.

Prints ``op | fusedops auto (ms) | torch (ms) | ratio`` and writes
``benchmarks/results/cpu-fallback.csv``. The promise (issue 23): every ratio <= 1.3. The machine
this runs on may be shared: the ratios are the numbers to read, each pair timed back to back.

    python benchmarks/bench_cpu_fallback.py [--repeats 15] [--only layer_norm,adam]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fusedops  # noqa: E402
from fusedops import dispatch  # noqa: E402
from fusedops.optim import FusedAdamW  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cpu-fallback.csv"
SHAPE = (32, 65, 384)  # ViT-B/16-like rows, batch 32
P = 0.1


def _leaf(shape, dtype, scale=1.0):
    return (torch.randn(shape) * scale).to(dtype).requires_grad_()


def _fwd_bwd(fn: Callable[[], torch.Tensor], grad: torch.Tensor, leaves) -> Callable[[], None]:
    def step():
        for t in leaves:
            t.grad = None
        fn().backward(grad)

    return step


def _norm_case(name, dtype, shape=SHAPE):
    x = _leaf(shape, dtype)
    w = _leaf(shape[-1:], dtype)
    b = _leaf(shape[-1:], dtype)
    dy = torch.randn(shape).to(dtype)
    n = (shape[-1],)
    if name == "layer_norm":
        ours = _fwd_bwd(lambda: fusedops.layer_norm(x, n, w, b), dy, (x, w, b))
        theirs = _fwd_bwd(lambda: F.layer_norm(x, n, w, b), dy, (x, w, b))
    else:
        ours = _fwd_bwd(lambda: fusedops.rms_norm(x, n, w, 1e-6), dy, (x, w))
        theirs = _fwd_bwd(lambda: F.rms_norm(x, n, w, 1e-6), dy, (x, w))
    return ours, theirs


def _bias_dropout_add_case(dtype, shape=SHAPE):
    x, r = _leaf(shape, dtype), _leaf(shape, dtype)
    b = _leaf(shape[-1:], dtype)
    dy = torch.randn(shape).to(dtype)
    ours = _fwd_bwd(lambda: fusedops.bias_dropout_add(x, b, r, P), dy, (x, b, r))
    theirs = _fwd_bwd(lambda: r + F.dropout(x + b, P, True), dy, (x, b, r))
    return ours, theirs


def _quick_gelu_case(dtype, shape=(32, 65, 1536)):
    x = _leaf(shape, dtype)
    dy = torch.randn(x.shape).to(dtype)
    ours = _fwd_bwd(lambda: fusedops.quick_gelu(x), dy, (x,))
    theirs = _fwd_bwd(lambda: x * torch.sigmoid(1.702 * x), dy, (x,))
    return ours, theirs


def _adam_case(dtype, shapes=None):
    """AdamW on the parameter list of the demo's TinyViT (about 0.8M parameters, 60 tensors),
    or on tensors of ``shapes``."""
    from fusedops.demo import TinyViT

    torch.manual_seed(0)
    if shapes is None:
        initial = [p.detach() for p in TinyViT().parameters()]
    else:
        initial = [torch.randn(shape) for shape in shapes]
    ours_params = [p.to(dtype).requires_grad_() for p in initial]
    theirs_params = [p.detach().clone().requires_grad_() for p in ours_params]
    for a, b in zip(ours_params, theirs_params):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    ours = FusedAdamW(ours_params, lr=1e-3, weight_decay=0.01)
    theirs = torch.optim.AdamW(theirs_params, lr=1e-3, weight_decay=0.01, foreach=True)
    return ours.step, theirs.step


#: Swin stage -> (feature map side, heads, channels, batch); stage 0: a tiny map, for host
#: overhead (benchmarks/overhead.py).
SWIN_STAGES = {0: (14, 1, 32, 1), 1: (56, 3, 96, 8), 3: (14, 12, 384, 8)}


def _swin_shapes(stage):
    """Swin-T at 224x224, batch 8: stage 1 (56x56 map, 3 heads, C 96), stage 3 (14x14, 12
    heads, C 384); window 7 (N = 49), head dim 32, shifted blocks (a mask)."""
    side, heads, _, batch = SWIN_STAGES[stage]
    windows = (side // 7) ** 2
    return side, heads, windows, batch * windows


def _swin_mask(windows):
    return torch.where(torch.rand(windows, 49, 49) < 0.2, -100.0, 0.0)


def _window_attention_case(stage):
    _, heads, windows, z = _swin_shapes(stage)
    q, k, v = (_leaf((z, heads, 49, 32), torch.float32) for _ in range(3))
    bias = _leaf((heads, 49, 49), torch.float32)
    mask = _swin_mask(windows)
    dy = torch.randn(z, heads, 49, 32)
    scale = 32**-0.5

    def swin():  # transformers' / timm's SwinAttention
        attn = (q * scale) @ k.transpose(-2, -1) + bias[None]
        attn = attn.view(z // windows, windows, heads, 49, 49) + mask[None, :, None]
        return torch.softmax(attn.view(z, heads, 49, 49), dim=-1) @ v

    leaves = (q, k, v, bias)
    ours = _fwd_bwd(lambda: fusedops.window_attention(q, k, v, bias, mask, scale), dy, leaves)
    return ours, _fwd_bwd(swin, dy, leaves)


def _swin_softmax_case(stage):
    _, heads, windows, z = _swin_shapes(stage)
    attn = _leaf((z, heads, 49, 49), torch.float32)
    bias = _leaf((heads, 49, 49), torch.float32)
    mask = _swin_mask(windows)
    dy = torch.randn(attn.shape)

    def swin():
        scores = (attn + bias[None]).view(z // windows, windows, heads, 49, 49)
        return torch.softmax((scores + mask[None, :, None]).view(attn.shape), dim=-1)

    ours = _fwd_bwd(lambda: fusedops.swin_attention_softmax(attn, bias, mask), dy, (attn, bias))
    return ours, _fwd_bwd(swin, dy, (attn, bias))


def _window_process_case(stage, direction):
    side, _, windows, z = _swin_shapes(stage)
    channels = SWIN_STAGES[stage][2]
    batch = z // windows
    if direction == "partition":
        x = _leaf((batch, side, side, channels), torch.float32)
        dy = torch.randn(z, 7, 7, channels)

        def swin():
            rolled = torch.roll(x, (-3, -3), dims=(1, 2))
            grid = rolled.view(batch, side // 7, 7, side // 7, 7, channels)
            return grid.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 7, 7, channels)

        ours = _fwd_bwd(lambda: fusedops.window_partition_roll(x, 7, -3), dy, (x,))
        return ours, _fwd_bwd(swin, dy, (x,))
    w = _leaf((z, 7, 7, channels), torch.float32)
    dy = torch.randn(batch, side, side, channels)

    def swin_reverse():
        grid = w.view(batch, side // 7, side // 7, 7, 7, channels).permute(0, 1, 3, 2, 4, 5)
        return torch.roll(grid.contiguous().view(batch, side, side, -1), (3, 3), dims=(1, 2))

    ours = _fwd_bwd(lambda: fusedops.window_reverse_roll(w, 7, side, side, 3), dy, (w,))
    return ours, _fwd_bwd(swin_reverse, dy, (w,))


def _nms_case(n):
    generator = torch.Generator().manual_seed(n)
    xy = torch.rand(n, 2, generator=generator) * 1000
    boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=generator) * 100 + 1], dim=1)
    scores = torch.rand(n, generator=generator)
    ours = lambda: fusedops.nms(boxes, scores, 0.5)  # noqa: E731
    if importlib.util.find_spec("torchvision") is None:
        return ours, None
    import torchvision  # noqa: F401  (registers torch.ops.torchvision)

    return ours, lambda: torch.ops.torchvision.nms(boxes, scores, 0.5)


def cases() -> dict[str, Callable[[], tuple]]:
    """Row name -> a function building (fusedops callable, torch callable or None)."""
    table = {}
    for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        table[f"layer_norm {tag} {SHAPE}"] = lambda d=dtype: _norm_case("layer_norm", d)
        table[f"rms_norm {tag} {SHAPE}"] = lambda d=dtype: _norm_case("rms_norm", d)
        table[f"bias_dropout_add {tag} {SHAPE} p={P}"] = lambda d=dtype: _bias_dropout_add_case(d)
        table[f"quick_gelu {tag} (32, 65, 1536)"] = lambda d=dtype: _quick_gelu_case(d)
    table["adamw step fp32 TinyViT params"] = lambda: _adam_case(torch.float32)
    for stage in (1, 3):
        table[f"window_attention Swin-T stage {stage}"] = lambda s=stage: _window_attention_case(s)
        table[f"swin_attention_softmax Swin-T stage {stage}"] = lambda s=stage: _swin_softmax_case(
            s
        )
        for direction in ("partition", "reverse"):
            table[f"window_{direction}_roll Swin-T stage {stage}"] = lambda s=stage, d=direction: (
                _window_process_case(s, d)
            )
    for n in (1000, 10000):
        table[f"nms {n} boxes"] = lambda n=n: _nms_case(n)
    return table


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(ours: Callable, theirs: Callable | None, repeats: int) -> tuple[float, float | None]:
    """Median ms of each, timed alternately after two warm-up calls each."""
    for _ in range(2):
        ours()
        if theirs is not None:
            theirs()
    mine, other = [], []
    for _ in range(repeats):
        mine.append(_time(ours))
        if theirs is not None:
            other.append(_time(theirs))
    return statistics.median(mine), (statistics.median(other) if other else None)


def main(argv: list[str] | None = None) -> int:
    """Run the table (all rows, or ``--only`` names' prefixes), print it and write the CSV."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", default="", help="comma-separated row-name prefixes")
    parser.add_argument("--no-csv", action="store_true", help="print only")
    args = parser.parse_args(argv)
    prefixes = [p for p in args.only.split(",") if p]
    rows = []
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"CPU fallback, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{'op':<44} {'fusedops auto (ms)':>18} {'torch (ms)':>10} {'ratio':>6}  backend")
    for name, build in cases().items():
        if prefixes and not any(name.startswith(p) for p in prefixes):
            continue
        torch.manual_seed(0)
        ours, theirs = build()
        mine, other = measure(ours, theirs, args.repeats)
        op = name.split()[0].replace("adamw", "adam")
        backend = dispatch.last_used.get(op, "?")
        ratio = f"{mine / other:.2f}" if other else "n/a"
        shown = f"{other:.2f}" if other is not None else "n/a"
        print(f"{name:<44} {mine:>18.2f} {shown:>10} {ratio:>6}  {backend}", flush=True)
        rows.append(
            {
                "date": stamp,
                "op": name,
                "fusedops_auto_ms": f"{mine:.3f}",
                "torch_ms": "" if other is None else f"{other:.3f}",
                "ratio": "" if other is None else f"{mine / other:.3f}",
                "backend": backend,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
            }
        )
    if rows and not args.no_csv:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

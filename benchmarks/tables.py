"""The tables of the README and the docs, written from the committed records, never by hand.

Each table sits between two markers in a Markdown file::

    <!-- table:NAME -->
    ...what ``TABLES[NAME]()`` returns...
    <!-- /table:NAME -->

and is written from ``benchmarks/results/*.csv`` (named under each table, with the GPU or machine
and the date of its rows), ``fusedops/kernels/verified.json`` and the registered ops. Figures are
printed as the CSV holds them (no rounding of ours); a row is picked by its columns, a run by its
dates or by the CSV's line numbers (the CSVs are only ever appended to). Nothing depends on the
day the script runs.

Run (from the repository root)::

    python benchmarks/tables.py            # check: exit 1 and name the tables that differ
    python benchmarks/tables.py --write    # rewrite every marked table in place

``tests/test_docs_tables.py`` runs the check, so a table that drifts from its sources (a new
verified.json, an edited kernel whose entry no longer matches, a marked table edited by hand)
fails the suite until ``--write`` is run.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
#: The Markdown files whose marked tables this script owns.
FILES = ("README.md", "docs/*.md", "benchmarks/GPU_STATUS.md")
MARKED = re.compile(
    r"(<!-- table:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S
)
H100 = "NVIDIA_H100_80GB_HBM3"
PROVIDERS = {
    "fusedops-cuda": "fusedops cuda",
    "fusedops-triton": "fusedops triton",
    "torch-eager": "torch eager",
    "torch-compile": "torch.compile",
    "torch-fused": "torch `fused=True`",
    "torch-foreach": "torch foreach",
}


# ------------------------------------------------------------------------------------------
# Reading the records


def read_csv(name: str) -> list[dict[str, str]]:
    """The rows of ``benchmarks/results/<name>`` as dicts, each with its line number
    (``_line``). A row with more fields than the header (cpu-nms.csv's unquoted machine column)
    has the extra ones joined back into the field after the first."""
    with open(RESULTS / name, newline="") as f:
        rows = list(csv.reader(f))
    header, out = rows[0], []
    for number, row in enumerate(rows[1:], 2):
        extra = len(row) - len(header)
        if extra > 0:
            row = [row[0], ",".join(row[1 : 2 + extra]), *row[2 + extra :]]
        out.append({"_line": str(number), **dict(zip(header, row))})
    return out


def pick(rows: list[dict], **match: str) -> dict | None:
    """The last (newest) row whose columns equal ``match``, or None."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[-1] if found else None


def between(rows: list[dict], start: str, end: str) -> list[dict]:
    """The rows whose ``date`` is in [start, end) (ISO strings compare as dates)."""
    return [r for r in rows if start <= r["date"] < end]


def lines(rows: list[dict], first: int, last: int) -> list[dict]:
    """The rows on the CSV's lines first..last (1-based, the header is line 1)."""
    return [r for r in rows if first <= int(r["_line"]) <= last]


def dates(rows: list[dict]) -> str:
    days = sorted({r["date"][:10] for r in rows})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def table(header: list[str], body: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(out)


def source(csv_names: list[str], rows: list[dict], where: str) -> str:
    files = ", ".join(f"`benchmarks/results/{n}`" for n in csv_names)
    return f"\nMeasured on {where}, {dates(rows)}. CSV: {files}."


# ------------------------------------------------------------------------------------------
# GPU benchmark tables (% of the device's measured copy bandwidth)


def pct_table(csv_name: str, rows: list[dict], specs, providers, where: str) -> str:
    """One row per (label, match) of ``specs``, one column per provider: pct_copy_bw of the
    newest matching row."""
    body = []
    for label, match in specs:
        cells = []
        for provider in providers:
            row = pick(rows, provider=provider, **match)
            cells.append(f"{row['pct_copy_bw']}%" if row else "not measured")
        body.append([label, *cells])
    used = [r for r in rows if r["provider"] in providers]
    header = ["op (shape, dtype)", *(PROVIDERS[p] for p in providers)]
    return table(header, body) + "\n" + source([csv_name], used, where)


SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
FOUR = ["fusedops-cuda", "fusedops-triton", "torch-eager", "torch-compile"]


def h100_quick_2026_11_26() -> str:
    ln_csv, bda_csv = f"{H100}_layer_norm_quick.csv", f"{H100}_bias_dropout_add_quick.csv"
    ln, bda = read_csv(ln_csv), read_csv(bda_csv)

    def norm(op, label, d, dtype, m, n):
        return (
            f"{label} {d}, {m}x{n} {SHORT[dtype]}",
            {"op": op, "direction": d, "dtype": dtype, "M": m, "N": n},
        )

    ln_specs = [
        norm("layer_norm", "LayerNorm", d, dt, m, n)
        for dt, m, n in [
            ("float32", "4096", "8192"),
            ("bfloat16", "4096", "8192"),
            ("bfloat16", "16384", "4096"),
        ]
        for d in ("fwd", "bwd")
    ] + [norm("rms_norm", "RMSNorm", d, "bfloat16", "16384", "4096") for d in ("fwd", "bwd")]
    bda_specs = [
        (
            f"bias_dropout_add {d}, 16384x4096 {'bf16' if dt == 'bfloat16' else 'fp32'}",
            {"direction": d, "dtype": dt, "tokens": "16384", "hidden": "4096"},
        )
        for dt in ("bfloat16", "float32")
        for d in ("fwd", "fwd+bwd")
    ]
    where = "NVIDIA H100 80GB HBM3"
    return (
        pct_table(ln_csv, ln, ln_specs, FOUR, where)
        + "\n\n"
        + pct_table(bda_csv, bda, bda_specs, FOUR, where)
    )


def h100_2026_11_22() -> str:
    qg_csv, ln_csv = f"{H100}_quick_gelu.csv", f"{H100}_layer_norm.csv"
    qg = read_csv(qg_csv)
    ln = between(read_csv(ln_csv), "2026-11-22", "2026-11-23")
    qg_specs = [
        (f"QuickGELU {d}, {size} {SHORT[dtype]}", {"dtype": dtype, "numel": numel, "direction": d})
        for size, dtype, numel in (
            ("2^28", "float32", "268435456"),
            ("2^24", "bfloat16", "16777216"),
        )
        for d in ("fwd", "bwd")
    ]
    ln_specs = [
        (
            f"LayerNorm {d}, 4096x{n} fp32",
            {"op": "layer_norm", "dtype": "float32", "M": "4096", "N": n, "direction": d},
        )
        for n in ("4096", "65536")
        for d in ("fwd", "bwd")
    ]
    where = "NVIDIA H100 80GB HBM3"
    return (
        pct_table(qg_csv, qg, qg_specs, FOUR, where)
        + "\n\n"
        + pct_table(ln_csv, ln, ln_specs, FOUR, where)
    )


def h100_adam() -> str:
    name = f"{H100}_adam.csv"
    rows = between(read_csv(name), "2026-11-22T21:52", "2026-11-22T22:15")
    models = [("ViT-B", "vit_b"), ("1.1B-like", "llama_1b")]
    providers = [
        "fusedops-triton",
        "fusedops-cuda",
        "torch-fused",
        "torch-foreach",
        "torch-compile",
    ]
    body = []
    for label, model in models:
        for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16")):
            cells = []
            for p in providers:
                row = pick(rows, provider=p, model=model, dtype=dtype)
                cells.append(f"{row['ms']} ({row['pct_copy_bw']}%)" if row else "not measured")
            body.append([f"{label} {short}", *cells])
    header = ["parameters (ms, % of copy bandwidth)", *(PROVIDERS[p] for p in providers)]
    return (
        table(header, body)
        + "\n"
        + source([name], rows, "NVIDIA H100 80GB HBM3 (runs of 21:52-22:14 UTC)")
    )


# ------------------------------------------------------------------------------------------
# CPU tables


def cpu_fallback() -> str:
    name = "cpu-fallback.csv"
    rows = read_csv(name)
    last = [r for r in rows if r["date"] == rows[-1]["date"]]
    body = [
        [r["op"], r["fusedops_auto_ms"], r["torch_ms"] or "n/a", r["ratio"] or "n/a"] for r in last
    ]
    header = ["op", "fusedops auto (ms)", "torch (ms)", "ratio"]
    return (
        table(header, body)
        + "\n"
        + source(
            [name], last, f"the 2-core CPU ({last[0]['threads']} threads, torch {last[0]['torch']})"
        )
    )


def cpu_overhead() -> str:
    name = "cpu-overhead.csv"
    rows = read_csv(name)
    last = [r for r in rows if r["date"] == rows[-1]["date"]]
    body = [
        [r["op"], r["torch_us"], r["native_us"], r["triton_host_us"], r["extra_us"]] for r in last
    ]
    header = [
        "op (fwd+bwd)",
        "torch (us)",
        "fusedops native (us)",
        "fusedops Triton host path (us)",
        "Triton host path - torch (us)",
    ]
    return (
        table(header, body)
        + "\n"
        + source(
            [name], last, f"the 2-core CPU ({last[0]['clock']} time, torch {last[0]['torch']})"
        )
    )


def cpu_nms() -> str:
    name = "cpu-nms.csv"
    rows = [r for r in read_csv(name) if r["date"] == "2026-11-24T00:06:06Z"]
    body = []
    for op in ("nms", "soft_nms"):
        for boxes in dict.fromkeys(r["boxes"] for r in rows if r["op"] == op):
            cells = [
                pick(rows, op=op, boxes=boxes, provider=p)["ms"]
                for p in ("python-loop", "fusedops-reference", "cpp-loop")
            ]
            label = "nms" if op == "nms" else "soft_nms linear"
            body.append([f"{label}, {boxes}", *cells])
    header = [
        "op, boxes (ms per call)",
        "plain Python loop",
        "fusedops reference (CPU path)",
        "C++ loop (torchvision/mmcv-style)",
    ]
    return table(header, body) + "\n" + source([name], rows, f"the {rows[0]['machine']}")


def cpu_ddp() -> str:
    name = "cpu-ddp.csv"
    rows = read_csv(name)
    body = []
    for r in rows:
        ratio = re.search(r"time/eager=([\d.]+x)", r["notes"]).group(1)
        body.append([r["backend"], r["step_ms_median"], ratio, r["compile_s"]])
    header = ["mode", "step (ms, median)", "/ eager", "first step (s)"]
    return table(header, body) + "\n" + source([name], rows, f"the {rows[0]['device']}")


MODEL_NAMES = {
    "bert": "HF BERT (masked LM)",
    "clip": "HF CLIP vision",
    "convnext": "HF ConvNeXt",
    "gpt2": "HF GPT-2 (causal LM)",
    "swin": "HF Swin",
    "vit": "HF ViT",
    "t5": "HF T5 (seq2seq)",
    "resnet": "HF ResNet",
    "demo_vit": "the demo's TinyViT",
}


def cpu_models(run: str) -> str:
    """bench_models.py's rows of the run started at ``run`` (its ``date``) in cpu_models.csv:
    per model the median step of eager, torch.compile and optimize, optimize over the faster
    of the two, first steps, what optimize's processes picked, and the first loss's difference
    from eager's against its tolerance."""
    name = "cpu_models.csv"
    rows = [r for r in read_csv(name) if r["date"] == run]
    body = []
    for model in dict.fromkeys(r["model"] for r in rows):
        ways = {r["way"]: r for r in rows if r["model"] == model}
        eager, compiled, optimized = ways["eager"], ways["compile"], ways["optimize"]
        best = min(float(eager["step_ms"]), float(compiled["step_ms"]))
        ratio = float(optimized["step_ms"]) / best
        body.append([
            MODEL_NAMES.get(model, model), eager["step_ms"], compiled["step_ms"],
            optimized["step_ms"], f"{ratio:.3f}", compiled["first_step_s"],
            optimized["first_step_s"], optimized["picks"].replace("|", ", "),
            f"{optimized['first_loss_minus_eager']} ({optimized['first_loss_tolerance']})",
        ])  # fmt: skip
    header = ["model", "eager", "torch.compile", "optimize", "optimize / faster",
              "compile first step (s)", "optimize first step (s)", "optimize picked",
              "first loss - eager (tolerance)"]  # fmt: skip
    processes = rows[0]["processes"] if rows else "?"
    return (
        table(header, body)
        + "\n"
        + source(
            [name], rows, f"the 2-core CPU of the development machine ({processes} processes a way)"
        )
    )


XLA_MODELS = {
    "hf-bert-h256-l4-b8": "HF BERT (masked LM)",
    "hf-clip-h256-l4-b8": "HF CLIP vision",
    "hf-convnext-h256-l4-b8": "HF ConvNeXt",
    "hf-gpt2-h256-l4-b8": "HF GPT-2 (causal LM)",
    "hf-swin-h256-l4-b8": "HF Swin",
    "hf-vit-h256-l4-b8": "HF ViT",
    "hf-t5-h256-l4-b8": "HF T5 (seq2seq)",
    "hf-resnet-h256-l4-b8": "HF ResNet",
    "mlp-4x1024-b256": "MLP 4x1024, batch 256",
    "vit-d256-h4-s196-b8-4blk": "ViT stack dim 256, 4 heads, seq 196, batch 8, 4 blocks",
}
XLA_BACKENDS = {
    "eager": "eager",
    "xla": "partial_trace(xla)",
    "inductor": "inductor",
    "xla_jax_first": "partial_trace, jax imported first",
}


def _ratios(notes: str) -> tuple[str, str]:
    median = re.search(r"time/eager=([\d.]+x)", notes).group(1)
    p20 = re.search(r"\(([\d.]+x) eager's\)", notes).group(1)
    return median, p20


def xla_table(
    first: int, last: int, *, bold_over: float | None = None, runs_as: bool = False
) -> str:
    """bench_xla.py's rows on lines first..last of cpu-xla.csv: step time in ms (median of the
    pooled steps), and / eager (median; 20th percentile) from the row's notes."""
    name = "cpu-xla.csv"
    rows = lines(read_csv(name), first, last)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    body = []
    for model in dict.fromkeys(r["model"] for r in rows):
        cells, picks = [], []
        for backend in backends:
            row = pick(rows, model=model, backend=backend)
            if row is None:
                cells.append("not measured")
                continue
            if backend == "eager":
                cells.append(row["step_ms_median"])
                continue
            median, p20 = _ratios(row["notes"])
            cell = f"{row['step_ms_median']} ({median}; {p20})"
            if bold_over is not None and backend == "xla" and float(median[:-1]) > bold_over:
                cell = f"**{cell}**"
            cells.append(cell)
            found = re.search(r"regions run as eager/xla: (\d+)/(\d+)", row["notes"])
            if found:
                picks.append(f"{found.group(1)} eager / {found.group(2)} xla")
        if runs_as:
            cells.append(", ".join(picks))
        body.append([XLA_MODELS.get(model, model), *cells])
    header = ["model", *(XLA_BACKENDS.get(b, b) for b in backends)]
    if runs_as:
        header.append("regions run as (first process, per partial_trace column)")
    steps = re.search(r"median of (\d+ steps pooled from \d+ processes of \d+)", rows[0]["notes"])
    how = f"; median of {steps.group(1)}" if steps else ""
    return (
        table(header, body)
        + "\n"
        + source([name], rows, f"the {rows[0]['device']} (lines {first}-{last}{how})")
    )


# ------------------------------------------------------------------------------------------
# What a GPU user gets: the ops x backends table (README) and GPU_STATUS's rows


#: The public entry of each registered op (checked to exist: a renamed function fails here).
ENTRIES = {
    "adam": ["fusedops.optim.FusedAdam", "fusedops.optim.FusedAdamW"],
    "sgd": ["fusedops.optim.FusedSGD"],
    "bias_dropout_add": ["fusedops.bias_dropout_add"],
    "deform_conv2d": ["fusedops.deform_conv2d", "fusedops.nn.DCNv2"],
    "nms": ["fusedops.nms", "fusedops.batched_nms", "fusedops.nms_normal"],
    "soft_nms": ["fusedops.soft_nms", "fusedops.batched_soft_nms"],
}


def _entries(op: str) -> list[str]:
    import importlib

    names = ENTRIES.get(op, [f"fusedops.{op}"])
    for name in names:
        module, _, attr = name.rpartition(".")
        if not hasattr(importlib.import_module(module), attr):
            raise AttributeError(f"{name} (the entry of op {op!r}) does not exist")
    return names


def _ops():
    from fusedops import dispatch, ops

    ops.load_all()
    return dispatch, sorted(dispatch.registered_ops().items())


def _recorded(op: str, backend: str) -> dict | None:
    """verified.json's entry for (op, backend), whether or not its sources still match."""
    from fusedops.kernels.verified import VERIFIED_FILE

    kernels = json.loads(VERIFIED_FILE.read_text()).get("kernels", {})
    return kernels.get(op, {}).get(backend)


def _state(dispatch, op, backend: str) -> tuple[str, dict | None]:
    """('verified' | 'changed' | 'unverified' | 'forced', the verified.json entry)."""
    entry = dispatch.verified_entry(op.name, backend)
    preference = op.preference or dispatch.kernel_backend_names()
    if backend not in preference:
        return "forced", _recorded(op.name, backend)
    if entry is not None:
        return "verified", entry
    recorded = _recorded(op.name, backend)
    return ("changed" if recorded else "unverified"), recorded


def ops_state() -> str:
    dispatch, registered = _ops()
    kernels = dispatch.kernel_backend_names()
    body = []
    for name, op in registered:
        cells = []
        for backend in kernels:
            state, entry = _state(dispatch, op, backend)
            if state == "verified":
                cells.append(f"**verified** ({entry['gpu']}, {entry['date']})")
            elif state == "changed":
                cells.append(
                    f"passed on {entry['gpu']} {entry['date']}, sources changed since: "
                    "runs PyTorch's native op until verified again"
                )
            elif state == "forced":
                cells.append("only when forced (`backend=`); never picked automatically")
            else:
                cells.append("runs PyTorch's native op until verified")
        entry = ", ".join(f"`{e}`" for e in _entries(name))
        body.append([f"`{name}`", entry, *cells])
    header = ["op", "entry", *(f"{b} kernel on a GPU" for b in kernels)]
    return table(header, body) + (
        "\n\nWritten from `fusedops/kernels/verified.json` and the registered ops: a kernel is "
        "verified while its sources hash to the ones that passed the GPU suite. On a CPU every "
        "op runs `native` (PyTorch's own ops)."
    )


#: op -> (CSV, match, the peers, what the row is): the headline figure (both fusedops kernels)
#: of each op measured on a GPU; the others are "not measured on a GPU yet".
HEADLINES = {
    "quick_gelu": (
        f"{H100}_quick_gelu.csv",
        {"dtype": "float32", "numel": "268435456", "direction": "fwd"},
        ["torch-eager", "torch-compile"],
        "fwd, 2^28 fp32",
    ),
    "layer_norm": (
        f"{H100}_layer_norm_quick.csv",
        {
            "op": "layer_norm",
            "dtype": "bfloat16",
            "M": "16384",
            "N": "4096",
            "direction": "fwd+bwd",
        },
        ["torch-eager", "torch-compile"],
        "fwd+bwd, 16384x4096 bf16",
    ),
    "rms_norm": (
        f"{H100}_layer_norm_quick.csv",
        {"op": "rms_norm", "dtype": "bfloat16", "M": "16384", "N": "4096", "direction": "fwd+bwd"},
        ["torch-eager", "torch-compile"],
        "fwd+bwd, 16384x4096 bf16",
    ),
    "bias_dropout_add": (
        f"{H100}_bias_dropout_add_quick.csv",
        {"dtype": "bfloat16", "tokens": "16384", "hidden": "4096", "direction": "fwd+bwd"},
        ["torch-eager", "torch-compile"],
        "fwd+bwd, 16384x4096 bf16, p=0.1",
    ),
    "adam": (
        f"{H100}_adam.csv",
        {"model": "llama_1b", "dtype": "bfloat16"},
        ["torch-fused", "torch-foreach"],
        "AdamW step, 1.1B-like bf16 params",
    ),
}
#: Ops with GPU figures only in a report whose CSVs did not survive.
REPORT_ONLY = {
    "nms",
    "soft_nms",
    "window_attention",
    "swin_attention_softmax",
    "window_partition_roll",
    "window_reverse_roll",
}


def _ms(row: dict) -> str:
    return f"{row['ms']} ms"


def _pct(row: dict) -> str:
    return f"{row['pct_copy_bw']}%"


def headline() -> str:
    _, registered = _ops()
    body = []
    for name, _op in registered:
        if name in HEADLINES:
            csv_name, match, peers, what = HEADLINES[name]
            rows = read_csv(csv_name)
            mine = [pick(rows, provider=p, **match) for p in ("fusedops-cuda", "fusedops-triton")]
            fig = _ms if "adam" in csv_name else _pct

            peer = "; ".join(
                f"{PROVIDERS[p]} {fig(pick(rows, provider=p, **match))}" for p in peers
            )
            ours = "; ".join(f"{r['provider'].split('-')[1]} {fig(r)}" for r in mine)
            gpu = f"{mine[0]['gpu'].replace('NVIDIA ', '')}, {mine[0]['date'][:10]}"
            body.append([f"`{name}`", what, ours, peer, gpu, f"`{csv_name}`"])
        elif name in REPORT_ONLY:
            body.append(
                [
                    f"`{name}`",
                    "-",
                    "no committed GPU CSV (H100 2026-11-24 figures, "
                    "CSVs lost: [docs/benchmarks.md](docs/benchmarks.md))",
                    "-",
                    "-",
                    "-",
                ]
            )
        else:
            body.append([f"`{name}`", "-", "not measured on a GPU yet", "-", "-", "-"])
    header = ["op", "measured", "fusedops", "peers", "GPU, date", "CSV (`benchmarks/results/`)"]
    return table(header, body) + (
        "\n\n% = share of the GPU's measured copy bandwidth (higher is faster); Adam in ms "
        "(lower is faster)."
    )


#: op -> the gpu_check.sh call that runs what it owes (its test files; see GPU_STATUS.md).
def _owed_command(op: str) -> str:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from record_verified import OP_TEST_FILES

    files = " ".join(f"tests/{stem}.py" for stem in OP_TEST_FILES[op])
    return (
        f'`export OUT; WORKERS=12 SUITE_OPS="{files}" bash benchmarks/gpu_check.sh '
        "build:120 suite-ops:300`"
    )


def gpu_status() -> str:
    dispatch, registered = _ops()
    body = []
    for name, op in registered:
        for backend in dispatch.kernel_backend_names():
            state, entry = _state(dispatch, op, backend)
            if state == "verified":
                body.append(
                    [
                        name,
                        backend,
                        "verified",
                        f"{entry['gpu']}, {entry['date']}, {entry['commit'][:7]}",
                        entry["evidence"],
                    ]
                )
                continue
            was = (
                f"passed {entry['date']} ({entry['commit'][:7]}), sources changed since"
                if entry
                else ""
            )
            what = {"forced": "runs only when forced", "changed": "owed", "unverified": "owed"}[
                state
            ]
            body.append([name, backend, what, was or "-", _owed_command(name)])
    header = ["op", "backend", "state", "GPU, date, commit", "evidence / command that owes it"]
    return table(header, body) + (
        "\n\nWritten from `fusedops/kernels/verified.json` (an entry counts while the kernel's "
        "sources hash to the recorded ones) and `benchmarks/record_verified.py`'s test files."
    )


TABLES: dict[str, Callable[[], str]] = {
    "ops": ops_state,
    "headline": headline,
    "gpu-status": gpu_status,
    "h100-2026-11-26-quick": h100_quick_2026_11_26,
    "h100-2026-11-22": h100_2026_11_22,
    "h100-adam": h100_adam,
    "cpu-fallback": cpu_fallback,
    "cpu-overhead": cpu_overhead,
    "cpu-nms": cpu_nms,
    "cpu-ddp": cpu_ddp,
    "cpu-models": lambda: cpu_models("2026-12-07 05:08"),
    "cpu-xla-pick": lambda: xla_table(295, 324, runs_as=True),
    "cpu-xla-xeon": lambda: xla_table(225, 254, bold_over=1.10),
    "cpu-xla-2core": lambda: xla_table(157, 186, bold_over=1.10),
    "cpu-xla-2core-rerun": lambda: xla_table(187, 190),
    "cpu-xla-passive": lambda: xla_table(77, 106),
}


# ------------------------------------------------------------------------------------------
# Rewriting and checking the marked sections


def markdown_files() -> list[Path]:
    found: list[Path] = []
    for pattern in FILES:
        found += sorted(REPO.glob(pattern))
    return found


def rewritten(text: str, cache: dict[str, str]) -> str:
    def body(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}")
        if name not in cache:
            cache[name] = TABLES[name]().rstrip("\n") + "\n"
        return match.group(1) + cache[name] + match.group(4)

    return MARKED.sub(body, text)


def differing(cache: dict[str, str] | None = None) -> list[str]:
    """'file: table' for every marked table that differs from what the script writes."""
    cache = {} if cache is None else cache
    stale = []
    for path in markdown_files():
        text = path.read_text()
        new = rewritten(text, cache)
        if new != text:
            old = {m.group("name"): m.group("body") for m in MARKED.finditer(text)}
            names = [
                m.group("name")
                for m in MARKED.finditer(new)
                if old.get(m.group("name")) != m.group("body")
            ]
            stale += [f"{path.relative_to(REPO)}: {n}" for n in names]
    return stale


def write() -> list[str]:
    cache: dict[str, str] = {}
    changed = []
    for path in markdown_files():
        text = path.read_text()
        new = rewritten(text, cache)
        if new != text:
            path.write_text(new)
            changed.append(str(path.relative_to(REPO)))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the marked tables")
    args = parser.parse_args(argv)
    if args.write:
        for name in write():
            print(f"rewrote {name}")
        return 0
    stale = differing()
    for line in stale:
        print(f"differs from its sources: {line}")
    if stale:
        print("run: python benchmarks/tables.py --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

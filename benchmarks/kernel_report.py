"""Static kernel report: every Triton and CUDA kernel compiled for sm_90 (and sm_80) on this
machine, no GPU needed, with what the compiled code asks of the GPU.

Triton kernels are compiled at the launch options their launchers pick for the shapes that
matter (Swin-T stages, LLM LayerNorm rows, NMS, Adam over a 1.1B-parameter list, QuickGELU,
bias_dropout_add, deform_conv2d at bench_dcn's CenterNet/DLA-34 and ResNet-50-DCN layers,
recorded from its launchers); the CUDA sources are compiled with nvcc, one row per template
instantiation. Per row: registers, spill bytes, local memory, shared memory, CTAs per SM by the
occupancy rules (``occupancy``), tensor-core instructions and the widest global load/store in
the SASS, the bytes the op must move for the shape, and the achieved fraction of copy bandwidth
where an H100 run measured the op (benchmarks/results/*.csv).

Each distinct compile runs once, in ``--workers`` processes (2), the longest first; results are
cached on disk (``--cache``, default ~/.cache/fusedops/kernel_report) keyed by the kernel's
source and the compiler versions (``Job.key``). ``python benchmarks/kernel_report.py`` writes
``results/kernel_report.csv`` and ``results/kernel_report.md``; ``--quick``: sm_90, fp32 and
bf16 only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import functools
import hashlib
import json
import math
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton._C.libtriton import get_cache_invalidating_env_vars  # noqa: E402

from fusedops.kernels.triton import _static  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CUDA_DIR = ROOT / "fusedops" / "kernels" / "cuda"
#: nvcc flags of the extension build (kernels/cuda/build.py) plus a cubin per arch.
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]
#: Copy bandwidth measured on the H100 of the result CSVs (results/NVIDIA_H100_80GB_HBM3.log).
COPY_BANDWIDTH = {"NVIDIA H100 80GB HBM3": 3006e9}


# ------------------------------------------------------------------------------------------
# Occupancy.


@dataclasses.dataclass(frozen=True)
class SM:
    """Per-SM limits of a CUDA arch (CUDA occupancy calculator rules)."""

    registers: int = 65536
    shared: int = 228 * 1024
    reserved_per_block: int = 1024
    threads: int = 2048
    blocks: int = 32
    register_granule: int = 256  # registers allocated per warp in multiples of this


ARCHS = {90: SM(), 80: SM(shared=164 * 1024)}


def occupancy(threads: int, registers: int, shared: int, arch: int = 90) -> tuple[int, str]:
    """(CTAs per SM, the limit reached: "regs", "smem", "threads" or "blocks") of a launch of
    ``threads`` threads per block, ``registers`` per thread and ``shared`` bytes of shared
    memory per block (static + dynamic) on compute capability ``arch`` (90 or 80)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    if threads <= 0 or registers < 0 or shared < 0:
        raise ValueError(
            f"threads, registers, shared must be >= 0, got {threads}, {registers}, {shared}"
        )
    sm = ARCHS[arch]
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(max(registers, 1) * 32 / sm.register_granule) * sm.register_granule
    limits = {
        "regs": (sm.registers // per_warp) // warps,
        "smem": sm.shared // (shared + sm.reserved_per_block),
        "threads": sm.threads // (warps * 32),
        "blocks": sm.blocks,
    }
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


# ------------------------------------------------------------------------------------------
# Reading compiled code.

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_MMA = re.compile(r"\b(?:HGMMA|HMMA|IMMA|QGMMA|DMMA|UTCHMMA)\b")
_GLOBAL = re.compile(r"\b(LDG|STG)((?:\.[A-Z0-9_]+)*)")


def cuobjdump() -> str:
    """Path of cuobjdump: Triton's bundled one, else the CUDA toolkit's."""
    bundled = _BIN / "cuobjdump"
    return str(bundled) if bundled.exists() else (shutil.which("cuobjdump") or "cuobjdump")


def _access_bits(suffixes: str) -> int:
    """Bits of one LDG/STG from its suffixes (".E.128.CONSTANT" -> 128, ".E" -> 32)."""
    for part in suffixes.split("."):
        if part in ("128", "64"):
            return int(part)
        if part in ("U16", "S16"):
            return 16
        if part in ("U8", "S8"):
            return 8
    return 32


def sass_facts(sass: str) -> dict:
    """Tensor-core instructions and widest global load/store bits of one function's SASS."""
    widest = {"LDG": 0, "STG": 0}
    for op, suffixes in _GLOBAL.findall(sass):
        widest[op] = max(widest[op], _access_bits(suffixes))
    return {"mma": len(_MMA.findall(sass)), "ldg_bits": widest["LDG"], "stg_bits": widest["STG"]}


def cubin_functions(cubin: Path) -> dict:
    """Per function of ``cubin``: REG, STACK, SHARED, LOCAL (cuobjdump -res-usage) and
    ``sass_facts`` of its SASS."""
    usage = subprocess.run(
        [cuobjdump(), "-res-usage", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    functions = {}
    for name, fields in re.findall(r"Function (\S+):\s*\n\s*(.*)", usage):
        functions[name] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", fields)}
    sass = subprocess.run(
        [cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    for section in sass.split("Function : ")[1:]:
        name = section.split(None, 1)[0]
        if name in functions:
            functions[name].update(sass_facts(section))
    return functions


#: ``ptxas -v`` output per entry function (the parser is shared with ``_static``).
parse_ptxas = _static.parse_ptxas


def demangle(names: list[str]) -> dict:
    """Mangled -> demangled names (cu++filt if present, else c++filt, else unchanged)."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, done.stdout.splitlines()))


# ------------------------------------------------------------------------------------------
# Triton launches.

_POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclasses.dataclass
class Launch:
    """One kernel launch of an op at one shape: the kernel, its compile-time choices and what
    the op must move (``ideal`` bytes, on the op's main kernel row; 0 on the others)."""

    op: str
    kernel: object
    dtype: torch.dtype
    shape: str
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 3
    types: dict = dataclasses.field(default_factory=dict)  # argument name -> Triton type
    options: dict = dataclasses.field(default_factory=dict)  # extra compile options
    ideal: int = 0
    measured: tuple | None = None  # key into the measured times (see measured_times)
    #: integer arguments whose value at the shape is a multiple of 16 (Triton specialises a
    #: launch on it, as it does on 16-byte aligned pointers: every pointer here is)
    divisible: tuple = ()
    variant: str = ""  # told apart in the kernel column, e.g. "atomic"
    #: the archs this launch is made on (None: every arch of the run), where the launcher
    #: picks its options per compute capability
    archs: tuple | None = None

    def made_on(self, arch: int) -> bool:
        """Whether the launcher makes this launch on a GPU of ``arch``."""
        return self.archs is None or arch in self.archs

    def name(self) -> str:
        """The kernel column: the kernel's name and its variant."""
        name = self.kernel.fn.__name__
        return f"{name} ({self.variant})" if self.variant else name

    def signature(self) -> dict:
        """Triton signature: ``_static.signature_of`` with the per-argument ``types``; every
        ``tl.constexpr`` parameter must have its value in ``constexprs``."""
        missing = [p.name for p in self.kernel.params if p.is_constexpr]
        missing = [name for name in missing if name not in self.constexprs]
        if missing:
            raise ValueError(f"{self.kernel.fn.__name__}: constexprs lacks {missing}")
        types = {k: v for k, v in self.types.items() if k in self.kernel.arg_names}
        return _static.signature_of(self.kernel, self.constexprs, _POINTER[self.dtype], types)

    def key(self, arch: int) -> tuple:
        """Identity of the compiled kernel (launches sharing it compile once)."""
        constexprs = tuple(sorted((k, str(v)) for k, v in self.constexprs.items()))
        types = tuple(sorted(self.types.items())) + tuple(sorted(self.divisible))
        options = tuple(sorted(self.options.items()))
        name = f"{self.kernel.fn.__module__}.{self.kernel.fn.__name__}"
        pointer = _POINTER[self.dtype]
        return (name, pointer, constexprs, types, options, self.num_warps, self.num_stages, arch)


def compile_triton(launch: Launch, arch: int) -> dict:
    """Compile ``launch`` for ``arch`` with Triton's own ptxas run (``_static.compile_logged``):
    shared bytes, registers and spills from that run's log, cuobjdump's stack/local and SASS
    facts of the cubin it made."""
    if _static._interpreting():
        raise RuntimeError("kernel_report compiles kernels: run it with TRITON_INTERPRET=0")
    kernel = launch.kernel
    signature = launch.signature()
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if signature[name].startswith("*") or name in launch.divisible
    }
    source = triton.compiler.ASTSource(kernel, signature, launch.constexprs, attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages, **launch.options}
    compiled, log = _static.compile_logged(source, arch, options)
    name = compiled.metadata.name
    resources = parse_ptxas(log)[name]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        facts = cubin_functions(cubin)[name]
    return {
        "registers": resources["registers"],
        "spill_bytes": resources["spill_stores"] + resources["spill_loads"],
        "local": facts["LOCAL"] + facts["STACK"],
        "shared": int(compiled.metadata.shared),
        "threads": 32 * launch.num_warps,
        "mma": facts["mma"],
        "ldg_bits": facts["ldg_bits"],
        "stg_bits": facts["stg_bits"],
    }


def _size(dtype: torch.dtype) -> int:
    return dtype.itemsize


#: Swin-T at 224 px, batch 128: (stage, tokens per side, channels, heads); windows of 7 x 7.
SWIN_T = ((1, 56, 96, 3), (2, 28, 192, 6), (3, 14, 384, 12), (4, 7, 768, 24))
SWIN_BATCH, SWIN_WINDOW, SWIN_HEAD_DIM = 128, 7, 32


#: Swin-B at 384 px, batch 32: (stage, tokens per side, heads); windows of 12 x 12 (N = 144, over
#: the short-window kernels' 64: the blocked ones), d = 32.
SWIN_B_384 = ((1, 96, 4), (2, 48, 8), (3, 24, 16), (4, 12, 32))
SWIN_B_BATCH, SWIN_B_WINDOW = 32, 12


def attention_launches(dtype, stage: int, batch: int, side: int, heads: int, window: int):
    """The window-attention launches of one Swin stage (batch images of side x side tokens,
    windows of window x window, head dim SWIN_HEAD_DIM), as the dispatch picks them on sm_90
    and on sm_80 (its blocked kernels' options are per arch)."""
    return [
        launch
        for arch in (90, 80)
        for launch in _attention_launches(dtype, stage, batch, side, heads, window, arch)
    ]


def _attention_launches(dtype, stage, batch, side, heads, window, arch: int) -> list[Launch]:
    from fusedops.kernels.triton import window_attention

    es, n, d = _size(dtype), window**2, SWIN_HEAD_DIM
    options = window_attention.launch_options(n, d, dtype, arch=arch)
    # q, k, v strides (views of Swin's qkv) and out's: multiples of d = 32
    kernels = [getattr(window_attention, name) for name in options]
    strides = tuple(a for k in kernels for a in k.arg_names if re.fullmatch(r"s[a-z]{2}", a))
    # N itself where a multiple of 16 (144), as Triton's launcher marks it
    divisible = strides + (("N",) if n % 16 == 0 else ())
    n_w = (side // window) ** 2  # windows per image
    z = batch * n_w
    masked = n_w > 1
    shape = f"stage{stage} Z={z} H={heads} N={n} D={d}"
    qkv = z * heads * n * d * es
    tables = heads * n * n * 4 + (n_w * n * n * 4 if masked else 0)  # fp32 bias, mask
    lse = z * heads * n * 4
    ideal = {
        "_forward_kernel": 4 * qkv + tables + lse,  # q, k, v, bias, mask in; out, lse
        "_backward_kernel": 7 * qkv + tables + lse + heads * n * n * 4,  # + d_bias
        "_backward_dq_kernel": 0,
    }
    ideal["_short_forward_kernel"] = ideal["_forward_kernel"]
    ideal["_short_backward_kernel"] = ideal["_backward_kernel"]
    rows = []
    for name, opts in options.items():
        constexprs = window_attention.static_launch(getattr(window_attention, name), "", opts)[2]
        if "HAS_MASK" in constexprs:
            constexprs["HAS_MASK"] = masked
        rows.append(
            Launch(
                "window_attention",
                getattr(window_attention, name),
                dtype,
                shape,
                constexprs,
                opts["num_warps"],
                opts["num_stages"],
                types={
                    "scale": "fp32",
                    "lse_ptr": "*fp32",
                    "bias_ptr": "*fp32",
                    "mask_ptr": "*fp32",
                    "dbias_ptr": "*fp32",
                    "delta_ptr": "*fp32",
                    "table_ptr": "*fp32",
                },
                ideal=ideal[name],
                divisible=divisible,
                archs=(arch,),
            )  # fmt: skip
        )
    return rows


def swin_launches(dtype: torch.dtype) -> list[Launch]:
    """Window attention, Swin softmax and window partition/reverse at the Swin-T stages, and
    window attention at Swin-B 384's (12 x 12 windows)."""
    from fusedops.kernels.triton import swin_softmax, window_process

    es, n = _size(dtype), SWIN_WINDOW**2
    rows = []
    for stage, side, heads in SWIN_B_384:
        rows += attention_launches(dtype, stage, SWIN_B_BATCH, side, heads, SWIN_B_WINDOW)
    for stage, side, channels, heads in SWIN_T:
        rows += attention_launches(dtype, stage, SWIN_BATCH, side, heads, SWIN_WINDOW)
        n_w = (side // SWIN_WINDOW) ** 2  # windows per image
        z = SWIN_BATCH * n_w
        masked = n_w > 1
        tables = heads * n * n * 4 + (n_w * n * n * 4 if masked else 0)  # fp32 bias, mask
        scores = z * heads * n * n
        block_r, block_n = swin_softmax._blocks(n)
        fp32 = {"bias_ptr": "*fp32", "mask_ptr": "*fp32", "partial_ptr": "*fp32"}
        shape = f"stage{stage} ({z}, {heads}, {n}, {n})"
        rows.append(
            Launch(
                "swin_softmax",
                swin_softmax._forward_kernel,
                dtype,
                shape,
                dict(N=n, HAS_MASK=masked, BLOCK_R=block_r, BLOCK_N=block_n),
                types=fp32,
                ideal=2 * scores * es + tables,
            )  # fmt: skip
        )
        rows.append(
            Launch(
                "swin_softmax",
                swin_softmax._backward_kernel,
                dtype,
                shape,
                swin_softmax.backward_meta(n, heads, z),  # WIDE only past 2^31 scores
                types=fp32,
                ideal=3 * scores * es + heads * n * n * 4,
            )  # fmt: skip
        )
        block_p = triton.next_power_of_2(n)
        block_c = min(triton.next_power_of_2(channels), max(16, window_process.TILE // block_p))
        shape = f"stage{stage} (128, {side}, {side}, {channels}) w7 s3"
        for reverse in (False, True):
            rows.append(
                Launch(
                    "window_process",
                    window_process._window_gather_kernel,
                    dtype,
                    shape,
                    dict(WINDOW_H=7, WINDOW_W=7, REVERSE=reverse, BLOCK_P=block_p, BLOCK_C=block_c),
                    ideal=2 * SWIN_BATCH * side * side * channels * es,
                    divisible=("channels",),
                )  # fmt: skip
            )
    return rows


#: (M, N) of the LayerNorm rows: LLM hidden sizes at 16384 tokens, and the M = 4096 sweep.
LAYER_NORM_SHAPES = [(16384, 2048), (16384, 4096), (16384, 8192)] + [
    (4096, 2**k) for k in range(10, 17)
]
#: Multiprocessors of an H100 SXM (the backward's partial rows: device.programs_to_fill).
H100_SMS = 132


def layer_norm_launches(dtype: torch.dtype) -> list[Launch]:
    """LayerNorm forward and backward (weight and bias) kernels at ``LAYER_NORM_SHAPES``."""
    from fusedops.kernels.triton import layer_norm as ln

    es = _size(dtype)
    fp32 = {n: "*fp32" for n in ("mean_ptr", "rstd_ptr", "c_ptr", "dw_ptr", "db_ptr")}
    fp32.update(partial_ptr="*fp32", eps="fp32")
    flags = dict(HAS_WEIGHT=True, HAS_BIAS=True, RMS=False, XHAT_ROUND=0)
    rows = []
    for m, n in LAYER_NORM_SHAPES:
        shape = f"({m}, {n})"
        fwd_ideal = 2 * m * n * es + 2 * n * es + 2 * m * 4
        bwd_ideal = 3 * m * n * es + 3 * n * es + 2 * m * 4
        common = dict(types=fp32, divisible=("M", "N"))
        fwd, bwd = ("layer_norm", m, n, "fwd"), ("layer_norm", m, n, "bwd")
        if n <= ln.MAX_FUSED_N_FORWARD:
            block_m, block_n, warps = ln._register_tile(n)
            chunk = ln._forward_chunk(block_m, block_n, warps, es)
            rows.append(Launch("layer_norm", ln._forward_rows_kernel, dtype, shape,
                               dict(flags, BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=chunk), warps,
                               ideal=fwd_ideal, measured=fwd, **common))  # fmt: skip
        else:
            rows.append(Launch("layer_norm", ln._forward_loop_kernel, dtype, shape,
                               dict(flags, BLOCK_N=ln.LOOP_BLOCK_N), 8,
                               ideal=fwd_ideal, measured=fwd, **common))  # fmt: skip
        programs = H100_SMS * 4
        if n <= ln.MAX_FUSED_N:
            block_m, block_n, warps = ln._register_tile(n, backward=True)
            programs = min(triton.cdiv(m, block_m), programs)
            rows.append(Launch("layer_norm", ln._backward_rows_kernel, dtype, shape,
                               dict(flags, BLOCK_M=block_m, BLOCK_N=block_n), warps,
                               ideal=bwd_ideal, measured=bwd, **common))  # fmt: skip
        else:
            programs = min(m, programs)
            rows.append(Launch("layer_norm", ln._backward_coeffs_kernel, dtype, shape,
                               dict(HAS_WEIGHT=True, RMS=False, BLOCK_N=ln.LOOP_BLOCK_N), 8,
                               ideal=bwd_ideal, measured=bwd, **common))  # fmt: skip
            rows.append(Launch("layer_norm", ln._backward_columns_kernel, dtype, shape,
                               dict(flags, BLOCK_N=min(ln.LOOP_BLOCK_N, 1024)), 4,
                               **common))  # fmt: skip
        splits = triton.cdiv(programs, ln.SPLIT_ROWS)
        if splits > 1:  # _column_sum's first stage: fp32 rows of split sums
            rows.append(Launch("layer_norm", ln._column_sum_kernel, dtype,
                               f"({programs}, {n}) partial -> ({splits}, {n})",
                               dict(BLOCK_P=min(32, ln.SPLIT_ROWS), BLOCK_N=ln.SPLIT_BLOCK_N), 4,
                               types={"partial_ptr": "*fp32", "out_ptr": "*fp32",
                                      "out2_ptr": "*fp32"},
                               divisible=("N",)))  # fmt: skip
            programs = splits
        block_p = min(32, triton.next_power_of_2(programs))
        block_n = min(max(128, ln.TILE_ELEMENTS // block_p), triton.next_power_of_2(n))
        rows.append(Launch("layer_norm", ln._column_sum_kernel, dtype, f"({programs}, {n}) partial",
                           dict(BLOCK_P=block_p, BLOCK_N=block_n), 4,
                           types={"partial_ptr": "*fp32"}, divisible=("N",)))  # fmt: skip
    return rows


def elementwise_launches(dtype: torch.dtype) -> list[Launch]:
    """QuickGELU at 2^24 elements and bias_dropout_add at (32*65, 384) and (16384, 4096)."""
    from fusedops.kernels.shared import philox
    from fusedops.kernels.triton import bias_dropout_add as bda
    from fusedops.kernels.triton import quick_gelu

    es, n = _size(dtype), 2**24
    rows = [
        Launch("quick_gelu", quick_gelu._forward_kernel, dtype, f"({n},)",
               dict(BLOCK=quick_gelu.BLOCK), types={"alpha": "fp32"}, ideal=2 * n * es,
               measured=("quick_gelu", n, "fwd"), divisible=("n",)),
        Launch("quick_gelu", quick_gelu._backward_kernel, dtype, f"({n},)",
               dict(BLOCK=quick_gelu.BLOCK), types={"alpha": "fp32"}, ideal=3 * n * es,
               measured=("quick_gelu", n, "bwd"), divisible=("n",)),
    ]  # fmt: skip
    p = 0.1
    types = {"seed_ptr": "*i64", "partial_ptr": "*fp32", "threshold": "i64", "scale": "fp32"}
    for m, h in ((32 * 65, 384), (16384, 4096)):
        shape = f"({m}, {h}) p={p}"
        for reduce in (False, True):  # forward; backward with the bias gradient
            block_m, block_n, warps = bda.blocks(m, h, es, h % 4 == 0, reduce)
            constexprs = dict(
                HAS_BIAS=not reduce, HAS_RESIDUAL=not reduce, REDUCE=reduce,
                MODE=philox.dropout_mode(p, True), GROUPED=h % 4 == 0,
                BLOCK_M=block_m, BLOCK_N=block_n,
            )  # fmt: skip
            ideal = (4 * m * h * es + h * es) if not reduce else (2 * m * h * es + h * es)
            rows.append(Launch("bias_dropout_add", bda._kernel, dtype, shape, constexprs, warps,
                               types=types, ideal=ideal, divisible=("M", "H")))  # fmt: skip
    return rows


def adam_launches(dtype: torch.dtype) -> list[Launch]:
    """AdamW over a 1.1B-parameter list (TinyLlama-1.1B: 1,100,048,384): fp32 params and
    state; 16-bit params with fp32 master weights and fp32 state."""
    from fusedops.kernels.triton import _multi_tensor, adam

    numel = 1_100_048_384
    master = dtype != torch.float32
    constexprs = dict(
        PARAM_DTYPE=_TL[dtype], STATE_DTYPE=tl.float32, AMSGRAD=False, MAXIMIZE=False,
        DECOUPLED=True, HAS_WEIGHT_DECAY=True, HAS_MASTER=master, LR_ON_DEVICE=False,
        HAS_GRAD_SCALE=False, HAS_FOUND_INF=False, HAS_CLIP=False, CHUNK=_multi_tensor.CHUNK,
        BLOCK=_multi_tensor.BLOCK, ALIGNED=True, EMULATE_RTNE=False,
    )  # fmt: skip
    types = {n: "fp32" for n in ("lr", "beta1", "beta2", "eps", "weight_decay")}
    types.update(table_ptr="*i64", lr_ptr="*fp32", grad_scale_ptr="*fp32", found_inf_ptr="*fp32")
    types.update(clip_coef_ptr="*fp32")
    es = _size(dtype)
    # read grad, param (or master), m, v; write them back (+ the 16-bit param with a master)
    ideal = numel * (es + 4 * 4 + (8 + es if master else 2 * es))
    shape = f"{numel} params, {triton.cdiv(numel, _multi_tensor.CHUNK)} chunks"
    return [Launch("adam", adam._adam_kernel, dtype, shape, constexprs, types=types, ideal=ideal)]


def nms_launches(dtype: torch.dtype) -> list[Launch]:
    """Greedy NMS (mask + walk) and soft-NMS at 1k, 10k and 100k boxes (one class)."""
    from fusedops.kernels.triton import nms

    rows = []
    types = {"classes_ptr": "*i64", "col_end_ptr": "*i64", "mask_ptr": "*i64",
             "removed_ptr": "*i64", "positions_ptr": "*i64", "count_ptr": "*i64",
             "iou_threshold": "fp32", "offset": "fp32", "sigma": "fp32", "min_score": "fp32",
             "scores_ptr": "*fp32", "work_ptr": "*fp32", "starts_ptr": "*i64",
             "picked_ptr": "*fp32", "counts_ptr": "*i64"}  # fmt: skip
    exact = {"enable_fp_fusion": False}
    for n in (1000, 10_000, 100_000):
        ideal = n * 4 * _size(dtype) + n * 8  # boxes in, kept positions out
        shape = f"{n} boxes"
        rows.append(Launch("nms", nms._mask_kernel, dtype, shape, dict(BATCHED=False),
                           types=types, options=exact, ideal=ideal))  # fmt: skip
        walk = dict(BATCHED=False, COLUMNS=nms.WALK_COLUMNS, SCAN=nms.WALK_SCAN)
        rows.append(Launch("nms", nms._walk_kernel, dtype, shape, walk,
                           num_warps=nms.WALK_WARPS, types=types))  # fmt: skip
        block = min(nms.SOFT_BLOCK, triton.next_power_of_2(n))
        rows.append(Launch("soft_nms", nms._soft_nms_kernel, dtype, shape,
                           dict(METHOD=2, BLOCK=block), types=types, options=exact,
                           ideal=n * (4 * _size(dtype) + 4 + 8 + 4)))  # fmt: skip
    return rows


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel while its launcher runs: ``kernel[grid](...)``
    records the call instead of launching it."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.kernel, args, kwargs))

        return launch


def recorded_calls(module, run) -> list[tuple]:
    """(kernel, args, kwargs) of every kernel launch that ``run()`` makes through the launchers
    of Triton kernel ``module``: its jit functions are stood in for while ``run`` runs, so
    nothing is launched (meta tensors will do for the tensor arguments)."""
    calls: list = []
    kernels = _static._jit_functions(module)
    try:
        for name, kernel in kernels.items():
            setattr(module, name, _Recorder(kernel, calls))
        run()
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)
    return calls


def launch_of(op: str, call: tuple, dtype: torch.dtype, shape: str, **fields) -> Launch:
    """The Launch of a recorded ``call`` (``recorded_calls``), specialised as Triton's runtime
    specialises it: tensors by dtype (16-byte aligned), integers equal to 1 as constexprs,
    multiples of 16 as divisible, beyond 2^31 as i64; num_warps/num_stages as given, else
    Triton's defaults. ``fields``: the other Launch fields (ideal, variant, ...)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    kernel, args, kwargs = call
    kwargs = dict(kwargs)
    num_warps, num_stages = kwargs.pop("num_warps", 4), kwargs.pop("num_stages", 3)
    values = {**dict(zip(kernel.arg_names, args)), **kwargs}
    constexprs, types, divisible = {}, {}, []
    for param in kernel.params:
        value = values.get(param.name, param.default)
        if param.is_constexpr:
            constexprs[param.name] = value
            continue
        kind, attribute = native_specialize_impl(
            CUDABackend, value, False, not param.do_not_specialize,
            not param.do_not_specialize_on_alignment,
        )  # fmt: skip
        if kind == "constexpr":
            constexprs[param.name] = attribute
            continue
        types[param.name] = kind
        if attribute == "D" and not kind.startswith("*"):
            divisible.append(param.name)
    return Launch(op, kernel, dtype, shape, constexprs, num_warps, num_stages, types=types,
                  divisible=tuple(divisible), **fields)  # fmt: skip


def _deform_conv2d_calls(geo, dtype: torch.dtype, with_mask: bool = True) -> None:
    """Call deform_conv2d's Triton launchers as one DCNv2 layer's (``with_mask=False``: DCNv1)
    forward and backward (both modes) do, on meta tensors of ``dtype``: columns, sample
    gradients (atomic, then deterministic), segment gather."""
    from fusedops.kernels.triton import deform_conv2d as kernels

    def meta(kind=dtype):
        return torch.empty(0, dtype=kind, device="meta")

    x, offset, grad_cols = meta(), meta(), meta()
    mask = meta() if with_mask else None
    kernels._columns(meta(), x, offset, mask, geo)
    args = (grad_cols, x, offset, mask, geo, meta(), meta())
    kernels._sample_grads(*args, meta(torch.float32), None, None)
    kernels._sample_grads(*args, None, meta(torch.int64), meta(torch.float32))
    order, coefs, starts = meta(torch.int64), meta(torch.float32), meta(torch.int64)
    kernels._segment_gather(grad_cols, order, coefs, starts, meta(), geo)


def deform_conv2d_launches(dtype: torch.dtype) -> list[Launch]:
    """deform_conv2d's Triton kernels as its launchers (kernels/triton/deform_conv2d.py) call
    them, recorded without launching, at the CenterNet/DLA-34 and ResNet-50-DCN layers of
    benchmarks/bench_dcn.py (3x3, padding 1, one offset group, with a mask: DCNv2; and without
    one, DCNv1, whose kernels are compiled with ``HAS_MASK=False``). Per layer:
    the columns (forward; the backward recomputes them with the same launch), the sample
    gradients with atomics into the fp32 input gradient or (deterministic) writing keys and
    coefficients, and the deterministic input-gradient gather. The three matrix products and
    the deterministic path's sort are ATen calls, not kernels of this package.

    Ideal bytes: each tensor a kernel must read or write, once: input (B C H W), offset and
    mask (3 B K L), the columns (C K B L), the fp32 input gradient (atomic), keys and
    coefficients (12 B per corner, 4 corners per sample), the segment starts."""
    from bench_dcn import SHAPES

    from fusedops.kernels import deform_conv2d_host as host
    from fusedops.kernels.triton import deform_conv2d as kernels

    es, rows = _size(dtype), []
    for name, batch, cin, cout, h, w, stride in SHAPES:
        h_out, w_out = (h - 1) // stride + 1, (w - 1) // stride + 1
        geo = host.Geometry(
            batch, cin, h, w, cout, 1, 3, 3, 1, h_out, w_out, (stride,) * 2, (1, 1), (1, 1)
        )
        image, samples = batch * cin * h * w, geo.samples
        columns = cin * geo.points * batch * geo.pixels
        corners = 4 * samples * (8 + 4)  # int64 key (or order) and fp32 coefficient per corner
        for with_mask in (True, False):
            shape = f"{name} ({batch}, {cin}, {h}, {w}) -> {cout}"
            shape += "" if with_mask else " DCNv1"
            record = functools.partial(_deform_conv2d_calls, geo, dtype, with_mask)
            calls = recorded_calls(kernels, record)
            modulation = 3 if with_mask else 2  # offset (2) and mask (1) values per sample
            fields = [
                dict(ideal=es * (image + modulation * samples + columns)),
                dict(
                    ideal=es * (columns + image + 2 * modulation * samples) + 4 * image,
                    variant="atomic",
                ),  # fmt: skip
                dict(
                    ideal=es * (columns + image + 2 * modulation * samples) + corners,
                    variant="deterministic",
                ),  # fmt: skip
                dict(ideal=es * (columns + image) + corners + 8 * (batch * h * w + 1)),
            ]
            if len(calls) != len(fields):
                raise RuntimeError(f"deform_conv2d launchers made {len(calls)} launches, not 4")
            rows += [
                launch_of("deform_conv2d", c, dtype, shape, **f) for c, f in zip(calls, fields)
            ]
    return rows


def triton_launches(dtypes) -> list[Launch]:
    """Every Triton launch of the report for ``dtypes``."""
    builders = (
        swin_launches, layer_norm_launches, elementwise_launches, adam_launches,
        deform_conv2d_launches,
    )  # fmt: skip
    rows = [launch for dtype in dtypes for build in builders for launch in build(dtype)]
    return rows + nms_launches(torch.float32)


# ------------------------------------------------------------------------------------------
# CUDA kernels.

#: Threads per block of each CUDA kernel, from the launchers in the .cu files (<<<..., N>>>);
#: dynamic shared memory (nms walk/soft: per box count) is left out of the occupancy.
CUDA_THREADS = {
    "adam": {"": 512},
    "bias_dropout_add": {"": 256},
    "deform_conv2d": {"": 256},
    "layer_norm": {"": 256},
    "nms": {"nms_mask_kernel": 64, "nms_walk_kernel": 512, "soft_nms_kernel": 512},
    "quick_gelu": {"": 256},
    "swin_softmax": {"": 256},
    "window_attention": {"": 32 * 4},
    "window_process": {"": 256},
}
_CUDA_DTYPES = (
    ("__nv_bfloat16", "bf16"),
    ("__half", "fp16"),
    ("float", "fp32"),
    ("double", "fp64"),
)


_ANONYMOUS = "fusedops::(anonymous namespace)::"


def cuda_kernel_name(demangled: str) -> str:
    """A demangled kernel's name with its template arguments, without the return type, the
    ``fusedops::(anonymous namespace)::`` prefix and the parameter list:
    ``void fusedops::(anonymous namespace)::k<float, true>(float const*, int)`` ->
    ``k<float, true>``."""
    name = demangled.replace(_ANONYMOUS, "").replace("fusedops::", "")
    name = name.removeprefix("void ")
    depth = 0
    for i, char in enumerate(name):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "(" and depth == 0:
            return name[:i]
    return name


def _cuda_dtype(demangled: str) -> str:
    """The first element type named in a kernel's template arguments."""
    args = demangled.split("<", 1)[1] if "<" in demangled else ""
    found = [(args.find(t), name) for t, name in _CUDA_DTYPES if t in args]
    return min(found)[1] if found else "-"


def compile_cuda(source: Path, arch: int) -> dict:
    """Compile ``source`` with nvcc for ``arch``: per kernel instantiation (mangled name), its
    demangled name, cuobjdump's resources and SASS facts (``cubin_functions``) and ptxas's
    (``parse_ptxas``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        command = ["nvcc", "-cubin", f"-arch=sm_{arch}", *NVCC_FLAGS, "-Xptxas", "-v"]
        command += [f"-I{CUDA_DIR}", str(source), "-o", str(cubin)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        ptxas = parse_ptxas(done.stdout + done.stderr)
        functions = cubin_functions(cubin)
    names = demangle(sorted(functions))
    return {
        mangled: {**facts, "demangled": names[mangled], "ptxas": ptxas.get(mangled, {})}
        for mangled, facts in functions.items()
    }


def cuda_rows(source: Path, arch: int, compiled: dict) -> list[dict]:
    """One report row per kernel instantiation of ``compiled`` (``compile_cuda`` of ``source``
    for ``arch``), threads per block from ``CUDA_THREADS``."""
    op, rows = source.stem, []
    for _, facts in sorted(compiled.items()):
        pretty = facts["demangled"]
        kernel = cuda_kernel_name(pretty)
        base = kernel.split("<", 1)[0]
        threads = CUDA_THREADS[op].get(base, CUDA_THREADS[op].get(""))
        if threads is None:
            raise ValueError(f"CUDA_THREADS[{op!r}] gives no block size for {base}")
        resources = facts["ptxas"]
        rows.append({
            "op": op, "kernel": kernel,
            "backend": "cuda", "dtype": _cuda_dtype(pretty), "shape": "every shape (instantiation)",
            "arch": arch, "registers": facts["REG"],
            "spill_bytes": resources.get("spill_stores", 0) + resources.get("spill_loads", 0),
            "local": facts["LOCAL"] + facts["STACK"], "shared": resources.get("smem", 0),
            "threads": threads,
            "mma": facts["mma"], "ldg_bits": facts["ldg_bits"], "stg_bits": facts["stg_bits"],
            "ideal_bytes": "", "achieved": "",
        })  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------------
# Measured times and the report.


def measured_times(results: Path = RESULTS) -> dict:
    """(op, ..., direction, provider, dtype) -> (ms, copy bandwidth B/s) from the H100 CSVs."""
    times = {}
    for path in sorted(results.glob("*.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                bandwidth = COPY_BANDWIDTH.get(row.get("gpu", ""))
                if bandwidth is None or "ms" not in row or "quick" in path.name:
                    continue
                dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(row["dtype"])
                provider = row["provider"].replace("fusedops-", "")
                if row["op"] == "layer_norm":
                    key = ("layer_norm", int(row["M"]), int(row["N"]), row["direction"])
                elif row["op"] == "quick_gelu":
                    key = ("quick_gelu", int(row["numel"]), row["direction"])
                else:
                    continue
                times[(*key, provider, dtype)] = (float(row["ms"]), bandwidth)
    return times


FIELDS = [
    "op", "kernel", "backend", "arch", "dtype", "shape", "threads", "registers", "spill_bytes",
    "local", "shared", "ctas_per_sm", "limit", "mma", "ldg_bits", "stg_bits", "ideal_bytes",
    "achieved",
]  # fmt: skip


def finish(row: dict) -> dict:
    """``row`` with CTAs per SM and their limit filled in."""
    ctas, limit = occupancy(row["threads"], row["registers"], row["shared"], row["arch"])
    return {**row, "ctas_per_sm": ctas, "limit": limit}


# ------------------------------------------------------------------------------------------
# Compile jobs: deduplicated, cached on disk, run by a pool of processes.

#: Bump when what a cached compile result holds changes meaning (a new column, a new parser).
CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    """Where compile results are kept between runs: $XDG_CACHE_HOME (else ~/.cache) /
    fusedops/kernel_report."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fusedops" / "kernel_report"


def _digest(*parts) -> str:
    """A hex digest of ``parts`` (anything ``str`` renders stably)."""
    text = json.dumps(parts, default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def nvcc_version() -> str:
    """nvcc's ``--version`` text ("" without nvcc)."""
    done = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else ""


def _file_digest(paths) -> str:
    return _digest(*[(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths])


@dataclasses.dataclass
class Job:
    """One compile: a Triton launch (``launch``) or a CUDA source (``source``) for ``arch``."""

    arch: int
    launch: Launch | None = None
    source: Path | None = None

    def key(self) -> str:
        """The cache key: a digest of everything the compiled result depends on (the kernel's
        source through Triton's ``cache_key``, which covers the jit functions it calls; the .cu
        file and the headers beside it; compiler versions and options)."""
        if self.launch is not None:
            launch, env = self.launch, get_cache_invalidating_env_vars()
            identity = (launch.key(self.arch), launch.kernel.cache_key, env)
            return _digest(CACHE_FORMAT, "triton", triton.__version__, *identity)
        headers = sorted(p for p in self.source.parent.iterdir() if p.suffix in (".cuh", ".h"))
        return _digest(
            CACHE_FORMAT, "cuda", nvcc_version(), NVCC_FLAGS, self.arch,
            _file_digest([self.source]), _file_digest(headers),
        )  # fmt: skip

    def label(self) -> str:
        """What the job compiles, for progress lines."""
        if self.launch is not None:
            launch = self.launch
            return f"{launch.name()} {_NAME[launch.dtype]} sm_{self.arch}"
        return f"{self.source.name} sm_{self.arch}"

    def run(self):
        """The compiled facts (``compile_triton`` or ``compile_cuda``)."""
        if self.launch is not None:
            return compile_triton(self.launch, self.arch)
        return compile_cuda(self.source, self.arch)

    def expected_seconds(self) -> float:
        """A guess at the compile time, to start the longest first: an nvcc run compiles every
        instantiation in its file (the biggest file: layer_norm.cu, minutes), a Triton launch
        takes seconds."""
        return 1000.0 + self.source.stat().st_size / 100 if self.source else 1.0


class ResultCache:
    """Compile results on disk under ``directory`` (None: no cache), one JSON file per job key;
    ``durations.json`` keeps how long each job label took last time (the scheduling order)."""

    def __init__(self, directory: Path | None):
        self.directory = Path(directory) if directory is not None else None

    def get(self, key: str):
        """The stored result for ``key``, or None."""
        if self.directory is None:
            return None
        try:
            return json.loads((self.directory / f"{key}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, value) -> None:
        """Store ``value`` (JSON-ready) for ``key`` (written whole or not at all)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{key}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(value))
        os.replace(temporary, path)

    def durations(self) -> dict:
        """label -> seconds of the last run that compiled it."""
        return self.get("durations") or {}


#: The jobs being compiled: forked workers inherit them (kernels do not pickle).
_JOBS: list = []


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its finished children (nvcc, ptxas)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run_job(index: int) -> tuple:
    """(result, wall seconds, CPU seconds) of job ``index``."""
    start, cpu = time.perf_counter(), _cpu_seconds()
    result = _JOBS[index].run()
    return result, time.perf_counter() - start, _cpu_seconds() - cpu


def run_jobs(jobs: list[Job], workers: int, cache: ResultCache, progress=print) -> tuple:
    """(key -> result of every job, how many came from ``cache``): cached results where present,
    the others compiled once per distinct key by ``workers`` forked processes, the longest
    expected first."""
    results, todo = {}, {}
    for job in jobs:
        key = job.key()
        if key in results or key in todo:
            continue
        hit = cache.get(key)
        if hit is not None:
            results[key] = hit
        else:
            todo[key] = job
    cached = len(results)
    progress(f"{cached} compiles cached, {len(todo)} to do with {workers} processes")
    if not todo:
        return results, cached
    known = cache.durations()
    order = sorted(todo, key=lambda k: -known.get(todo[k].label(), todo[k].expected_seconds()))
    _JOBS[:] = [todo[key] for key in order]
    total_cpu = 0.0
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_run_job, i): key for i, key in enumerate(order)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            key = futures[future]
            results[key], seconds, cpu = future.result()
            cache.put(key, results[key])
            known[todo[key].label()] = round(seconds, 1)
            total_cpu += cpu
            label = todo[key].label()
            progress(f"[{done}/{len(todo)}] {seconds:6.1f} s ({cpu:5.1f} s CPU)  {label}")
    cache.put("durations", known)
    progress(f"compiled in {total_cpu:.0f} s of CPU")
    return results, cached


def triton_rows(launches: list[Launch], archs, results: dict) -> list[dict]:
    """One row per launch and arch from the compiled ``results`` (``run_jobs``)."""
    times = measured_times()
    rows = []
    for launch in launches:
        for arch in (a for a in archs if launch.made_on(a)):
            facts = results[Job(arch, launch).key()]
            achieved = ""
            dtype = _NAME[launch.dtype]
            if launch.measured and (hit := times.get((*launch.measured, "triton", dtype))):
                ms, bandwidth = hit
                achieved = f"{launch.ideal / (ms * 1e-3) / bandwidth:.3f}"
            rows.append(finish({
                "op": launch.op, "kernel": launch.name(), "backend": "triton",
                "arch": arch, "dtype": dtype, "shape": launch.shape, **facts,
                "ideal_bytes": launch.ideal or "", "achieved": achieved if arch == 90 else "",
            }))  # fmt: skip
    return rows


def predictions(rows: list[dict]) -> list[str]:
    """One sentence per (op, backend, dtype) at sm_90, from the numbers only."""
    groups: dict = {}
    for row in rows:
        if row["arch"] == 90:
            groups.setdefault((row["op"], row["backend"], row["dtype"]), []).append(row)
    lines = []
    for (op, backend, dtype), members in sorted(groups.items()):
        spills = max(int(r["spill_bytes"]) for r in members)
        local = max(int(r["local"]) for r in members)
        mma = sum(int(r["mma"]) for r in members)
        ldg = max(int(r["ldg_bits"]) for r in members)
        stg = max(int(r["stg_bits"]) for r in members)
        ctas = sorted({(int(r["ctas_per_sm"]), r["limit"]) for r in members})
        occupancy_text = ", ".join(f"{c} ({lim})" for c, lim in ctas)
        mma_text = f"{mma} tensor-core instructions" if mma else "no tensor-core instructions"
        spill_text = f"spills up to {spills} B/thread" if spills else "no spills"
        lines.append(
            f"- **{op} {backend} {dtype}** ({len(members)} rows): {mma_text}; {spill_text}; "
            f"local memory up to {local} B; widest global load {ldg} bits, store {stg} bits; "
            f"CTAs/SM {occupancy_text}."
        )
    return lines


#: Ops whose kernels stream memory without matrix products: a 16-bit row there should load and
#: store 16 bytes at a time where rows are aligned.
BANDWIDTH_BOUND = (
    "adam", "bias_dropout_add", "deform_conv2d", "layer_norm", "quick_gelu", "swin_softmax",
    "window_process",
)  # fmt: skip
#: Kernels whose global stores are reductions, a few values a row or a column (LayerNorm's
#: backward coefficients and dweight/dbias column sums): judged by their loads alone, the
#: traffic that scales with the rows.
REDUCTION_KERNELS = (
    "row_coeffs_kernel", "column_sum_kernel", "_backward_coeffs_kernel", "_column_sum_kernel",
)  # fmt: skip


def _grouped(rows: list[dict], keep, describe) -> list[str]:
    """One markdown line per (op, backend, kernel, dtype, arch) among the ``rows`` where
    ``keep(row)``: how many of its shapes (rows) and ``describe(members)``."""
    groups: dict = {}
    for row in rows:
        if keep(row):
            key = (row["op"], row["backend"], row["kernel"], row["dtype"], int(row["arch"]))
            groups.setdefault(key, []).append(row)
    lines = []
    for (op, backend, kernel, dtype, arch), members in sorted(groups.items()):
        lines.append(
            f"- {op} {backend} `{kernel}` {dtype} sm_{arch} ({len(members)} rows): "
            f"{describe(members)}"
        )
    return lines or ["- none"]


_VALUE_ARGUMENT = re.compile(r"^(-?\d+[uUlL]*|true|false)$")


def _family(row: dict) -> tuple:
    """(op, backend, kernel, dtype, arch) of a row, the kernel without the template
    arguments that are values (vector widths, tile sizes, flags): the instantiations one
    launcher picks among for the same types (``adam_kernel<__half, float>``)."""
    name, _, arguments = row["kernel"].partition("<")
    types = [a.strip() for a in arguments.rstrip(">").split(",") if a.strip()]
    types = [a for a in types if not _VALUE_ARGUMENT.match(a)]
    kernel = f"{name}<{', '.join(types)}>" if types else name
    return (row["op"], row["backend"], kernel, row["dtype"], row["arch"])


def _fallbacks(rows: list[dict], keep) -> list[str]:
    """One markdown line per kernel family (``_family``) among the ``rows`` where
    ``keep(row)``: how many instantiations, per arch."""
    counts: dict = {}
    for row in rows:
        if keep(row):
            op, backend, kernel, dtype, arch = _family(row)
            counts.setdefault((op, backend, kernel, dtype), {}).setdefault(int(arch), 0)
            counts[(op, backend, kernel, dtype)][int(arch)] += 1
    lines = []
    for (op, backend, kernel, dtype), per_arch in sorted(counts.items()):
        archs = ", ".join(f"{n} at sm_{arch}" for arch, n in sorted(per_arch.items()))
        lines.append(f"- {op} {backend} `{kernel}` {dtype}: {archs}")
    return lines or ["- none"]


def findings(rows: list[dict]) -> list[str]:
    """Markdown sections listing the rows that break the report's rules: spills or local
    memory; 16-bit bandwidth-bound kernels without 16-byte global loads or stores; attention
    matrix products (the Triton window-attention kernels; the CUDA backend's products are
    cuBLAS calls) without tensor-core instructions."""

    def spilled(members):
        spills = max(int(r["spill_bytes"]) for r in members)
        local = max(int(r["local"]) for r in members)
        return f"spill bytes up to {spills}, local memory up to {local} B per thread"

    def widths(members):
        ldg = sorted({int(r["ldg_bits"]) for r in members})
        stg = sorted({int(r["stg_bits"]) for r in members})
        return f"widest load {'/'.join(map(str, ldg))} bits, store {'/'.join(map(str, stg))} bits"

    def bandwidth_bound_16bit(row):
        return row["dtype"] in ("fp16", "bf16") and row["op"] in BANDWIDTH_BOUND

    def wide(row):
        reduction = row["kernel"].partition("<")[0].split(" ")[0] in REDUCTION_KERNELS
        stores = 128 if reduction else int(row["stg_bits"])
        return min(int(row["ldg_bits"]), stores) >= 128

    # CUDA families (one kernel's instantiations) with a 16-byte instantiation per dtype and
    # arch: their narrow instantiations are the scalar paths for rows that are not aligned
    vectorised = {
        _family(r) for r in rows if r["backend"] == "cuda" and bandwidth_bound_16bit(r) and wide(r)
    }

    def narrow(row):
        return bandwidth_bound_16bit(row) and not wide(row) and _family(row) not in vectorised

    def fallback(row):
        return bandwidth_bound_16bit(row) and not wide(row) and _family(row) in vectorised

    def products(members):
        return f"ctas/SM {sorted({int(r['ctas_per_sm']) for r in members})}, no mma"

    return [
        "### Spills or local memory", "",
        *_grouped(rows, lambda r: int(r["spill_bytes"]) or int(r["local"]), spilled), "",
        "### 16-bit bandwidth-bound kernels without 16-byte global accesses", "",
        *_grouped(rows, narrow, widths), "",
        "CUDA instantiations for rows that are not 16-byte aligned (scalar accesses), in "
        "kernels that also have a 16-byte instantiation of the dtype (which one runs is the "
        "launcher's choice, by the rows' alignment):", "",
        *_fallbacks(rows, fallback), "",
        "### Attention matrix products without tensor-core instructions", "",
        *_grouped(
            rows,
            lambda r: r["op"] == "window_attention" and r["backend"] == "triton"
            and not int(r["mma"]),
            products,
        ),
        "",
    ]  # fmt: skip


def markdown(rows: list[dict], header: str = "") -> str:
    """The report as markdown: ``header``, the findings, the per-family predictions and one
    table row per kernel launch (``FIELDS`` columns)."""
    lines = [header, "## Findings", "", *findings(rows)]
    lines += ["## What the report predicts", "", *predictions(rows), "", "## Kernels", ""]
    lines.append("| " + " | ".join(FIELDS) + " |")
    lines.append("|" + "---|" * len(FIELDS))
    for row in rows:
        cells = [str(row.get(f, "")).replace("|", "\\|") for f in FIELDS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


HEADER = """# Static kernel report

Written by `benchmarks/kernel_report.py` ({mode}; Triton {triton}, {nvcc}); no GPU was used.
Triton rows: one per launch the launchers pick for the shape; CUDA rows: one per template
instantiation in the .cu sources (threads per block from the launchers, dynamic shared memory
not counted). registers: per thread; spill_bytes: ptxas spill stores + loads per thread; local:
local memory (stack frame) per thread; shared: bytes per block; ctas_per_sm / limit: occupancy
by the {arch} rules; mma: tensor-core instructions (HMMA/HGMMA/...) in the SASS; ldg_bits /
stg_bits: widest global load / store; ideal_bytes: what the op must read and write once for the
shape (on the op's main kernel row); achieved: ideal_bytes / measured H100 time / measured copy
bandwidth (3006 GB/s) where benchmarks/results holds a time for that op, shape and dtype.
Triton launches are specialised as Triton's runtime specialises them at the shape (integer
arguments equal to 1 as constants, multiples of 16 as divisible); deform_conv2d's are recorded
from its launchers (its three matrix products and the deterministic path's sort are ATen calls,
not kernels of this package, so not here). This run: {compiled} distinct compiles ({cached}
from the cache) with {workers} processes, {seconds:.0f} s in all.
"""


def merged_rows(path: Path, op: str, rows: list[dict]) -> list[dict]:
    """The rows of the report at ``path`` with those of ``op`` replaced by ``rows`` (in the
    place of the op's first row; at the end where it had none)."""
    with open(path, newline="") as f:
        old = [{**r, "arch": int(r["arch"])} for r in csv.DictReader(f)]
    keep = [r for r in old if r["op"] != op]
    first = next((i for i, r in enumerate(old) if r["op"] == op), len(old))
    before = sum(1 for r in old[:first] if r["op"] != op)
    return keep[:before] + rows + keep[before:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sm_90, fp32 and bf16 only")
    parser.add_argument(
        "--workers", type=int, default=2, help="compile processes (default 2: this machine's cores)"
    )
    parser.add_argument(
        "--cache", type=Path, default=default_cache_dir(), help="compile results kept here"
    )
    parser.add_argument("--no-cache", action="store_true", help="compile everything afresh")
    parser.add_argument(
        "--op",
        help="only this op's kernels (e.g. window_attention): its rows replace the op's rows of "
        "the existing results, the other rows are kept as they are",
    )
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    start = time.time()
    archs = (90,) if args.quick else (90, 80)
    dtypes = [torch.float32, torch.bfloat16]
    if not args.quick:
        dtypes.insert(1, torch.float16)
    launches = triton_launches(dtypes)
    sources = sorted(CUDA_DIR.glob("*.cu"))
    if args.op:
        launches = [launch for launch in launches if launch.op == args.op]
        sources = [source for source in sources if source.stem == args.op]
        if not launches and not sources:
            parser.error(f"--op {args.op!r} names no op of the report")
    jobs = [Job(arch, launch) for launch in launches for arch in archs if launch.made_on(arch)]
    jobs += [Job(arch, source=source) for source in sources for arch in archs]
    cache = ResultCache(None if args.no_cache else args.cache)
    results, cached = run_jobs(jobs, args.workers, cache, lambda line: print(line, flush=True))
    rows = triton_rows(launches, archs, results)
    for source in sources:
        for arch in archs:
            compiled = results[Job(arch, source=source).key()]
            rows += [finish(row) for row in cuda_rows(source, arch, compiled)]
    suffix = "_quick" if args.quick else ""
    if args.op:
        rows = merged_rows(RESULTS / f"kernel_report{suffix}.csv", args.op, rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"kernel_report{suffix}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in FIELDS} for r in rows)
    version = re.search(r"release [\d.]+", nvcc_version())
    mode = "--quick" if args.quick else "full run"
    if args.op:
        mode += f"; rows of {args.op} from a `--op {args.op}` run, the others from the last run"
    header = HEADER.format(
        mode=mode,
        triton=triton.__version__,
        nvcc=f"nvcc {version.group(0)}" if version else "nvcc",
        arch=" / ".join(f"sm_{a}" for a in archs),
        compiled=len(results),
        cached=cached,
        workers=args.workers,
        seconds=time.time() - start,
    )
    (RESULTS / f"kernel_report{suffix}.md").write_text(markdown(rows, header))
    print(f"{len(rows)} rows in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

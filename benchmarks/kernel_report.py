"""Static kernel report: every Triton and CUDA kernel compiled for sm_90 (and sm_80) on this
machine, no GPU needed, with what the compiled code asks of the GPU.

Triton kernels are compiled (``fusedops/kernels/triton/_static.py``) at the launch options their
launchers pick for the shapes that matter (Swin-T stages, LLM LayerNorm rows, NMS, Adam over a
1.1B-parameter list, QuickGELU, bias_dropout_add); the CUDA sources are compiled with nvcc, one
row per template instantiation. Per row: registers, spill bytes, local memory, shared memory,
CTAs per SM by the occupancy rules (``occupancy``), tensor-core instructions and the widest
global load/store in the SASS, the bytes the op must move for the shape, and the achieved
fraction of copy bandwidth where an H100 run measured the op (benchmarks/results/*.csv).

``python benchmarks/kernel_report.py`` writes ``results/kernel_report.csv`` and
``results/kernel_report.md``; ``--quick``: sm_90, fp32 and bf16 only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import math
import multiprocessing
import os
import re
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


def parse_ptxas(text: str) -> dict:
    """Per entry function of ``ptxas -v`` output: registers, stack (bytes), spill_stores,
    spill_loads, smem (static bytes)."""
    out = {}
    for section in text.split("Compiling entry function '")[1:]:
        name = section.split("'", 1)[0]

        def number(pattern: str, section: str = section) -> int:
            found = re.search(pattern, section)
            return int(found.group(1)) if found else 0

        out[name] = {
            "registers": number(r"Used (\d+) registers"),
            "stack": number(r"(\d+) bytes stack frame"),
            "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"),
            "smem": number(r"(\d+) bytes smem"),
        }
    return out


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

    def signature(self) -> dict:
        """Triton signature: ``_static.signature_of`` with the per-argument ``types``."""
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
    """Compile ``launch`` for ``arch`` (as ``_static.compile_static`` does, keeping the cubin):
    shared bytes, ptxas registers and spills, cuobjdump's stack/local and SASS facts."""
    from triton.backends.compiler import GPUTarget

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
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    name = compiled.metadata.name
    registers, stores, loads = _static._ptxas_resources(compiled.asm["ptx"], arch, name)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        facts = cubin_functions(cubin)[name]
    return {
        "registers": registers,
        "spill_bytes": stores + loads,
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


def swin_launches(dtype: torch.dtype) -> list[Launch]:
    """Window attention, Swin softmax and window partition/reverse at the Swin-T stages."""
    from fusedops.kernels.triton import swin_softmax, window_attention, window_process

    es, n, d = _size(dtype), SWIN_WINDOW**2, SWIN_HEAD_DIM
    rows = []
    options = window_attention.launch_options(n, d, dtype)
    # q, k, v strides (views of Swin's qkv) and out's: multiples of d = 32
    kernels = (window_attention._forward_kernel, window_attention._backward_kernel)
    strides = tuple(a for k in kernels for a in k.arg_names if re.fullmatch(r"s[a-z]{2}", a))
    for stage, side, channels, heads in SWIN_T:
        n_w = (side // SWIN_WINDOW) ** 2  # windows per image
        z = SWIN_BATCH * n_w
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
        for name, opts in options.items():
            constexprs = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages")}
            constexprs.update(HAS_BIAS=True, HAS_MASK=masked)
            if name == "_backward_kernel":
                constexprs["BIAS_GRAD"] = True
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
                    },
                    ideal=ideal[name],
                    divisible=strides,
                )  # fmt: skip
            )
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
                dict(BLOCK_R=block_r, BLOCK_N=block_n),
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
            rows.append(Launch("layer_norm", ln._forward_rows_kernel, dtype, shape,
                               dict(flags, BLOCK_M=block_m, BLOCK_N=block_n), warps,
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
            block_n4 = max(1, min(bda.MAX_BLOCK_N, triton.next_power_of_2(h)) // 4)
            block_m = max(1, min(bda.TILE_ELEMENTS // (4 * block_n4), triton.next_power_of_2(m)))
            constexprs = dict(
                HAS_BIAS=not reduce, HAS_RESIDUAL=not reduce, REDUCE=reduce,
                MODE=philox.dropout_mode(p, True), GROUPED=h % 4 == 0,
                BLOCK_M=block_m, BLOCK_N4=block_n4,
            )  # fmt: skip
            ideal = (4 * m * h * es + h * es) if not reduce else (2 * m * h * es + h * es)
            rows.append(Launch("bias_dropout_add", bda._kernel, dtype, shape, constexprs,
                               types=types, ideal=ideal, divisible=("M", "H")))  # fmt: skip
    return rows


def adam_launches(dtype: torch.dtype) -> list[Launch]:
    """AdamW over a 1.1B-parameter list (TinyLlama-1.1B: 1,100,048,384): fp32 params and
    state; 16-bit params with fp32 master weights and fp32 state."""
    from fusedops.kernels.triton import adam

    numel = 1_100_048_384
    master = dtype != torch.float32
    constexprs = dict(
        PARAM_DTYPE=_TL[dtype], STATE_DTYPE=tl.float32, AMSGRAD=False, MAXIMIZE=False,
        DECOUPLED=True, HAS_WEIGHT_DECAY=True, HAS_MASTER=master, LR_ON_DEVICE=False,
        HAS_GRAD_SCALE=False, HAS_FOUND_INF=False, CHUNK=adam.CHUNK, BLOCK=adam.BLOCK,
        ALIGNED=True, EMULATE_RTNE=False,
    )  # fmt: skip
    types = {n: "fp32" for n in ("lr", "beta1", "beta2", "eps", "weight_decay")}
    types.update(table_ptr="*i64", lr_ptr="*fp32", grad_scale_ptr="*fp32", found_inf_ptr="*fp32")
    es = _size(dtype)
    # read grad, param (or master), m, v; write them back (+ the 16-bit param with a master)
    ideal = numel * (es + 4 * 4 + (8 + es if master else 2 * es))
    shape = f"{numel} params, {triton.cdiv(numel, adam.CHUNK)} chunks"
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
        rows.append(Launch("nms", nms._walk_kernel, dtype, shape,
                           dict(BATCHED=False, COLUMNS=nms.WALK_COLUMNS), types=types))  # fmt: skip
        block = min(nms.SOFT_BLOCK, triton.next_power_of_2(n))
        rows.append(Launch("soft_nms", nms._soft_nms_kernel, dtype, shape,
                           dict(METHOD=2, BLOCK=block), types=types, options=exact,
                           ideal=n * (4 * _size(dtype) + 4 + 8 + 4)))  # fmt: skip
    return rows


def triton_launches(dtypes) -> list[Launch]:
    """Every Triton launch of the report for ``dtypes``."""
    builders = (swin_launches, layer_norm_launches, elementwise_launches, adam_launches)
    rows = [launch for dtype in dtypes for build in builders for launch in build(dtype)]
    return rows + nms_launches(torch.float32)


# ------------------------------------------------------------------------------------------
# CUDA kernels.

#: Threads per block of each CUDA kernel, from the launchers in the .cu files (<<<..., N>>>);
#: dynamic shared memory (nms walk/soft: per box count) is left out of the occupancy.
CUDA_THREADS = {
    "adam": {"": 512},
    "bias_dropout_add": {"": 256},
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


def _cuda_dtype(demangled: str) -> str:
    """The first element type named in a kernel's template arguments."""
    args = demangled.split("<", 1)[1] if "<" in demangled else ""
    found = [(args.find(t), name) for t, name in _CUDA_DTYPES if t in args]
    return min(found)[1] if found else "-"


def compile_cuda(source: Path, arch: int) -> list[dict]:
    """Compile ``source`` with nvcc for ``arch``: one row per kernel instantiation."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        command = ["nvcc", "-cubin", f"-arch=sm_{arch}", *NVCC_FLAGS, "-Xptxas", "-v"]
        command += [f"-I{CUDA_DIR}", str(source), "-o", str(cubin)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        ptxas = parse_ptxas(done.stdout + done.stderr)
        functions = cubin_functions(cubin)
    names = demangle(sorted(functions))
    op, rows = source.stem, []
    for mangled, facts in sorted(functions.items()):
        pretty = names[mangled]
        base = pretty.split("<", 1)[0].split("(", 1)[0].rsplit("::", 1)[-1]
        threads = CUDA_THREADS[op].get(base, CUDA_THREADS[op].get(""))
        resources = ptxas.get(mangled, {})
        rows.append({
            "op": op, "kernel": pretty.split("(", 1)[0].replace(_ANONYMOUS, ""),
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


#: The launches being compiled: forked workers inherit them (kernels do not pickle).
_LAUNCHES: list = []


def _compile_one(index: int, arch: int) -> dict:
    return compile_triton(_LAUNCHES[index], arch)


def triton_rows(launches: list[Launch], archs, workers: int, progress=print) -> list[dict]:
    """Compile every distinct (launch, arch) once (``workers`` processes) and give one row per
    launch and arch."""
    todo = {}
    for index, launch in enumerate(launches):
        for arch in archs:
            todo.setdefault(launch.key(arch), (index, arch))
    compiled = {}
    _LAUNCHES[:] = launches
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_compile_one, *item): key for key, item in todo.items()}
        for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
            compiled[futures[future]] = future.result()
            progress(f"[{i}/{len(todo)}] {futures[future][0]} sm_{futures[future][-1]}")
    times = measured_times()
    rows = []
    for launch in launches:
        for arch in archs:
            facts = compiled[launch.key(arch)]
            achieved = ""
            dtype = _NAME[launch.dtype]
            if launch.measured and (hit := times.get((*launch.measured, "triton", dtype))):
                ms, bandwidth = hit
                achieved = f"{launch.ideal / (ms * 1e-3) / bandwidth:.3f}"
            rows.append(finish({
                "op": launch.op, "kernel": launch.kernel.fn.__name__, "backend": "triton",
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


def markdown(rows: list[dict], header: str = "") -> str:
    """The report as markdown: ``header``, the per-family predictions and one table row per
    kernel launch (``FIELDS`` columns)."""
    lines = [header, "## What the report predicts", "", *predictions(rows), "", "## Kernels", ""]
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
deform_conv2d: the package has no such kernel, so no rows.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sm_90, fp32 and bf16 only")
    parser.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = parser.parse_args()
    start = time.time()
    archs = (90,) if args.quick else (90, 80)
    dtypes = [torch.float32, torch.bfloat16]
    if not args.quick:
        dtypes.insert(1, torch.float16)
    rows = triton_rows(triton_launches(dtypes), archs, args.workers)
    for source in sorted(CUDA_DIR.glob("*.cu")):
        for arch in archs:
            rows += [finish(r) for r in compile_cuda(source, arch)]
            print(f"{source.name} sm_{arch}", flush=True)
    suffix = "_quick" if args.quick else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"kernel_report{suffix}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in FIELDS} for r in rows)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    version = re.search(r"release [\d.]+", nvcc)
    header = HEADER.format(
        mode="--quick" if args.quick else "full run",
        triton=triton.__version__,
        nvcc=f"nvcc {version.group(0)}" if version else "nvcc",
        arch=" / ".join(f"sm_{a}" for a in archs),
    )
    (RESULTS / f"kernel_report{suffix}.md").write_text(markdown(rows, header))
    print(f"{len(rows)} rows in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

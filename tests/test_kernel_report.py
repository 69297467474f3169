"""benchmarks/kernel_report.py: occupancy rules, parsing of compiled kernels (a tiny CUDA
kernel through nvcc, a tiny Triton kernel through _static) and the markdown writer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from fusedops.testing import run_python

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_report  # noqa: E402


@pytest.mark.parametrize(
    "threads, registers, shared, arch, expected",
    [
        # 128 threads x 64 regs: 2048 regs/warp -> 32 warps -> 8 CTAs (threads allow 16)
        (128, 64, 0, 90, (8, "regs")),
        # 256 threads x 32 regs: 1024 regs/warp -> 64 warps -> 8 CTAs = 2048 threads: regs first
        (256, 32, 0, 90, (8, "regs")),
        # 33 regs round up to 40 per thread (1280 per warp): 51 warps -> 6 CTAs of 8 warps
        (256, 33, 0, 90, (6, "regs")),
        # 100 KB + 1 KB reserved per block: 228 KB / 101 KB -> 2 (sm_80: 164 / 101 -> 1)
        (128, 32, 100 * 1024, 90, (2, "smem")),
        (128, 32, 100 * 1024, 80, (1, "smem")),
        # 32 threads x 16 regs: 32 blocks/SM first (threads would allow 64, regs 128)
        (32, 16, 0, 90, (32, "blocks")),
        # 1024 threads x 32 regs: 2 CTAs by threads (and by regs: 64 warps / 32)
        (1024, 16, 0, 90, (2, "threads")),
    ],
)
def test_occupancy_by_hand(threads, registers, shared, arch, expected):
    assert kernel_report.occupancy(threads, registers, shared, arch) == expected


def test_occupancy_refuses_bad_arguments():
    with pytest.raises(ValueError, match="arch"):
        kernel_report.occupancy(128, 32, 0, 75)
    with pytest.raises(ValueError, match="threads"):
        kernel_report.occupancy(0, 32, 0, 90)


def test_sass_facts_widths_and_mma():
    sass = """
        /*0010*/  LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0020*/  LDG.E.U16 R8, desc[UR4][R6.64] ;
        /*0030*/  HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0040*/  HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0050*/  STG.E.64 desc[UR4][R2.64], R12 ;
    """
    assert kernel_report.sass_facts(sass) == {"mma": 2, "ldg_bits": 128, "stg_bits": 64}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_kernel_parses(tmp_path):
    source = tmp_path / "tiny.cu"
    source.write_text(
        """
#include <cuda_fp16.h>
template <typename T>
__global__ void tiny(const float4* __restrict__ a, float4* __restrict__ b, int n) {
  __shared__ float stage[128];
  float local[64];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int j = 0; j < 64; ++j) {
    const float4 v = a[(i + j * n) % n];
    local[j] = v.x + v.y + v.z + v.w;
  }
  stage[threadIdx.x % 128] = local[i % 64];
  __syncthreads();
  if (i < n) b[i] = make_float4(stage[(threadIdx.x + 1) % 128], 0.f, 0.f, 0.f);
}
template __global__ void tiny<__half>(const float4*, float4*, int);
template __global__ void tiny<float>(const float4*, float4*, int);
"""
    )
    cubin = tmp_path / "tiny.cubin"
    command = ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", str(source)]
    done = subprocess.run(command + ["-o", str(cubin)], capture_output=True, text=True, check=True)
    ptxas = kernel_report.parse_ptxas(done.stdout + done.stderr)
    functions = kernel_report.cubin_functions(cubin)
    assert set(ptxas) == set(functions) and len(functions) == 2
    names = kernel_report.demangle(sorted(functions))
    dtypes = sorted(kernel_report._cuda_dtype(names[n]) for n in functions)
    assert dtypes == ["fp16", "fp32"]
    for name, facts in functions.items():
        assert facts["REG"] == ptxas[name]["registers"] > 0
        # ptxas: the kernel's 512 B; cuobjdump's SHARED adds what the arch reserves (1 KB)
        assert ptxas[name]["smem"] == 512 and facts["SHARED"] >= 512
        # the indexed local array lives in local memory: a 256 B stack frame
        assert facts["STACK"] == ptxas[name]["stack"] >= 256
        assert facts["ldg_bits"] == 128 and facts["stg_bits"] == 128
        assert facts["mma"] == 0


@pytest.mark.parametrize(
    "demangled, name, dtype",
    [
        (
            "void fusedops::(anonymous namespace)::nms_mask_kernel<float, true>(float const*, "
            "long const*, long const*, unsigned long*, long, long, float, float)",
            "nms_mask_kernel<float, true>",
            "fp32",
        ),
        (
            "void fusedops::(anonymous namespace)::columns_kernel<__nv_bfloat16, "
            "fusedops::(anonymous namespace)::FastDivider>(__nv_bfloat16 const*, "
            "fusedops::(anonymous namespace)::Sizes<fusedops::(anonymous namespace)::"
            "FastDivider>)",
            "columns_kernel<__nv_bfloat16, FastDivider>",
            "bf16",
        ),
        ("void tiny<__half>(float4 const*, float4*, int)", "tiny<__half>", "fp16"),
        ("fusedops::plain_kernel(int)", "plain_kernel", "-"),
    ],
)
def test_cuda_kernel_names(demangled, name, dtype):
    assert kernel_report.cuda_kernel_name(demangled) == name
    assert kernel_report._cuda_dtype(demangled) == dtype


@triton.jit
def _tiny_dot(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    tile = rows[:, None] * BLOCK + rows[None, :]
    a = tl.load(a_ptr + tile)
    b = tl.load(b_ptr + tile)
    tl.store(c_ptr + tile, tl.dot(a, b).to(c_ptr.dtype.element_ty), mask=tile < n)


def _compile_tiny_dot(arch: int) -> dict:
    """kernel_report.compile_triton on _tiny_dot in a fresh interpreter with Triton's
    interpreter off (this process runs it: nothing can be compiled here)."""
    code = (
        "import json, sys, torch\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "import kernel_report\n"
        "from tests.test_kernel_report import _tiny_dot\n"
        "launch = kernel_report.Launch('tiny', _tiny_dot, torch.float16, '(32, 32)',"
        " {'BLOCK': 32}, divisible=('n',))\n"
        f"print(json.dumps(kernel_report.compile_triton(launch, {arch})))\n"
    )
    done = run_python("-c", code, cwd=ROOT, env={"TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [90, 80])
def test_triton_kernel_parses(arch):
    facts = _compile_tiny_dot(arch)
    assert facts["registers"] > 0 and facts["spill_bytes"] == 0 and facts["local"] == 0
    assert facts["threads"] == 128
    assert facts["mma"] > 0  # fp16 tl.dot: HMMA (sm_80) / HGMMA or HMMA (sm_90)
    assert facts["ldg_bits"] == 128 and facts["stg_bits"] >= 64


def test_markdown_writer():
    rows = [
        kernel_report.finish(
            {
                "op": "tiny",
                "kernel": "k",
                "backend": "triton",
                "arch": 90,
                "dtype": "fp32",
                "shape": "(8,)",
                "threads": 128,
                "registers": 64,
                "spill_bytes": 8,
                "local": 16,
                "shared": 0,
                "mma": 0,
                "ldg_bits": 128,
                "stg_bits": 32,
                "ideal_bytes": 64,
                "achieved": "",
            }
        )  # fmt: skip
    ]
    assert rows[0]["ctas_per_sm"] == 8 and rows[0]["limit"] == "regs"
    text = kernel_report.markdown(rows, "# header\n")
    lines = text.splitlines()
    assert lines[0] == "# header"
    assert "- **tiny triton fp32** (1 rows): no tensor-core instructions; spills up to 8 B" in text
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| " + " | ".join(kernel_report.FIELDS) + " |"
    assert len(table) == 3  # header, rule, one row
    assert table[2].split(" | ")[kernel_report.FIELDS.index("ctas_per_sm")] == "8"


def _row(**fields) -> dict:
    """A clean report row (no spills, 16-byte accesses, tensor cores) with ``fields`` changed."""
    row = dict(
        op="layer_norm", kernel="k", backend="triton", arch=90, dtype="bf16", shape="s",
        threads=128, registers=32, spill_bytes=0, local=0, shared=0, mma=0, ldg_bits=128,
        stg_bits=128, ideal_bytes="", achieved="",
    )  # fmt: skip
    return kernel_report.finish({**row, **fields})


def test_findings_list_what_breaks_the_rules():
    clean = [
        _row(),
        _row(op="window_attention", mma=8),
        _row(op="nms", ldg_bits=32),  # not bandwidth-bound
        _row(dtype="fp32", ldg_bits=32),  # 4-byte accesses are the rule for 16-bit rows only
        _row(op="window_attention", backend="cuda"),  # its products are cuBLAS calls
        # a reduction's stores are a few values a row: its loads decide
        _row(kernel="row_coeffs_kernel<__half, float, 8>", backend="cuda", stg_bits=32),
        _row(kernel="_column_sum_kernel", stg_bits=16),
    ]
    text = "\n".join(kernel_report.findings(clean))
    assert text.count("- none") == 4
    cuda = {"backend": "cuda", "op": "quick_gelu"}
    broken = clean + [
        _row(kernel="spilling", spill_bytes=24, local=24, arch=80),
        _row(kernel="spilling", local=16, arch=80, shape="t"),
        _row(op="deform_conv2d", kernel="narrow", ldg_bits=16),
        _row(op="deform_conv2d", kernel="narrow", dtype="fp16", stg_bits=64),
        _row(op="window_attention", kernel="fma", dtype="fp32"),
        # a CUDA kernel with a 16-byte instantiation: its scalar one serves unaligned rows
        _row(**cuda, kernel="ew<__half, 8>", dtype="fp16"),
        _row(**cuda, kernel="ew<__half, 1>", dtype="fp16", ldg_bits=16, stg_bits=16),
        _row(**cuda, kernel="ew<__half, 1>", dtype="fp16", ldg_bits=16, arch=80),
        # ... but not for another dtype, nor another arch, nor other type arguments: findings
        _row(**cuda, kernel="ew<__nv_bfloat16, 1>", ldg_bits=16, stg_bits=16),
        _row(**cuda, kernel="ew<__half, float, 1>", dtype="fp16", ldg_bits=32, stg_bits=32),
        # a reduction with narrow loads stays a finding
        _row(kernel="_column_sum_kernel", ldg_bits=32, stg_bits=16),
    ]
    text = "\n".join(kernel_report.findings(broken))
    assert "- none" not in text
    assert "- quick_gelu cuda `ew<__half>` fp16: 1 at sm_80" not in text  # sm_80 has none
    assert "- quick_gelu cuda `ew<__half>` fp16: 1 at sm_90" in text
    assert "- quick_gelu cuda `ew<__half, 1>` fp16 sm_80 (1 rows): widest load 16 bits" in text
    assert "- quick_gelu cuda `ew<__nv_bfloat16, 1>` bf16 sm_90 (1 rows)" in text
    assert "- quick_gelu cuda `ew<__half, float, 1>` fp16 sm_90 (1 rows)" in text
    assert (
        "- layer_norm triton `spilling` bf16 sm_80 (2 rows): spill bytes up to 24, "
        "local memory up to 24 B per thread" in text
    )
    assert "- deform_conv2d triton `narrow` bf16 sm_90 (1 rows): widest load 16 bits" in text
    assert (
        "- deform_conv2d triton `narrow` fp16 sm_90 (1 rows): widest load 128 bits, store 64"
        in text
    )
    assert "- window_attention triton `fma` fp32 sm_90 (1 rows): ctas/SM [16], no mma" in text
    assert "- layer_norm triton `_column_sum_kernel` bf16 sm_90 (1 rows): widest load 32" in text
    assert text.count("\n- ") == 9  # one line per group


class _CountingJob(kernel_report.Job):
    """A job that compiles nothing: its result names its arch and the process that ran it."""

    def key(self) -> str:
        return f"counting-{self.arch}"

    def label(self) -> str:
        return f"counting sm_{self.arch}"

    def run(self):
        return {"arch": self.arch, "pid": os.getpid()}


def test_run_jobs_dedupes_and_caches(tmp_path):
    cache = kernel_report.ResultCache(tmp_path / "cache")
    jobs = [_CountingJob(90), _CountingJob(90), _CountingJob(80)]
    results, cached = kernel_report.run_jobs(jobs, 2, cache, progress=lambda line: None)
    assert cached == 0 and sorted(results) == ["counting-80", "counting-90"]
    assert {r["arch"] for r in results.values()} == {80, 90}
    assert all(r["pid"] != os.getpid() for r in results.values())  # run by the workers
    assert set(cache.durations()) == {"counting sm_90", "counting sm_80"}
    again, cached = kernel_report.run_jobs(jobs, 2, cache, progress=lambda line: None)
    assert cached == 2 and again == results  # nothing compiled: the same pids
    fresh, cached = kernel_report.run_jobs(
        jobs, 1, kernel_report.ResultCache(None), progress=lambda line: None
    )
    assert cached == 0 and sorted(fresh) == sorted(results)


def test_cuda_job_key_follows_the_sources(tmp_path):
    source, header = tmp_path / "op.cu", tmp_path / "device.cuh"
    source.write_text("__global__ void k() {}\n")
    header.write_text("// a header\n")
    key = kernel_report.Job(90, source=source).key()
    assert kernel_report.Job(90, source=source).key() == key
    assert kernel_report.Job(80, source=source).key() != key
    header.write_text("// a header, changed\n")
    changed = kernel_report.Job(90, source=source).key()
    assert changed != key
    source.write_text("__global__ void k() { }\n")
    assert kernel_report.Job(90, source=source).key() not in (key, changed)


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, stride, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets * stride, mask=offsets < n)
    tl.store(y_ptr + offsets, x * scale, mask=offsets < n)


def _launcher(module, x, y, n, stride):
    module._scaled_copy[(1,)](x, y, n, stride, 0.5, BLOCK=128, num_warps=2)


_LAUNCH_FACTS = """
import json, sys, torch
sys.path.insert(0, 'benchmarks')
import kernel_report
from fusedops.kernels.triton import _static, deform_conv2d
from tests import test_kernel_report as here

def facts(launch):
    constexprs = {k: str(v) for k, v in launch.constexprs.items()}
    return dict(name=launch.name(), kernel=launch.kernel.fn.__name__, shape=launch.shape,
                constexprs=constexprs, types=launch.types, divisible=list(launch.divisible),
                warps=launch.num_warps, ideal=launch.ideal)

meta = torch.empty(0, dtype=torch.float16, device='meta')
calls = kernel_report.recorded_calls(
    here, lambda: here._launcher(here, meta, meta.float(), 2**31 + 16, 1))
calls += kernel_report.recorded_calls(here, lambda: here._launcher(here, meta, meta, 96, 3))
tiny = [kernel_report.launch_of('tiny', c, torch.float16, 's') for c in calls]
dcn = [l for l in kernel_report.triton_launches([torch.float32]) if l.op == 'deform_conv2d']
print(json.dumps(dict(
    tiny=[facts(l) for l in tiny], restored=type(here._scaled_copy).__name__,
    kernels=sorted(_static._jit_functions(deform_conv2d)), dcn=[facts(l) for l in dcn],
)))
"""


@pytest.fixture(scope="module")
def launch_facts() -> dict:
    """Launches recorded from launchers in a fresh interpreter with Triton's interpreter off
    (recording needs compiled-kernel objects; nothing is compiled or launched)."""
    done = run_python("-c", _LAUNCH_FACTS, cwd=ROOT, env={"TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_recorded_launch_is_specialised_as_triton_does(launch_facts):
    wide, narrow = launch_facts["tiny"]
    assert launch_facts["restored"] == "JITFunction"  # the recorder put the kernel back
    assert wide["types"] == {"x_ptr": "*fp16", "y_ptr": "*fp32", "n": "i64", "scale": "fp32"}
    assert wide["constexprs"] == {"stride": "1", "BLOCK": "128"}  # an int equal to 1
    assert wide["divisible"] == ["n"] and wide["warps"] == 2
    assert narrow["types"]["n"] == narrow["types"]["stride"] == "i32"
    assert narrow["divisible"] == ["n"] and narrow["constexprs"] == {"BLOCK": "128"}


def test_deform_conv2d_kernels_are_in_the_report(launch_facts):
    """Every deform_conv2d Triton kernel at every bench_dcn layer shape, both backward modes,
    DCNv2 and DCNv1 (no mask), as its launchers call it (no compile); the CUDA source is
    compiled with the others."""
    from bench_dcn import SHAPES

    dcn = launch_facts["dcn"]
    kernels = {name for name in launch_facts["kernels"] if name.endswith("_kernel")}
    assert {launch["kernel"] for launch in dcn} == kernels
    names = [
        "_columns_kernel",
        "_sample_grads_kernel (atomic)",
        "_sample_grads_kernel (deterministic)",
        "_segment_gather_kernel",
    ]
    assert [launch["name"] for launch in dcn] == names * 2 * len(SHAPES)
    for name, batch, cin, cout, h, w, _ in SHAPES:
        layer = [launch for launch in dcn if launch["shape"].startswith(f"{name} ")]
        assert len(layer) == 8
        for rows, has_mask in ((layer[:4], "True"), (layer[4:], "False")):
            assert f"({batch}, {cin}, {h}, {w}) -> {cout}" in rows[0]["shape"]
            assert rows[0]["shape"].endswith("DCNv1") == (has_mask == "False")
            sample_grads = rows[1:3]
            assert [r["constexprs"]["ATOMIC"] for r in sample_grads] == ["True", "False"]
            assert sample_grads[0]["types"]["grad_input_ptr"] == "*fp32"  # the fp32 accumulator
            assert sample_grads[1]["types"]["keys_ptr"] == "*i64"
            assert all(r["constexprs"]["HAS_MASK"] == has_mask for r in rows[:3])
            assert all(r["ideal"] > batch * cin * h * w * 4 for r in rows)
        assert all(v1["ideal"] < v2["ideal"] for v1, v2 in zip(layer[4:], layer[:3]))
    assert "deform_conv2d" in kernel_report.CUDA_THREADS
    assert (kernel_report.CUDA_DIR / "deform_conv2d.cu").exists()

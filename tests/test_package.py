"""Package-level promises: import cost, the CLI, the demo, the CUDA sources."""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fusedops.kernels.cuda import build
from fusedops.testing import cuda_include_dir, run_python

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict | None = None):
    return run_python(*args, cwd=REPO, env=env)


def test_import_does_not_import_triton_jax_or_initialise_cuda():
    code = (
        "import sys, fusedops\n"
        "assert 'torch' not in sys.modules, 'import fusedops imported torch'\n"
        "import torch, fusedops.nn, fusedops.hooks, fusedops.testing\n"
        "fusedops.quick_gelu, fusedops.use_backend\n"
        "bad = [m for m in ('triton', 'jax') if m in sys.modules]\n"
        "assert not bad, bad\n"
        # Running a custom op makes torch import torch._dynamo (which imports triton itself);
        # fusedops' own Triton kernels must still not load for a CPU call.
        "fusedops.quick_gelu(torch.ones(3))\n"
        "assert 'fusedops.kernels.triton.quick_gelu' not in sys.modules\n"
        "assert 'jax' not in sys.modules\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    done = _run("-c", code, env={"TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_info_prints_the_availability_table():
    done = _run("-m", "fusedops", "info")
    assert done.returncode == 0, done.stderr
    assert "quick_gelu" in done.stdout and "native" in done.stdout
    # each kernel's GPU-verification state: the Triton QuickGELU passed on an H100 at its sources
    assert "verified (NVIDIA H100 80GB HBM3, 2026-11-22)" in done.stdout
    assert "unverified" in done.stdout
    assert "torch " in done.stdout


def test_demo_prints_the_table():
    done = _run("-m", "fusedops", "demo", "--steps", "2", "--batch", "4")
    assert done.returncode == 0, done.stderr
    for needle in ("plain PyTorch", "fusedops hooks", "partial_trace(xla)", "final loss"):
        assert needle in done.stdout
    # the hooks configuration really ran the fused classes and recorded each op's backend
    needles = ("FusedAdamW", "fusedops.nn.layer_norm.LayerNorm", "quick_gelu", "ran on")
    for needle in (*needles, "bias_dropout_add"):
        assert needle in done.stdout
    # the Swin stage: transformers' Swin trained with the swin hook, its fused ops recorded
    # (the attention as window_attention: no weights asked for, window 4, head dim 16)
    assert "fusedops swin hook" in done.stdout and "swin_attention_softmax   ran on" in done.stdout
    for op in ("window_partition_roll", "window_reverse_roll", "window_attention"):
        assert re.search(rf"{op} +ran on (native|reference|triton|cuda)", done.stdout), op


@pytest.mark.gpu
def test_cuda_extension_builds_and_registers_the_kernels_ops():
    """gpu-only: the CUDA extension builds (nvcc, a CUDA device) and registers its ops in
    ``torch.ops.fusedops_cuda``, which is what this checks."""
    import torch

    assert build.unavailable_reason() is None
    for name in (
        "quick_gelu_forward",
        "window_attention_softmax_forward",
        "window_attention_softmax_backward",
        "deform_conv2d_columns",  # registered from its own binding file (a library fragment)
    ):
        assert hasattr(torch.ops.fusedops_cuda, name), name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", build.kernel_sources(), ids=lambda p: p.name)
def test_cuda_source_compiles_for_sm80_and_sm90(source, tmp_path):
    command = ["nvcc", "-c", *build.NVCC_FLAGS, str(source), "-o", str(tmp_path / "k.o")]
    for arch in ("80", "90"):
        command += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(
    shutil.which("g++") is None or cuda_include_dir() is None, reason="needs g++ and CUDA headers"
)
@pytest.mark.parametrize("source", build.binding_sources(), ids=lambda p: p.name)
def test_bindings_compile_against_torch_headers(source):
    """bindings.cpp and each op's own <op>_bindings.cpp type-check against torch's headers
    (syntax only; they link on a GPU box)."""
    import torch.utils.cpp_extension as cpp_extension

    with tempfile.TemporaryDirectory() as stub:
        # CPU wheels lack this generated header of c10/cuda; its content is one define.
        macros = Path(stub) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        macros.parent.mkdir(parents=True)
        macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes = [stub, *cpp_extension.include_paths(), cuda_include_dir()]
        command = ["g++", "-fsyntax-only", "-std=c++20", "-w"]
        command += [f"-I{path}" for path in includes] + [str(source)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr

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
    # each kernel's GPU-verification state, as verified.json records it (the Triton QuickGELU
    # passed on a GPU at its sources; the GPU run rewrites the file, so no date is written here)
    from fusedops.kernels import verified

    entry = verified.recorded()["quick_gelu"]["triton"]
    assert f"verified ({entry['gpu']}, {entry['date']})" in done.stdout
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
    # every function each op's binding file defines, with the schema written there
    for source in build.binding_sources():
        for name, schema in _schemas(source.read_text()):
            registered = getattr(torch.ops.fusedops_cuda, name).default._schema
            assert str(registered) == str(torch._C.parse_schema(f"fusedops_cuda::{schema}"))


def _schemas(text: str) -> list[tuple[str, str]]:
    """(name, schema) of each ``m.def("...")`` in a C++ binding's text (adjacent string
    literals joined)."""
    found = []
    for call in re.finditer(r'm\.def\(\s*((?:"[^"]*"\s*)+)', text):
        schema = "".join(re.findall(r'"([^"]*)"', call.group(1)))
        found.append((schema.split("(", 1)[0], schema))
    return found


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", build.kernel_sources(), ids=lambda p: p.name)
def test_cuda_source_compiles_for_sm80_and_sm90(source, tmp_path):
    command = ["nvcc", "-c", *build.NVCC_FLAGS, str(source), "-o", str(tmp_path / "k.o")]
    # both targets at once, a thread a CPU (layer_norm.cu: 109 -> 54 s on 2 cores)
    command += ["--threads", "0"]
    for arch in ("80", "90"):
        command += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(
    shutil.which("g++") is None or cuda_include_dir() is None, reason="needs g++ and CUDA headers"
)
@pytest.mark.parametrize("source", build.binding_sources(), ids=lambda p: p.name)
def test_bindings_compile_against_torch_headers(source):
    """library.cpp and each op's <op>_bindings.cpp type-check against torch's headers
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


def _extension_layout_problems(files: dict[str, str]) -> list[str]:
    """What breaks the CUDA extension's per-op layout in ``files`` (file name -> text of the
    folder's C++/CUDA sources): each ``<op>.cu`` with its binding ``<op>_bindings.cpp`` and,
    where it has one, its launchers' ``<op>.h`` included by both (without one, the binding
    declares the launchers it calls); a library fragment including no other op's header; torch
    only in the bindings; one TORCH_LIBRARY (library.cpp, defining nothing); each function
    defined once and implemented in the file that defines it."""
    problems = []
    ops = {name.removesuffix(".cu") for name in files if name.endswith(".cu")}
    bound = {name.removesuffix("_bindings.cpp") for name in files if name.endswith("_bindings.cpp")}
    headers = {name.removesuffix(".h") for name in files if name.endswith(".h")}
    problems += [f"{op}.cu has no {op}_bindings.cpp" for op in sorted(ops - bound)]
    problems += [f"{op}_bindings.cpp has no {op}.cu" for op in sorted(bound - ops)]
    defined: dict[str, str] = {}
    for name, text in sorted(files.items()):
        includes = set(re.findall(r'#include "(\w+)\.h"', text))
        torch_includes = re.findall(r"#include <(?:torch|ATen|c10)/", text)
        if torch_includes and not (
            name.endswith("_bindings.cpp") or name in ("bindings.h", "library.cpp")
        ):
            problems.append(f"{name} includes torch headers")
        if "TORCH_LIBRARY(" in text and name != "library.cpp":
            problems.append(f"{name} claims the namespace (TORCH_LIBRARY)")
        op = name.removesuffix(".cu").removesuffix("_bindings.cpp")
        problems += [
            f"{name} includes {missing}.h, which is missing"
            for missing in sorted(includes & ops - headers)
        ]
        if op in ops and op in headers and name != f"{op}.h":
            if op not in includes:
                problems.append(f"{name} does not include {op}.h")
            problems += [f"{name} includes {other}.h" for other in sorted(includes & ops - {op})]
        schemas = [function for function, _ in _schemas(text)]
        if schemas and not name.endswith("_bindings.cpp"):
            problems.append(f"{name} defines {schemas}")
        for function in schemas:
            if function in defined:
                problems.append(f"{function} defined in {defined[function]} and {name}")
            defined.setdefault(function, name)
        impls = set(re.findall(r'm\.impl\("(\w+)"', text)) - set(schemas)
        problems += [f"{name} implements {function}, defined elsewhere" for function in impls]
    if "TORCH_LIBRARY(" not in files.get("library.cpp", ""):
        problems.append("library.cpp does not claim the namespace")
    return problems


def test_cuda_extension_is_one_set_of_files_per_op():
    """Each op's CUDA kernel, launcher header and binding are its own files (no file lists every
    op: build.py finds the bindings by glob); the check finds planted mistakes."""
    suffixes = (".cu", ".h", ".cuh", ".cpp")
    files = {p.name: p.read_text() for p in build.SOURCE_DIR.iterdir() if p.suffix in suffixes}
    assert _extension_layout_problems(files) == []
    assert {p.name for p in build.binding_sources()} == {
        "library.cpp",
        *(f"{p.stem}_bindings.cpp" for p in build.kernel_sources()),
    }
    fragment = files["quick_gelu_bindings.cpp"].split("}  // namespace")[1]
    planted = {  # file: (its broken text or None for a missing file, the problem to find)
        "quick_gelu_bindings.cpp": (None, "quick_gelu.cu has no quick_gelu_bindings.cpp"),
        "quick_gelu.h": (None, "quick_gelu.cu includes quick_gelu.h, which is missing"),
        "quick_gelu.cu": (
            files["quick_gelu.cu"].replace('#include "quick_gelu.h"', "#include <ATen/ATen.h>"),
            "quick_gelu.cu includes torch headers",
        ),
        "adam_bindings.cpp": (
            files["adam_bindings.cpp"] + '#include "quick_gelu.h"\n',
            "adam_bindings.cpp includes quick_gelu.h",
        ),
        "layer_norm_bindings.cpp": (
            files["layer_norm_bindings.cpp"] + fragment,
            "quick_gelu_forward defined in layer_norm_bindings.cpp and quick_gelu_bindings.cpp",
        ),
        "nms_bindings.cpp": (
            files["nms_bindings.cpp"].replace("TORCH_LIBRARY_FRAGMENT(", "TORCH_LIBRARY("),
            "nms_bindings.cpp claims the namespace",
        ),
        "library.cpp": (
            files["library.cpp"] + 'm.def("x(Tensor a) -> ()");\n',
            "library.cpp defines ['x']",
        ),
        "swin_softmax_bindings.cpp": (
            files["swin_softmax_bindings.cpp"].replace(
                'm.def("swin_softmax_forward(', 'm.def("swin_softmax_fwd('
            ),
            "swin_softmax_bindings.cpp implements swin_softmax_forward, defined elsewhere",
        ),
    }
    for name, (text, problem) in planted.items():
        broken = {k: v for k, v in files.items() if k != name}
        if text is not None:
            broken[name] = text
        assert any(problem in found for found in _extension_layout_problems(broken)), name


def test_demo_table_says_which_regions_ran_as_what(capsys):
    from fusedops import demo

    def row(config: str, regions: list[str]) -> dict:
        return {
            "config": config, "regions": regions, "step_ms": 1.0, "first_step_ms": 2.0,
            "peak_mb": 3.0, "memory_kind": "process peak RSS", "final_loss": 0.5,
            "backends": {}, "optimizer": "torch.optim.AdamW", "layer_norm_class": "LayerNorm",
        }  # fmt: skip

    demo._print_table([row("plain PyTorch", []), row("partial_trace(xla)", ["eager", "xla"])])
    assert "1 of its 2 regions ran as eager torch" in capsys.readouterr().out
    demo._print_table([row("plain PyTorch", []), row("partial_trace(xla)", ["xla"])])
    assert "forward and backward were XLA programs" in capsys.readouterr().out

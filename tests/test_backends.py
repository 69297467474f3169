"""Backends as registered objects: a backend added from outside fusedops/ (tests/float64_backend.py)
is forced, listed, refused with its reasons and gone after the undo; entry points; candidates;
the rule names no backend; registering imports neither triton, CUDA nor JAX."""

import ast
import importlib.metadata
import io
import re
import textwrap
from pathlib import Path

import pytest
import torch

import fusedops
from fusedops import dispatch
from fusedops.dispatch import registry
from fusedops.testing import assert_close, random_tensor, run_python
from tests.float64_backend import Float64

fusedops.ops.load_all()
CPU = torch.device("cpu")  # the float64 backend takes CPU tensors


@pytest.fixture
def float64():
    with dispatch.register_backend(Float64()) as backend:
        yield backend


def _info() -> str:
    out = io.StringIO()
    fusedops.info(file=out)
    return out.getvalue()


def test_a_registered_backend_runs_when_forced(float64):
    x = random_tensor((7, 33), torch.float32, CPU).requires_grad_()
    y = fusedops.quick_gelu(x, backend="float64")
    assert dispatch.last_used["quick_gelu"] == "float64"
    expected = fusedops.quick_gelu(x.detach().double(), backend="reference")
    assert_close(y, expected)
    (grad,) = torch.autograd.grad(y.sum(), x)
    wide = x.detach().double().requires_grad_()
    (expected_grad,) = torch.autograd.grad(
        fusedops.quick_gelu(wide, backend="reference").sum(), wide
    )
    assert_close(grad, expected_grad)
    with dispatch.use_backend("float64"):
        fusedops.quick_gelu(x.detach())
    assert dispatch.last_used["quick_gelu"] == "float64"


def test_a_registered_backend_is_refused_with_its_reasons(float64):
    x = random_tensor((4, 8), torch.float32, CPU)
    with pytest.raises(dispatch.BackendUnavailableError, match="no float64 implementation"):
        fusedops.layer_norm(x, (8,), backend="float64")
    with pytest.raises(ValueError, match="dtype torch.int64: the float64 backend takes floating"):
        dispatch.select_name("quick_gelu", torch.ones(3, dtype=torch.int64), backend="float64")
    # not verified on a GPU: the automatic pick skips it, and says so once
    with pytest.warns(RuntimeWarning, match="the float64 kernel has not passed"):
        assert dispatch.select_name("quick_gelu", x) == "native"
    found = dispatch.candidates("quick_gelu", x)
    assert found.usable == ("native",)
    assert "not verified on a GPU" in found.refused["float64"][0]
    assert "runs only when forced" in found.refused["reference"]
    assert (
        "no float64 implementation of layer_norm"
        in dispatch.candidates("layer_norm", x).refused["float64"][0]
    )


def test_an_unverified_backend_is_picked_with_fusedops_unverified(float64, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    x = random_tensor((5, 9), torch.float32, CPU)
    assert dispatch.candidates("quick_gelu", x).usable == ("float64", "native")
    y = fusedops.quick_gelu(x)
    assert dispatch.last_used["quick_gelu"] == "float64"
    assert_close(y, fusedops.quick_gelu(x.double(), backend="reference"))


def test_a_registered_backend_is_listed_and_gone_after_the_undo():
    registration = dispatch.register_backend(Float64())
    try:
        assert "float64" in dispatch.backend_names()
        header = next(line for line in _info().splitlines() if line.startswith("op "))
        assert header.split() == ["op", "cuda", "triton", "native", "float64"]
        row = next(line for line in _info().splitlines() if line.startswith("quick_gelu "))
        assert "unverified; available" in row
        assert "no float64 implementation of layer_norm" in _info()
        assert dispatch.availability()["quick_gelu"]["float64"] == "available"
    finally:
        registration.undo()
    registration.undo()  # twice does nothing
    assert "float64" not in dispatch.backend_names()
    assert "float64" not in _info()
    with pytest.raises(ValueError, match="unknown backend 'float64'"):
        fusedops.quick_gelu(torch.ones(2), backend="float64")
    with (
        pytest.raises(ValueError, match="use_backend: unknown backend 'float64'"),
        dispatch.use_backend("float64"),
    ):
        pass


def test_register_backend_checks_what_it_is_given(float64):
    with pytest.raises(TypeError, match="backend: expected a fusedops.dispatch.Backend"):
        dispatch.register_backend(object())
    with pytest.raises(ValueError, match="'float64' is already registered"):
        dispatch.register_backend(Float64())
    nameless = Float64()
    nameless.name = "no name"
    with pytest.raises(ValueError, match="must be an identifier"):
        dispatch.register_backend(nameless)
    # replace=True holds until the undo, which restores the one replaced
    other = Float64()
    with dispatch.register_backend(other, replace=True):
        assert dispatch.get_backend("float64") is other
    assert dispatch.get_backend("float64") is float64


def test_entry_points_register_plugins(monkeypatch):
    """A package's ``fusedops.backends`` entry point is loaded on first use; a broken one is
    skipped with a warning naming it."""
    group = dispatch.ENTRY_POINT_GROUP
    found = [
        importlib.metadata.EntryPoint("f64", "tests.float64_backend:Float64", group),
        importlib.metadata.EntryPoint("broken", "tests.no_such_module:Backend", group),
    ]
    asked = []

    def entry_points(group):
        asked.append(group)
        return found

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        with pytest.warns(RuntimeWarning, match="entry point 'broken'.*failed to load"):
            assert "float64" in dispatch.backend_names()
        assert asked == [group]
        dispatch.backend_names()
        assert asked == [group]  # once per process
        x = random_tensor((3,), torch.float32, CPU)
        assert dispatch.select_name("quick_gelu", x, backend="float64") == "float64"
    finally:
        if "float64" in registry._BACKENDS:
            del registry._BACKENDS["float64"]
            registry._forget_derived("float64")


def test_candidates_on_cpu_and_on_a_stand_in_cuda_tensor(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.delenv("FUSEDOPS_UNVERIFIED", raising=False)
    x = random_tensor((4, 8), torch.float32, CPU)
    found = dispatch.candidates("layer_norm", x)
    assert found.usable == ("native",)
    assert found.refused["cuda"]  # a CPU build of torch, or the input's device
    assert found.refused["triton"][0].startswith("input is on cpu; the automatic pick runs")
    cuda_x = SimpleNamespace(device=torch.device("cuda"), is_cuda=True, dtype=torch.bfloat16)
    monkeypatch.setattr(dispatch.get_backend("cuda"), "probe_build", lambda: None)
    monkeypatch.setattr(_build(), "known_state", lambda: None)
    monkeypatch.setattr(dispatch, "gpu_verified", lambda name, backend: backend == "triton")
    found = dispatch.candidates("quick_gelu", cuda_x)
    assert found.usable == ("triton", "native")
    assert "not verified on a GPU" in found.refused["cuda"][0]
    monkeypatch.setenv("FUSEDOPS_UNVERIFIED", "1")
    assert dispatch.candidates("quick_gelu", cuda_x).usable == ("cuda", "triton", "native")
    # window attention's preference leaves the CUDA path out of the automatic pick
    q = SimpleNamespace(**vars(cuda_x), shape=(4, 3, 49, 32))
    found = dispatch.candidates("window_attention", q, q, q, None, None)
    assert found.usable == ("triton", "native")
    assert found.refused["cuda"] == ("not in window_attention's automatic preference",)


def _build():
    from fusedops.kernels.cuda import build

    return build


#: The rule's modules: what decides, which must read each backend's declarations only. The
#: registry's ``Op`` is left out: an op declares its ``reference`` and ``native`` namespaces,
#: which the built-in backends of those names run.
RULE_FILES = [
    Path(dispatch.__file__),
    Path(registry.__file__),
]
NOT_THE_RULE = ("Op",)


def _backend_names_in(source: str, names) -> list[str]:
    """Backend names in the code of ``source``: string constants and identifiers (docstrings
    and the classes of ``NOT_THE_RULE`` left out), split at underscores and dots (``is_cuda``
    names cuda)."""
    tree = ast.parse(source)
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ClassDef) and node.name in NOT_THE_RULE)
    ]
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg)):
            words.append(getattr(node, "name", None) or node.arg)
        elif isinstance(node, ast.alias):
            words.append(node.asname or node.name)
    found = set()
    for word in words:
        found.update(part for part in re.split(r"[^A-Za-z0-9]+", word.lower()) if part in names)
    return sorted(found)


def test_the_rule_names_no_backend():
    names = set(dispatch.backend_names())
    assert {"cuda", "triton", "native", "reference"} <= names
    for path in RULE_FILES:
        assert _backend_names_in(path.read_text(), names) == [], path


def test_the_name_check_sees_a_named_backend():
    planted = textwrap.dedent(
        '''
        def select(op, main):
            """The docstring may say cuda and triton."""
            if main.is_cuda:
                return "triton"
            return pick(op, "native")
        '''
    )
    assert _backend_names_in(planted, {"cuda", "triton", "native"}) == ["cuda", "native", "triton"]


def test_registering_a_backend_imports_neither_triton_cuda_nor_jax(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        import torch
        from fusedops import dispatch, ops
        from tests.float64_backend import Float64

        ops.load_all()
        with dispatch.register_backend(Float64()):
            dispatch.select_name("quick_gelu", torch.ones(2))
            dispatch.candidates("quick_gelu", torch.ones(2))
            dispatch.select_name("quick_gelu", torch.ones(2), backend="float64")
        from fusedops.kernels.cuda import build

        loaded = sorted(m for m in ("triton", "jax", "jaxlib") if m in sys.modules)
        print(loaded, torch.cuda.is_initialized(), build.is_loaded())
        """
    )
    repo = Path(__file__).resolve().parents[1]
    done = run_python("-c", code, cwd=repo, path=(repo,), env={"TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] False False"


def test_a_cuda_kernel_without_a_launcher_module_calls_its_binding(monkeypatch, tmp_path):
    """An op's CUDA kernel may be its .cu and binding alone (the binding allocates the outputs,
    taking ``poison`` last; without ``<op>.h`` it declares the launchers itself): the backend
    calls ``torch.ops.fusedops_cuda.<op>_<function>`` and verifies those files."""
    from types import SimpleNamespace

    from fusedops import _alloc

    cuda = dispatch.get_backend("cuda")
    for name in ("my_op.cu", "my_op_bindings.cpp"):
        (tmp_path / name).write_text("// a kernel\n")
    monkeypatch.setattr(type(cuda), "folder", property(lambda self: tmp_path))
    op = dispatch.Op("my_op_test", reference=None, kernels="my_op")
    assert cuda.module(op) is None and cuda.has_kernel(op)
    assert cuda.unavailable(op) == cuda.unavailable(dispatch.registered_ops()["quick_gelu"])
    names = [path.name for path in cuda.source_files(op)]
    assert names == sorted(["my_op.cu", "my_op_bindings.cpp", *cuda.SHARED_FILES])
    calls = []
    library = SimpleNamespace(my_op_forward=lambda *args: calls.append(args) or "y")
    monkeypatch.setattr(_build(), "library", lambda: library)
    launchers = cuda.implementation(op)
    assert launchers.forward("x", 2) == "y"
    previous = _alloc.set_poison(not _alloc.poisoning())
    try:
        launchers.forward("x", 3)
    finally:
        _alloc.set_poison(previous)
    assert calls == [("x", 2, previous), ("x", 3, not previous)]
    with pytest.raises(AttributeError):
        launchers.backward("grad")  # the binding defines no my_op_backward
    absent = dispatch.Op("absent_test", reference=None, kernels="absent")
    assert cuda.unavailable(absent) == ["no CUDA kernel for this op"]
    assert cuda.source_files(absent) == []

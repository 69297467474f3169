"""An op is wired in one place: the lists other code used to keep by hand are read from the
package layout (``fusedops/_layout.py``: file names and ``ast``, nothing imported), or checked
here where they stay hand-kept.

Each derivation is checked twice: on the real package, where it must give at least the
tables the package had when they were hand-kept (their values then, written out below; a new
op adds to them without an edit here), and on a made-up package in a temporary folder, where
a new op must be picked up without being listed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from fusedops import _layout
from fusedops._lazy import lazy_module
from fusedops.testing import run_python

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "fusedops"
TESTS = REPO / "tests"

# -- 1. fusedops.ops.OP_MODULES: the modules of fusedops/ops/ that register an op ------------

#: The op modules and the helper modules of fusedops/ops/ when OP_MODULES was a hand-kept list.
OP_MODULES = (
    "adam",
    "bias_dropout_add",
    "deform_conv2d",
    "layer_norm",
    "nms",
    "quick_gelu",
    "swin_softmax",
    "window_attention",
    "window_process",
)
HELPERS = ("_checks", "_define", "_dtypes", "_eager", "_swin", "_transfer", "grad_norm")
HELPERS += ("nms_reference",)


def _package(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


#: A made-up ops folder: an op module, one registering two ops in a loop and one through a
#: module-level constant, and helpers that must not count (private, or only mentioning
#: register_op).
FAKE_OPS = {
    "__init__.py": "",
    "my_op.py": (
        "from fusedops import dispatch\n"
        "__all__ = ['my_op']\n"
        "dispatch.register_op('my_op', None, kernels='my_kernels')\n"
        "def my_op(x):\n    return x\n"
    ),
    "pair.py": (
        "from fusedops import dispatch\n"
        "__all__ = ('pair_first', 'pair_second')\n"
        "KERNELS = 'pair_kernels'\n"
        "for _name in ('first', 'second'):\n"
        "    dispatch.register_op(_name, None, kernels=KERNELS)\n"
    ),
    "named.py": (
        "from fusedops.dispatch import register_op\n"
        "__all__ = []\n"
        "NAME = 'named'\n"
        "register_op(NAME, None)\n"
    ),
    "_private.py": "from fusedops import dispatch\ndispatch.register_op('hidden', None)\n",
    "helper.py": '"""Mentions dispatch.register_op(...) in its docstring only."""\nX = 1\n',
}


def test_op_modules_are_the_modules_that_register_an_op():
    from fusedops import ops

    assert ops.OP_MODULES == _layout.op_modules() == tuple(sorted(ops.OP_MODULES))
    assert set(OP_MODULES) <= set(ops.OP_MODULES) and not set(HELPERS) & set(ops.OP_MODULES)
    present = {path.stem for path in (PACKAGE / "ops").glob("*.py")}
    assert set(ops.OP_MODULES) <= present
    assert "OP_MODULES" in dir(ops)


def test_a_new_op_module_is_found_without_a_list(tmp_path):
    folder = _package(tmp_path / "ops", FAKE_OPS)
    assert _layout.op_modules(folder) == ("my_op", "named", "pair")
    found = [(r.op, r.module, r.kernels) for r in _layout.registrations(folder)]
    assert found == [
        ("my_op", "my_op", "my_kernels"),
        ("named", "named", None),
        ("first", "pair", "pair_kernels"),
        ("second", "pair", "pair_kernels"),
    ]


def test_load_all_registers_every_op():
    done = run_python(
        "-c",
        "from fusedops import dispatch, ops\n"
        "ops.load_all()\n"
        "print(sorted(dispatch.registered_ops()))\n",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    registered = {r.op for r in _layout.registrations()}
    assert done.stdout.split("\n")[-2] == repr(sorted(registered))


@pytest.mark.parametrize(
    "files, message",
    [
        ({"x.py": "register_op(make_name(), None)\n__all__ = []\n"}, "op name"),
        ({"x.py": "register_op('x', None, kernels=pick())\n__all__ = []\n"}, "kernels="),
        ({"x.py": "register_op('x', None)\n", "y.py": "register_op('x', None)\n"}, "more than"),
    ],
    ids=["computed-name", "computed-kernels", "registered-twice"],
)
def test_unreadable_registrations_fail_loudly(tmp_path, files, message):
    with pytest.raises(_layout.LayoutError, match=message):
        _layout.registrations(_package(tmp_path / "ops", files))


# -- 2. fusedops' lazy attributes: the op modules' __all__ ----------------------------------

#: ``fusedops._ATTRIBUTES`` when it was hand-kept (ops and the rest).
ATTRIBUTES = {
    "quick_gelu": "fusedops.ops.quick_gelu",
    "layer_norm": "fusedops.ops.layer_norm",
    "rms_norm": "fusedops.ops.layer_norm",
    "use_backend": "fusedops.dispatch",
    "bias_dropout_add": "fusedops.ops.bias_dropout_add",
    "bias_dropout_add_fused_train": "fusedops.ops.bias_dropout_add",
    "bias_dropout_add_fused_inference": "fusedops.ops.bias_dropout_add",
    "BackendUnavailableError": "fusedops.dispatch",
    "replace_modules": "fusedops.hooks",
    "window_attention": "fusedops.ops.window_attention",
    "window_partition_roll": "fusedops.ops.window_process",
    "window_reverse_roll": "fusedops.ops.window_process",
    "swin_attention_softmax": "fusedops.ops.swin_softmax",
    "nms": "fusedops.ops.nms",
    "batched_nms": "fusedops.ops.nms",
    "nms_normal": "fusedops.ops.nms",
    "soft_nms": "fusedops.ops.nms",
    "batched_soft_nms": "fusedops.ops.nms",
    "auto_checkpoint": "fusedops.utils.checkpoint",
    "deform_conv2d": "fusedops.ops.deform_conv2d",
}


def test_public_names_are_the_op_modules_all():
    import fusedops

    table = {**fusedops._ATTRIBUTES, **_layout.op_attributes()}
    assert ATTRIBUTES.items() <= table.items()
    submodules = list(fusedops._SUBMODULES)
    assert fusedops.__all__ == sorted(table) + submodules
    assert set(table) | set(submodules) <= set(dir(fusedops))
    for name, module in table.items():
        importlib.import_module(module)
        assert getattr(fusedops, name) is getattr(sys.modules[module], name), name


def test_import_reads_nothing_until_a_public_name_is_needed():
    """``import fusedops`` reads no op module and imports no torch; a hand-listed name reads
    none either; ``__all__`` reads them, without torch; ``from fusedops import *`` gives every
    name."""
    code = (
        "import sys, fusedops\n"
        "layout = 'fusedops._layout'\n"
        "assert 'torch' not in sys.modules and layout not in sys.modules\n"
        "fusedops.replace_modules\n"
        "assert layout not in sys.modules, 'a hand-listed name read the op modules'\n"
        "names = fusedops.__all__\n"
        "assert layout in sys.modules and 'torch' not in sys.modules\n"
        "assert set(names) <= set(dir(fusedops))\n"
        "namespace = {}\n"
        "exec('from fusedops import *', namespace)\n"
        "assert set(names) <= set(namespace), set(names) - set(namespace)\n"
        "print('ok')\n"
    )
    done = run_python("-c", code, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_new_op_modules_names_are_exported(tmp_path):
    folder = _package(tmp_path / "ops", FAKE_OPS)
    assert _layout.op_attributes(folder, package="fake.ops") == {
        "my_op": "fake.ops.my_op",
        "pair_first": "fake.ops.pair",
        "pair_second": "fake.ops.pair",
    }


@pytest.mark.parametrize(
    "files, message",
    [
        ({"x.py": "register_op('x', None)\n"}, "has no __all__"),
        ({"x.py": "register_op('x', None)\n__all__ = ['a'] + B\n"}, "string literals"),
        (
            {
                "x.py": "register_op('x', None)\n__all__ = ['same']\n",
                "y.py": "register_op('y', None)\n__all__ = ['same']\n",
            },
            "__all__ of",
        ),
    ],
    ids=["no-all", "computed-all", "exported-twice"],
)
def test_op_modules_without_a_readable_all_fail_loudly(tmp_path, files, message):
    with pytest.raises(_layout.LayoutError, match=message):
        _layout.op_attributes(_package(tmp_path / "ops", files))


def test_lazy_module_derives_names_once_and_on_need():
    calls = []

    def derived():
        calls.append(1)
        return {"join": "os.path"}

    namespace = {"__name__": "fake"}
    getattr_, dir_ = lazy_module(namespace, {"sep": "os"}, ("json",), derived)
    import os

    assert getattr_("sep") == os.sep and calls == []
    with pytest.raises(AttributeError):
        getattr_("_private")
    assert calls == []
    assert getattr_("join") is os.path.join and calls == [1]
    assert getattr_("__all__") == ["join", "sep", "json"] == namespace["__all__"]
    assert {"join", "sep", "json"} <= set(dir_()) and calls == [1]
    with pytest.raises(AttributeError):
        getattr_("missing")
    clash, _ = lazy_module({"__name__": "fake"}, {"sep": "os"}, (), lambda: {"sep": "os.path"})
    with pytest.raises(ValueError, match="exported twice"):
        clash("anything")


# -- 3. benchmarks/record_verified.py OP_TEST_FILES: by the test files' names ---------------

#: ``OP_TEST_FILES`` when it was hand-kept.
OP_TEST_FILES = {
    "quick_gelu": ("test_quick_gelu",),
    "layer_norm": ("test_layer_norm", "test_layer_norm_hooks"),
    "rms_norm": ("test_layer_norm", "test_rms_norm_variants"),
    "adam": ("test_adam", "test_adam_clip"),
    "bias_dropout_add": ("test_bias_dropout_add",),
    "window_attention": ("test_window_attention", "test_window_attention_transformers"),
    "swin_attention_softmax": ("test_swin_softmax",),
    "window_partition_roll": ("test_window_process",),
    "window_reverse_roll": ("test_window_process",),
    "nms": ("test_nms",),
    "soft_nms": ("test_nms",),
    "deform_conv2d": ("test_deform_conv2d", "test_dcn_hooks"),
}


@pytest.fixture(scope="module")
def recorder():
    spec = importlib.util.spec_from_file_location(
        "record_verified_wiring", REPO / "benchmarks" / "record_verified.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_op_test_files_are_the_hand_kept_table(recorder):
    assert OP_TEST_FILES.keys() <= recorder.OP_TEST_FILES.keys()
    for op, stems in OP_TEST_FILES.items():
        assert set(recorder.OP_TEST_FILES[op]) == set(stems), op
    assert all(recorder.OP_TEST_FILES.values()), "an op without test files"
    # the explicit tables name files that exist and that the convention does not give
    named = set(recorder.NOT_KERNEL_TESTS) | {
        s for stems in recorder.EXTRA_TEST_FILES.values() for s in stems
    }
    assert all((TESTS / f"{stem}.py").exists() for stem in named), named


def test_a_new_ops_test_files_are_found_by_name(recorder, tmp_path):
    folder = _package(tmp_path / "ops", FAKE_OPS)
    tests = _package(
        tmp_path / "tests",
        {
            f"{stem}.py": ""
            for stem in (
                "test_my_kernels",
                "test_my_op",
                "test_my_op_hooks",
                "test_my_opx",  # another op's name
                "test_first_variants",
                "test_pair_kernels",
                "test_named",
                "test_nms_hooks",  # NOT_KERNEL_TESTS
                "test_deform_conv2d",
            )
        },
    )
    found = recorder.op_test_files(_layout.registrations(folder), tests)
    assert found == {
        "my_op": ("test_my_kernels", "test_my_op", "test_my_op_hooks"),
        "named": ("test_named",),
        "first": ("test_pair_kernels", "test_first_variants"),
        "second": ("test_pair_kernels",),
    }
    registered = [_layout.Registration("deform_conv2d", "x", None)]
    registered.append(_layout.Registration("nms", "x", None))
    assert recorder.op_test_files(registered, tests) == {
        "deform_conv2d": ("test_deform_conv2d", "test_dcn_hooks"),
        "nms": (),
    }


# -- 4. fusedops.nn's exports and fusedops.hooks' enable_* / disable_* ----------------------


def _top_level_names(path: Path, aliases: bool = False) -> set[str]:
    """The public functions and classes ``path`` defines at module level; aliases: also the
    names bound to one of them (``QuickGelu = QuickGELU``)."""
    tree = ast.parse(path.read_text())
    names = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    }
    if aliases:
        names |= {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id in names
            for target in node.targets
            if isinstance(target, ast.Name)
        }
    return names


def _unexported(folder: Path, exported) -> list[str]:
    """The names the public modules of ``folder`` are the home of (``__all__`` less
    ``__reexports__``) not in ``exported``."""
    modules = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    return sorted({n for path in modules for n in _layout.own_names(path)} - set(exported))


def test_nn_exports_every_nn_modules_all():
    """fusedops.nn's names come from its modules' ``__all__`` (loaded on first access): its
    ``__all__`` is every public ``fusedops/nn/<module>.py``'s own names (``__all__`` less the
    ``__reexports__`` of a re-export module), no more; each is defined there (a class, a
    function or an alias of one) and is the object its module holds; a re-exported name is
    the object of its home, never exported from the re-export module."""
    import fusedops.nn

    folder = PACKAGE / "nn"
    assert _unexported(folder, fusedops.nn.__all__) == []
    assert _unexported(folder, ()) == sorted(fusedops.nn.__all__)
    reexporting = 0
    for path in folder.glob("[!_]*.py"):
        names, reexported = _layout.own_names(path), _layout.reexported_names(path)
        assert set(names) <= _top_level_names(path, aliases=True), path.name
        assert not set(reexported) & _top_level_names(path, aliases=True), path.name
        module = importlib.import_module(f"fusedops.nn.{path.stem}")
        assert all(getattr(fusedops.nn, n) is getattr(module, n) for n in names), path.name
        assert all(getattr(module, n).__module__ == module.__name__ for n in names), path.name
        for name in reexported:
            home = sys.modules[getattr(module, name).__module__]
            assert home is not module and getattr(home, name) is getattr(module, name), name
            reexporting += 1
    assert reexporting  # the seed runtime's paths and the earlier ones (nms, swin, dcn)


def test_a_new_nn_modules_names_are_exported(tmp_path):
    """A new module's ``__all__`` is read with the others (no list to edit); one missing its
    ``__all__`` is named."""
    import fusedops.nn

    folder = _package(tmp_path / "nn", {"new.py": "__all__ = ['NewModule']\nclass NewModule: ..."})
    assert _unexported(folder, fusedops.nn.__all__) == ["NewModule"]
    assert _layout.module_attributes(folder, "pkg") == {"NewModule": "pkg.new"}
    (folder / "bare.py").write_text("class Bare: ...\n")
    with pytest.raises(_layout.LayoutError, match="bare.py has no __all__"):
        _layout.module_attributes(folder, "pkg")


def test_a_re_export_module_exports_nothing_of_its_own(tmp_path):
    """A module's ``__reexports__`` (names of its ``__all__`` whose home is elsewhere) stay out
    of the package's table; without it a name in two ``__all__`` is a LayoutError."""
    folder = _package(tmp_path / "nn", {"home.py": "__all__ = ['Thing', 'Alias']\n"})
    (folder / "seed_path.py").write_text(
        "from pkg.home import Thing\n__all__ = ['Thing']\n__reexports__ = __all__\n"
    )
    (folder / "partly.py").write_text("__all__ = ['Own', 'Alias']\n__reexports__ = ('Alias',)\n")
    assert _layout.module_attributes(folder, "pkg") == {
        "Thing": "pkg.home",
        "Alias": "pkg.home",
        "Own": "pkg.partly",
    }
    assert _layout.reexported_names(folder / "seed_path.py") == ("Thing",)
    assert _layout.own_names(folder / "partly.py") == ("Own",)
    (folder / "seed_path.py").write_text("__all__ = ['Thing']\n")
    with pytest.raises(_layout.LayoutError, match="__all__ of"):
        _layout.module_attributes(folder, "pkg")
    (folder / "seed_path.py").write_text("__all__ = []\n__reexports__ = ['Thing']\n")
    with pytest.raises(_layout.LayoutError, match="not in __all__"):
        _layout.module_attributes(folder, "pkg")


def _switches(registry: Path) -> set[str]:
    return {n for n in _top_level_names(registry) if n.startswith(("enable_", "disable_"))}


def test_hooks_export_every_switch_of_the_registry():
    import fusedops.hooks
    from fusedops.hooks import registry

    switches = _switches(PACKAGE / "hooks" / "registry.py")
    assert set(registry.__all__) == switches
    assert switches <= set(fusedops.hooks.__all__)
    for name in switches:
        assert getattr(fusedops.hooks, name) is getattr(registry, name)
    from fusedops.hooks import enable_fused_layer_norm

    assert enable_fused_layer_norm is registry.enable_fused_layer_norm


def test_a_new_switch_outside_the_registrys_all_is_seen(tmp_path):
    from fusedops.hooks import registry

    source = (PACKAGE / "hooks" / "registry.py").read_text() + "\n\ndef enable_new():\n    pass\n"
    planted = _package(tmp_path, {"registry.py": source}) / "registry.py"
    assert _switches(planted) - set(registry.__all__) == {"enable_new"}


# -- 5. fusedops.hooks.INTEGRATION_HOOKS: the integrations' hooks modules ------------------


def _hooks_modules(package: Path) -> set[str]:
    """Dotted names of the ``<package>/integrations/*/hooks.py`` files."""
    return {
        ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for path in (package / "integrations").glob("*/hooks.py")
    }


def test_integration_hooks_are_the_hooks_files_that_exist():
    import fusedops.hooks

    table = fusedops.hooks.INTEGRATION_HOOKS
    assert len(set(table)) == len(table) and set(table) == _hooks_modules(PACKAGE)
    assert all(name in sys.modules for name in table)
    libraries = fusedops.hooks.LIBRARIES
    assert libraries == tuple(name.split(".")[2] for name in table)
    # the hand-kept LIBRARIES' order (the order targets are patched) is kept
    before = ("torchvision", "mmcv", "open_clip", "transformers", "timm")
    assert [library for library in libraries if library in before] == list(before)


def test_a_new_integrations_hooks_file_is_seen(tmp_path):
    import fusedops.hooks

    planted = tmp_path / "fusedops"
    _package(planted / "integrations" / "newlib", {"__init__.py": "", "hooks.py": ""})
    assert _hooks_modules(planted) == {"fusedops.integrations.newlib.hooks"}
    assert not _hooks_modules(planted) <= set(fusedops.hooks.INTEGRATION_HOOKS)


def test_integration_hooks_are_string_literals():
    """The table is written out (a reader of the sources sees these modules as imported)."""
    tree = ast.parse((PACKAGE / "hooks" / "__init__.py").read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "INTEGRATION_HOOKS" for t in node.targets)
    ]
    assert isinstance(value, ast.Tuple)
    assert all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)

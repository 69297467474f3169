"""transformers' RMSNorm family in the list of fusedops/integrations/transformers (its
rms_norm_classes.json), read from the installed sources: every listed class has the forward of
its variant, every RMSNorm-like class is listed or excluded. Reads the modeling files as text
(no import of all of transformers)."""

import ast
import importlib
import importlib.util
import re
import warnings
from pathlib import Path

import pytest

from fusedops.integrations.transformers import hooks as transformers_hooks
from fusedops.integrations.transformers import rms_norm_classes as lib_transformers

_spec = importlib.util.find_spec("transformers")
if _spec is None:
    pytest.skip("transformers is not installed", allow_module_level=True)
MODELS = Path(_spec.submodule_search_locations[0]) / "models"
#: The version the list and the exclusions were checked against (completeness is exact there).
CHECKED_VERSION = "5.23."

#: The forwards (with ``_norm`` where the class has one) of each variant, normalised by
#: ``_normalised``: docstrings and annotations dropped, the class's own name as CLS.
FORWARDS = lib_transformers.RMS_NORM_FORWARDS

NAME = re.compile(r"\w*(?:RMSNorm|T5LayerNorm)\w*")


def _normalised(node: ast.ClassDef) -> str:
    parts = []
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name in ("forward", "_norm"):
            fn = ast.parse(ast.unparse(item)).body[0]
            first = fn.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                fn.body = fn.body[1:]
            fn.returns = None
            for arg in fn.args.args + fn.args.kwonlyargs:
                arg.annotation = None
            parts.append(ast.unparse(fn).replace(node.name, "CLS"))
    return "\n".join(parts)


def _rms_norm_like_classes() -> dict[str, str]:
    """ "<package>.<modeling module>.<class>" -> normalised forward, for every class of a
    modeling file whose name has RMSNorm or T5LayerNorm in it."""
    found = {}
    for path in sorted(MODELS.glob("*/modeling_*.py")):
        source = path.read_text()
        if "RMSNorm" not in source and "T5LayerNorm" not in source:
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and NAME.fullmatch(node.name):
                found[f"{path.parent.name}.{path.stem}.{node.name}"] = _normalised(node)
    return found


def _listed() -> dict[str, str]:
    return {
        name: variant
        for variant, names in lib_transformers.RMS_NORM_CLASSES.items()
        for name in names.split()
    }


def _version() -> str:
    text = (Path(_spec.submodule_search_locations[0]) / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


FOUND = _rms_norm_like_classes()


def test_forwards_are_known_variants():
    assert {variant for variant, _ in FORWARDS} == set(
        importlib.import_module("fusedops.integrations.transformers.rms_norm_variants").FORWARDS
    )


def test_every_listed_class_has_its_variants_forward():
    patterns = {}
    for variant, text in FORWARDS:
        patterns.setdefault(variant, set()).add(text.strip())
    listed = _listed()
    assert len(listed) == sum(len(n.split()) for n in lib_transformers.RMS_NORM_CLASSES.values())
    present = {name: variant for name, variant in listed.items() if name in FOUND}
    wrong = {n: v for n, v in present.items() if FOUND[n].strip() not in patterns[v]}
    if _version().startswith(CHECKED_VERSION):
        assert not wrong, f"listed classes whose forward is not their variant's: {wrong}"
        assert set(present) == set(listed), f"missing: {set(listed) - set(present)}"
        return
    # Another version may change a listed class's forward (the H200's transformers changed
    # DeepseekV4RMSNorm and NemotronHRMSNorm): the hooks must then leave it alone, which their
    # guard (rms_norm_code_mismatch, compared with the class's compiled code) ensures.
    for name, variant in wrong.items():
        package, module, cls = name.split(".")
        original = getattr(importlib.import_module(f"transformers.models.{package}.{module}"), cls)
        assert lib_transformers.rms_norm_code_mismatch(original, variant) is not None, name
    if wrong:
        warnings.warn(
            f"transformers {_version()}: not fused (forward changed): {wrong}", stacklevel=1
        )


def test_every_rms_norm_like_class_is_listed_or_excluded():
    listed = _listed()
    assert not set(listed) & set(lib_transformers.EXCLUDED)
    assert all(reason for reason in lib_transformers.EXCLUDED.values())
    unclassified = sorted(set(FOUND) - set(listed) - set(lib_transformers.EXCLUDED))
    if _version().startswith(CHECKED_VERSION):
        assert not unclassified, f"classify these (list or exclude): {unclassified}"
    elif unclassified:  # another version: new classes are not fused until checked
        warnings.warn(f"transformers {_version()}: not classified: {unclassified}", stacklevel=1)
    excluded_found = [n for n in lib_transformers.EXCLUDED if n in FOUND]
    known = {text.strip() for _, text in FORWARDS}
    # an excluded class has math of its own: none shares a supported variant's forward
    assert not [n for n in excluded_found if FOUND[n].strip() in known]


def test_model_files_importing_quick_gelu_by_name_are_patched_there():
    importers = set()
    for path in sorted(MODELS.glob("*/modeling_*.py")):
        source = path.read_text()
        if re.search(r"from \.\.\.activations import[^\n]*\bQuickGELUActivation\b", source):
            importers.add(f"transformers.models.{path.parent.name}.{path.stem}")
    assert importers == set(transformers_hooks._QUICK_GELU_IMPORTERS)


def test_only_the_quick_gelu_key_holds_quick_gelu_in_the_tables():
    activations = importlib.import_module("transformers.activations")
    keys = [
        key
        for key, entry in activations.ACT2CLS.items()
        if (entry[0] if isinstance(entry, tuple) else entry) is activations.QuickGELUActivation
    ]
    assert keys == ["quick_gelu"]


def test_every_listed_class_is_built_by_its_modeling_file():
    """A listed class is reached by building a model: its own modeling file instantiates it (the
    module attribute the hook replaces is what the model classes read when they are built),
    except the ones documented in UNREACHED."""
    unused = []
    for name in _listed():
        package, module, cls = name.split(".")
        path = MODELS / package / f"{module}.py"
        if path.exists() and not re.search(rf"(?<!class ){cls}\(", path.read_text()):
            unused.append(name)
    assert set(unused) <= set(lib_transformers.UNREACHED)
    if _version().startswith(CHECKED_VERSION):
        assert set(unused) == set(lib_transformers.UNREACHED)

"""transformers' RMSNorm-family classes, as data: which class has which variant of the math,
which RMSNorm-like classes are left out and why, and the code of each variant's forward.

The tables are ``rms_norm_classes.json`` beside this module (checked against transformers
5.23); this module reads them (stdlib only: never imports torch or transformers) and checks a
class's forward against its variant's code before the ``rms_norm`` hook patches it
(``rms_norm_code_mismatch``). ``tests/test_transformers_norm_list.py`` reads the modeling
sources and checks every listed forward against its variant and that every RMSNorm-like class
is listed or excluded (with the reason).
"""

from __future__ import annotations

import ast
import functools
import json
from importlib import resources
from typing import Any

_DATA = json.loads(resources.files(__package__).joinpath("rms_norm_classes.json").read_text())

#: The transformers version the tables were checked against.
CHECKED_VERSION: str = _DATA["transformers"]

#: transformers' RMSNorm-family classes by variant (``rms_norm_variants.py``: llama, t5,
#: fp32_weight, unweighted, gemma), as whitespace-separated ``<package>.<modeling
#: module>.<class>`` names under ``transformers.models``.
RMS_NORM_CLASSES: dict[str, str] = {
    variant: " ".join(names) for variant, names in _DATA["classes"].items()
}

#: RMSNorm-like classes that are not fused, and why.
EXCLUDED: dict[str, str] = _DATA["excluded"]

#: Listed classes that no model construction path reaches (their modeling file never
#: instantiates them): patched like the others, for code that uses them directly.
UNREACHED: dict[str, str] = _DATA["unreached"]

#: (variant, code of its forward, and ``_norm`` where the class has one) as transformers
#: writes it, normalised (no docstrings or annotations).
RMS_NORM_FORWARDS: list[tuple[str, str]] = [
    (forward["variant"], "\n" + "\n".join(forward["source"]) + "\n")
    for forward in _DATA["forwards"]
]


@functools.lru_cache(maxsize=256)
def _compiled(source: str, docstrings: tuple[str | None, ...]) -> tuple:
    """The code of the functions ``source`` defines, each with its docstring (None: none),
    as ``_code`` keys: compiled (never run) in a module that imports torch, as modeling files
    do (the compiler emits other bytecode for attributes of an imported module)."""
    tree = ast.parse(source)
    for function, doc in zip(tree.body, docstrings):
        if doc is not None:
            function.body.insert(0, ast.Expr(ast.Constant(doc)))
    tree.body.insert(0, ast.Import([ast.alias("torch")]))
    module = compile(ast.fix_missing_locations(tree), "<fusedops rms_norm variant>", "exec")
    functions = {c.co_name: c for c in module.co_consts if hasattr(c, "co_code")}
    return tuple(_code_key(functions[node.name]) for node in tree.body[1:])


def _code_key(code: Any) -> tuple:
    """What a code object computes, without where it is written: bytecode, constants, names."""
    return code.co_code, code.co_consts, code.co_names, code.co_varnames


def _code(function: Any) -> tuple | None:
    code = getattr(function, "__code__", None)
    return None if code is None else _code_key(code)


def rms_norm_code_mismatch(original: type, variant: str) -> str | None:
    """None when ``original``'s forward (and ``_norm``) is the code of one of ``variant``'s
    forwards in ``RMS_NORM_FORWARDS`` (compiled here: docstrings and annotations do not count),
    else why it is not."""
    for name, source in RMS_NORM_FORWARDS:
        if name != variant:
            continue
        names = [node.name for node in ast.parse(source).body]
        functions = [getattr(original, function, None) for function in names]
        docstrings = tuple(getattr(function, "__doc__", None) for function in functions)
        if tuple(map(_code, functions)) == _compiled(source, docstrings):
            return None
    return f"its forward is not the code of the {variant!r} RMSNorm variant fusedops fuses"

"""One module per op: input checks, the torch.library custom op, autograd, reference.

``OP_MODULES``: every op module, sorted by name; importing one registers its ops with the
dispatcher. It is read from the package layout on first use (``fusedops._layout``): the
modules here whose names have no leading underscore and whose source calls ``register_op(``;
the others (``_define``, ``_eager``, ..., ``nms_reference``, ``grad_norm``) are helpers. A new
op module is found without being listed anywhere.
"""

import importlib


def __getattr__(name: str):
    if name == "OP_MODULES":
        from fusedops import _layout

        value = globals()[name] = _layout.op_modules()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"OP_MODULES"})


def load_all() -> None:
    """Import every op module so all ops are registered (for ``info`` and the demo)."""
    modules = globals().get("OP_MODULES") or __getattr__("OP_MODULES")
    for name in modules:
        importlib.import_module(f"fusedops.ops.{name}")

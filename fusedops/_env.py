"""Environment switches read on every call: a fast ``getenv`` and ``TRITON_INTERPRET``.

At the bottom of the package (it imports nothing of fusedops), so kernels, dispatch and ops
can all ask; dispatch re-exports both names.
"""

from __future__ import annotations

import os
import sys

_ENVIRON = os.environ
# On POSIX os.environ keeps its values, encoded, in this dict (every assignment, ``del`` and
# monkeypatch.setenv go through it); elsewhere, None.
_ENVIRON_DATA = getattr(_ENVIRON, "_data", None) if os.name == "posix" else None
_ENV_ENCODING = sys.getfilesystemencoding()


def getenv(name: str, default: str) -> str:
    """``os.environ.get(name, default)`` without its per-call Python frames (Mapping.get,
    __getitem__, key encoding, value decoding: about 2 us, and dispatch reads the environment on
    every call). Falls back to ``os.environ.get`` where os.environ has no such dict or has been
    replaced."""
    data = _ENVIRON_DATA
    if type(data) is not dict or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    value = data.get(name.encode(_ENV_ENCODING, "surrogateescape"))
    return default if value is None else value.decode(_ENV_ENCODING, "surrogateescape")


def triton_interpreter() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return getenv("TRITON_INTERPRET", "0") == "1"

"""Errors raised by fusedops.xla (importing this module imports neither torch nor jax)."""

from __future__ import annotations


class XLATraceError(RuntimeError):
    """A program (or a pattern in it) that fusedops.xla cannot capture or lower to XLA."""


class UnsupportedOpsError(XLATraceError):
    """ATen ops with no XLA lowering, under ``fullgraph=True`` (``ops``: their names)."""

    def __init__(self, ops: list[str], where: str = "partial_trace(fullgraph=True)"):
        self.ops = list(ops)
        hint = " or use fullgraph=False to run these ops eagerly" if "fullgraph" in where else ""
        super().__init__(
            f"{where}: no XLA lowering for {', '.join(self.ops)}; add one to "
            f"fusedops.xla.lower.LOWERINGS{hint}"
        )

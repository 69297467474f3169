"""Input pipeline tools: ``Prefetcher`` (loads and copies the next batch while the current one
trains) and ``PackedDataset`` (packs variable-length token samples into fixed-size rows for
varlen attention). Names load on first access; importing this package imports nothing heavy."""

from __future__ import annotations

from fusedops._lazy import lazy_module

_ATTRIBUTES = {
    "Prefetcher": "fusedops.io.prefetcher",
    "PackedDataset": "fusedops.io.packing",
    "collate_packs": "fusedops.io.packing",
}

__all__ = sorted(_ATTRIBUTES)

__getattr__, __dir__ = lazy_module(globals(), _ATTRIBUTES)

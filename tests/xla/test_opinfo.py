"""PyTorch's OpInfo samples for the ops in the lowering table, through
``partial_trace(fn, fullgraph=True)`` against eager, forward and backward (``fusedops.xla.
opinfo.check``).

Every OpInfo of ``op_db`` that names (``aten_name``) an ATen op with a lowering, or one of
``COMPOSITES``, is a test case: it must pass every sample run (float32 on the CPU, the first
``SAMPLES`` of PyTorch's own samples, fresh random values each run). ``EXCLUDED`` lists the
exceptions and why, as few as possible. ``FUSEDOPS_OPINFO_SAMPLES`` raises the sample count
(``benchmarks/opinfo_coverage.py`` runs all of op_db with 3).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.xla.traced import no_cpu_tune  # noqa: F401

pytest.importorskip("jax")
# torch.testing._internal (the OpInfo database) imports expecttest, a test-only package that
# pyproject's test extra installs; the GPU machine's torch lacks it (2026-11-26 H200 run).
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest")

from fusedops.xla import lower, opinfo  # noqa: E402

#: samples per OpInfo (each compiles a forward and a backward program): fits the time budget
SAMPLES = int(os.environ.get("FUSEDOPS_OPINFO_SAMPLES", "1"))

#: OpInfo -> why it is not compared (kept as small as possible)
EXCLUDED = {
    # random: the values come from JAX's generator, not torch's (distributions are tested in
    # test_lowerings.py)
    "bernoulli": "random",
    "randn": "random",
    "randn_like": "random",
    "rand_like": "random",
    "randint": "random",
    # uninitialised memory: eager's values are whatever the allocator held
    "empty": "uninitialised values",
    "empty_like": "uninitialised values",
    "empty_permuted": "uninitialised values",
    "empty_strided": "uninitialised values",
    "new_empty": "uninitialised values",
    "new_empty_strided": "uninitialised values",
}

#: OpInfo -> (positions of samples left out, why)
SKIPPED_SAMPLES = {
    # (from 2 samples on) eager itself raises on this sample's backward
    "as_strided.partial_views": (frozenset({2}), "eager raises"),
    # data-dependent samples: a boolean mask index (index_put) or a tensor index / start
    # read as a number (index_fill, narrow); these run eagerly between programs
    "index_fill": (frozenset({1, 3}), "data-dependent"),
    "index_put": (frozenset({1, 3}), "data-dependent"),
    "narrow": (frozenset({1, 3}), "data-dependent"),
}


def _lowered(info) -> bool:
    return any(
        getattr(packet, overload) in lower.LOWERINGS
        for packet in opinfo.aten_packets(info)
        for overload in packet.overloads()
    )


#: OpInfos whose own ATen op is a composite of lowered ones (``_linalg_svd``, ``_linalg_eigh``)
COMPOSITES = frozenset(("linalg.svd", "svd", "linalg.svdvals", "linalg.eigh", "linalg.eigvalsh"))

CASES = sorted(
    opinfo.opinfo_id(info)
    for info in opinfo.op_db()
    if (_lowered(info) or opinfo.opinfo_id(info) in COMPOSITES)
    and torch.float32 in info.supported_dtypes("cpu")
)
BY_ID = {opinfo.opinfo_id(info): info for info in opinfo.op_db()}


def test_the_sweep_covers_the_table():
    assert len(CASES) >= 200
    listed = set(EXCLUDED) | set(SKIPPED_SAMPLES)
    assert listed <= set(CASES), sorted(listed - set(CASES))


@pytest.mark.parametrize("name", [c for c in CASES if c not in EXCLUDED])
def test_opinfo_samples_match_eager(name):
    skip = SKIPPED_SAMPLES.get(name, (frozenset(), ""))[0]
    result = opinfo.check(BY_ID[name], SAMPLES, scope=False, skip=skip)
    assert result.status == "pass", f"{name}: {result.status} {result.missing_ops} {result.detail}"

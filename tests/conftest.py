"""Test configuration. TRITON_INTERPRET is set here, before anything imports triton, so the
triton backend runs on CPU tensors on a machine without a GPU.

Seeds: inputs are random each run, yet a failing run is reproducible. The session seed comes
from ``FUSEDOPS_TEST_SEED`` (else a random one) and is printed in pytest's header and in every
failure report; before each test, torch, numpy and ``random`` are seeded with a value derived
from (session seed, test node id), so ``FUSEDOPS_TEST_SEED=<seed> pytest <node id>`` replays a
failure. A test that calls ``manual_seed`` itself still gets the inputs it asks for.
"""

import hashlib
import os
import random
import secrets
from pathlib import Path


def _gpu_present() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


os.environ.setdefault("TRITON_INTERPRET", "0" if _gpu_present() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from fusedops.testing import poisoned_outputs  # noqa: E402

SESSION_SEED = int(os.environ.get("FUSEDOPS_TEST_SEED") or secrets.randbelow(2**32))
os.environ["FUSEDOPS_TEST_SEED"] = str(SESSION_SEED)  # xdist workers and subprocesses share it


def test_seed(nodeid: str, session_seed: int = SESSION_SEED) -> int:
    """The seed of test ``nodeid`` in a session seeded with ``session_seed`` (a 32-bit int)."""
    digest = hashlib.sha256(f"{session_seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


test_seed.__test__ = False  # a helper, not a test


def pytest_report_header(config):
    return f"fusedops: FUSEDOPS_TEST_SEED={SESSION_SEED}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    seed = test_seed(item.nodeid)
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        report.sections.append(
            ("seed", f"reproduce with FUSEDOPS_TEST_SEED={SESSION_SEED} pytest '{item.nodeid}'")
        )


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _poison_kernel_outputs():
    """Every kernel output starts as NaN, so elements a kernel never writes fail the test."""
    with poisoned_outputs():
        yield

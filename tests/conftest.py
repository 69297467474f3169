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
# partial_trace's regions run as XLA in the tests: on the CPU they would otherwise run as
# eager torch wherever that measured faster (fusedops.xla.pick), and the tests of the XLA
# lowerings would test torch; tests/xla/test_pick.py turns the choice on where it tests it
os.environ.setdefault("FUSEDOPS_XLA_CPU_PICK", "0")

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


@pytest.fixture
def restore_hooks():
    """Disables every fusedops hook after the test; a file whose tests enable hooks uses it on
    each (``pytestmark = pytest.mark.usefixtures("restore_hooks")``)."""
    yield
    from fusedops import hooks

    for name in hooks.available():
        hooks.disable(name)


@pytest.fixture(autouse=True)
def _poison_kernel_outputs():
    """Every kernel output starts as NaN, so elements a kernel never writes fail the test."""
    with poisoned_outputs():
        yield


class _GridChecked:
    """A Triton kernel whose launches are checked against ``limits`` (dim 0, dims 1 and 2)."""

    def __init__(self, kernel, limits, grids):
        self.kernel, self.limits, self.grids = kernel, limits, grids

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            dims = tuple(grid(kwargs) if callable(grid) else grid)
            self.grids.append(dims)
            x_limit, yz_limit = self.limits
            assert len(dims) <= 3 and dims[0] <= x_limit, f"grid {dims}: dim 0 > {x_limit}"
            assert all(d <= yz_limit for d in dims[1:]), f"grid {dims}: dim 1/2 > {yz_limit}"
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture
def grid_limit(monkeypatch):
    """``grid_limit(module, yz)``: lowers CUDA's grid-dim-1/2 limit
    (``fusedops.kernels.device.MAX_GRID_YZ``, 65535) to ``yz`` and checks every launch of the
    Triton kernels in ``module`` (its ``*_kernel`` names: the jit functions launched from Python,
    not those the kernels call) against it (dim 0 against MAX_GRID_X); returns the list of
    launch grids. Lets a CPU test run, with small tensors, the paths that counts past 65535 take
    on a GPU."""
    import triton

    from fusedops.kernels import device

    def patch(module, yz: int) -> list[tuple[int, ...]]:
        monkeypatch.setattr(device, "MAX_GRID_YZ", yz)
        grids: list[tuple[int, ...]] = []
        for name, value in vars(module).items():
            if name.endswith("_kernel") and isinstance(value, triton.runtime.jit.KernelInterface):
                checked = _GridChecked(value, (device.MAX_GRID_X, yz), grids)
                monkeypatch.setattr(module, name, checked)
        return grids

    return patch

"""Test configuration. TRITON_INTERPRET is set here, before anything imports triton, so the
triton backend runs on CPU tensors on a machine without a GPU."""

import os
from pathlib import Path


def _gpu_present() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


os.environ.setdefault("TRITON_INTERPRET", "0" if _gpu_present() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from fusedops.testing import poisoned_outputs  # noqa: E402


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

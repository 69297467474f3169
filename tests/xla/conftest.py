"""fusedops.xla tests: a fresh Dynamo cache per test, compiled programs cached in a temp dir."""

import os
import tempfile

import pytest
import torch

os.environ.setdefault(
    "FUSEDOPS_XLA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "fusedops-xla-test")
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_tf32():
    """fp32 matmuls and convolutions in full fp32 (no TF32 on a GPU) for the test, restored
    after it. torch's ``allow_tf32`` flags are properties of module objects that
    ``monkeypatch.setattr`` cannot restore (it deletes what it finds no instance attribute of)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32
    # cudnn's flags through its context manager: once a test module has imported
    # torch.testing._internal (which disables the global flags) plain assignment raises
    current = dict(enabled=cudnn.enabled, benchmark=cudnn.benchmark)
    with cudnn.flags(**current, deterministic=cudnn.deterministic, allow_tf32=False):
        matmul.allow_tf32 = False
        try:
            yield
        finally:
            matmul.allow_tf32 = saved

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

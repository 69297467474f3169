"""Every Python block of README.md marked runnable (a fence opened with ```python runnable) runs
on the CPU, each in a fresh interpreter, so the README's examples cannot rot.

Each block runs as written in its own subprocess (hooks patch torch globally), in a temporary
working directory with fusedops' caches under it, and with one prelude the reader does not see:
``fusedops.optimize`` compiles nothing in the suite (torch.compile and XLA left out as
unavailable, as in tests/test_seed_examples.py; tests/test_optimize.py tests the trials).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python runnable[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
PRELUDE = """\
from fusedops.autotune import candidates as _candidates


def _not_here(*args, **kwargs):
    raise _candidates.Unavailable("not compiled in the test suite")


_candidates.BUILDERS["compile"] = _not_here
_candidates.BUILDERS["xla"] = _not_here
del _candidates, _not_here
"""


def runnable_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line of the opening fence, code) of every ```python runnable block."""
    return [(markdown.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(markdown)]


BLOCKS = runnable_blocks((REPO / "README.md").read_text())


def test_the_readme_has_runnable_blocks():
    assert len(BLOCKS) >= 5, BLOCKS
    assert runnable_blocks("x\n```python runnable\nprint(1)\n```\n```python\n2\n```\n") == [
        (2, "print(1)\n")
    ]


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, code, tmp_path):
    script = tmp_path / f"readme_{line}.py"
    script.write_text(PRELUDE + "\n" + code)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "FUSEDOPS_CACHE_DIR": str(tmp_path / "cache"),
        "FUSEDOPS_XLA_CACHE_DIR": str(tmp_path / "xla-cache"),
        "FUSEDOPS_HOOKS": "",
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (
        f"README.md block at line {line} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )

"""The generated tables of the README and the docs equal what ``benchmarks/tables.py`` writes
from their sources (the CSVs under ``benchmarks/results/``, ``fusedops/kernels/verified.json``,
the registered ops), and the pages stay short enough to read.

A failure names the tables that differ: run ``python benchmarks/tables.py --write`` and commit
the result (after a GPU run, a new CSV, or an edit of a verified kernel, whose entry then no
longer counts).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tables():
    return _tables()


def test_every_marked_table_equals_what_the_script_writes(tables):
    stale = tables.differing()
    assert not stale, (
        "tables that differ from their sources (run: python benchmarks/tables.py --write):\n"
        + "\n".join(stale)
    )


def test_every_table_is_placed_once_and_the_ones_asked_for_are_there(tables):
    placed = []
    for path in tables.markdown_files():
        text = path.read_text()
        placed += [(m.group("name"), path.name) for m in tables.MARKED.finditer(text)]
        opened = len(re.findall(r"^<!-- table:", text, re.M))
        assert opened == len(tables.MARKED.findall(text)), f"{path}: an unclosed table marker"
    names = [name for name, _ in placed]
    assert sorted(names) == sorted(set(names)), f"a table placed twice: {names}"
    assert set(names) == set(tables.TABLES), set(tables.TABLES) ^ set(names)
    where = dict(placed)
    assert where["ops"] == where["headline"] == "README.md"
    assert where["gpu-status"] == "GPU_STATUS.md"


def test_the_check_finds_a_table_edited_by_hand(tables, tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    good = tables.rewritten("a\n<!-- table:cpu-ddp -->\n<!-- /table:cpu-ddp -->\nb\n", {})
    assert "ddp-partial_trace | 7.236 | 0.63x" in good
    assert "CSV: `benchmarks/results/cpu-ddp.csv`" in good
    page.write_text(good.replace("7.236", "7.2"))
    monkeypatch.setattr(tables, "REPO", tmp_path)
    monkeypatch.setattr(tables, "FILES", ("README.md",))
    assert tables.differing() == ["README.md: cpu-ddp"]
    assert tables.write() == ["README.md"]
    assert page.read_text() == good and tables.differing() == []


def test_the_state_table_follows_verified_json(tables, monkeypatch):
    from fusedops import dispatch

    table = tables.ops_state()
    row = next(line for line in table.splitlines() if line.startswith("| `quick_gelu`"))
    entry = dispatch.verified_entry("quick_gelu", "cuda")
    if entry is not None:
        assert f"**verified** ({entry['gpu']}, {entry['date']})" in row
    # a kernel whose entry no longer counts reads as PyTorch's native op
    monkeypatch.setattr(dispatch, "verified_entry", lambda op, backend: None)
    row = next(line for line in tables.ops_state().splitlines() if "`quick_gelu`" in line)
    assert "verified**" not in row and "native op" in row


def test_readme_and_gpu_status_stay_short():
    readme = (REPO / "README.md").read_text().count("\n")
    status = (REPO / "benchmarks" / "GPU_STATUS.md").read_text().count("\n")
    assert readme <= 300, f"README.md has {readme} lines (at most 300: the rest goes to docs/)"
    assert status <= 150, f"GPU_STATUS.md has {status} lines (history goes to benchmarks/results/)"

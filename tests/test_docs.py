"""The documentation lives in the repository: no tracked file cites a file outside it, and the
links of the Markdown files (README's links into docs/ among them) resolve.

The design and op documents the code was first written against lived outside the repository,
so a clone could not read the contract it cites; ``docs/`` holds them now (ops.md,
contract.md, adding-an-op.md). Files only are read: nothing is imported or run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

#: Outputs recorded from runs (logs, CSVs, reports): they quote the paths of the machine that
#: produced them (compiler command lines, tracebacks), which are records, not citations.
RECORDED = ("benchmarks/results/",)

#: Citations of files outside the repository: the two documents that lived beside it, the
#: folder above the repository that held them, and absolute paths of the machine the project
#: was written on. Spelled in pieces (here and in the planted cases) so this file cites none.
OUTSIDE_CITATIONS = (
    re.compile(r"\b(?:DESIGN|OPS)" + r"\.md\b"),
    re.compile(r"(?<![\w.-])(?:\.\./)+" + r"shared\b"),
    re.compile(r"(?<![\w.-])/wo" + "rk/"),
)
#: Names that are never tracked (git's own, environments, caches, build outputs).
UNTRACKED = frozenset(
    {".git", ".venv", ".pytest_cache", ".ruff_cache", "__pycache__", "build", "dist"}
)
#: A Markdown link or image: ``[text](target)`` / ``![alt](target)``.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: A mention of a docs page anywhere (code comments, docstrings, Markdown).
DOCS_MENTION = re.compile(r"(?<![\w.-])docs/([\w.-]+\.md)\b")


def tracked_files() -> list[Path]:
    """The repository's tracked files (``git ls-files``); without git (a source archive), every
    file below the root except git's own, caches and build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout.decode()
        return [REPO / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        return [
            path
            for path in REPO.rglob("*")
            if path.is_file()
            and not any(
                part in UNTRACKED or part.endswith(".egg-info")
                for part in path.relative_to(REPO).parts
            )
        ]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte or not UTF-8) or a missing one
    (deleted in the working tree)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def outside_citations(text: str, name: str) -> list[str]:
    """'name:line: match' for every citation of a file outside the repository in ``text``."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in OUTSIDE_CITATIONS:
            hits += [f"{name}:{number}: {m.group(0)!r}" for m in pattern.finditer(line)]
    return hits


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown text (lower case, punctuation dropped,
    spaces as hyphens), fenced code blocks left out."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fenced:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(slug.replace(" ", "-"))
    return anchors


def broken_links(markdown: str, source: Path) -> list[str]:
    """'source: target (why)' for every relative link of ``markdown`` (the text of ``source``)
    that leaves the repository, names a missing file or a missing heading anchor."""
    broken = []
    for match in LINK.finditer(markdown):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (source.parent / path_part).resolve() if path_part else source
        where = f"{source.relative_to(REPO)}: {target}"
        if not resolved.is_relative_to(REPO):
            broken.append(f"{where} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif (
            anchor
            and resolved.suffix == ".md"
            and anchor not in heading_anchors(resolved.read_text())
        ):
            broken.append(f"{where} (no heading #{anchor})")
    return broken


def test_no_tracked_file_cites_a_file_outside_the_repository():
    hits = []
    for path in tracked_files():
        name = path.relative_to(REPO).as_posix()
        text = _text(path)
        if text is None or name.startswith(RECORDED):
            continue
        hits += outside_citations(text, name)
    assert not hits, "citations of files outside the repository:\n" + "\n".join(hits)


def test_every_docs_page_cited_exists():
    missing = []
    for path in tracked_files():
        text = _text(path)
        if text is None:
            continue
        for match in DOCS_MENTION.finditer(text):
            if not (DOCS / match.group(1)).is_file():
                missing.append(f"{path.relative_to(REPO)}: docs/{match.group(1)}")
    assert not missing, "cited docs pages that do not exist:\n" + "\n".join(missing)


def test_markdown_links_resolve_inside_the_repository():
    broken = []
    for path in tracked_files():
        if path.suffix == ".md" and (text := _text(path)) is not None:
            broken += broken_links(text, path)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    linked = {
        (REPO / m.group(1).partition("#")[0]).resolve()
        for m in LINK.finditer(readme)
        if m.group(1).startswith("docs/")
    }
    pages = {path.resolve() for path in DOCS.glob("*.md")}
    assert {"ops.md", "contract.md", "adding-an-op.md"} <= {p.name for p in pages}
    assert pages <= linked, f"docs pages README does not link: {sorted(pages - linked)}"
    assert not broken_links(readme, REPO / "README.md")


def test_the_checks_find_planted_mistakes():
    planted = "\n".join(
        [
            "see " + "OPS" + ".md, the op contract",  # line 1
            "(" + "DESIGN" + '.md, "Dispatch")',  # line 2
            "cp ../.." + "/shared/notes.txt .",  # line 3
            "/wo" + "rk/shared/gpu/report.md",  # line 4
            "docs/ops.md, tests/fixtures/shared.py, /tmp/work/x",  # line 5: all fine
        ]
    )
    hits = outside_citations(planted, "planted.py")
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3", "4"], hits
    readme = DOCS.parent / "README.md"
    missing = "do" + "cs/missing.md"  # in pieces: this file must not cite a missing page
    links = (
        f"[a](docs/ops.md) [b]({missing}) [c](../outside.md) [d](https://example.org/x.md) "
        "[e](docs/ops.md#no-such-heading) [f](docs/contract.md#the-dispatch-rule) "
        "![g](benchmarks/plots/none.png)"
    )
    found = broken_links(links, readme)
    assert [f.split(": ")[1].split(" ")[0] for f in found] == [
        missing,
        "../outside.md",
        "docs/ops.md#no-such-heading",
        "benchmarks/plots/none.png",
    ], found


def test_docs_index_links_every_docs_page():
    index = DOCS / "README.md"
    linked = {
        (DOCS / m.group(1).partition("#")[0]).resolve()
        for m in LINK.finditer(index.read_text())
        if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))
    }
    pages = {path.resolve() for path in DOCS.glob("*.md")} - {index.resolve()}
    assert pages <= linked, f"docs pages docs/README.md does not link: {sorted(pages - linked)}"
    assert not broken_links(index.read_text(), index)

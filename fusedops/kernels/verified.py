"""Which kernels passed the GPU suite at their current sources (the verified-dispatch table).

``verified.json`` beside this file records, per op and kernel backend, the hash of the kernel's
sources when the GPU suite passed, with the GPU, the date, the commit and the evidence.
``benchmarks/record_verified.py`` writes it from a GPU run's junit result; nothing else does.
A kernel counts as verified only while the hash of its sources *now* equals the recorded one:
any edit to the kernel, to a kernel-side helper it imports, or (CUDA) to the extension's shared
files makes it unverified again until a GPU run passes it.

Which files make up a kernel is its backend's to say (``Backend.source_files``, in
``fusedops/dispatch/``); this module hashes them and reads the table. For the built-in kernels:

- its Python module (``fusedops/kernels/<backend>/<op>.py``) and, transitively, every module
  under ``fusedops/kernels/`` that it imports (``module_sources``; the helpers shared with the
  references, Philox, window geometry, NMS plans, live in ``kernels/shared/``); host plumbing
  (``fusedops/_alloc.py``, ``fusedops/_env.py``, ``fusedops/dispatch/``) does not, since the
  CPU suite tests it;
- for CUDA, also the op's own files named like the module (``<op>.cu``, ``<op>.h``, its
  launchers' declarations, and ``<op>_bindings.cpp``) and the extension's shared files
  (``library.cpp``, ``bindings.h``, ``dtype.h``, ``device.cuh``, ``build.py``); another op's
  files are not among them, so editing one op's binding leaves the other CUDA kernels verified.

Nothing here imports triton or touches CUDA: modules are found with ``importlib.util`` and read
as text.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
VERIFIED_FILE = Path(__file__).resolve().with_name("verified.json")
#: The package whose modules make up kernels: what a kernel imports from outside it is host
#: plumbing (``fusedops/_alloc.py``, ``fusedops/_env.py``), tested by the CPU suite on every run.
KERNELS_PACKAGE = "fusedops.kernels"


def module_file(module: str) -> Path:
    """The file of fusedops module ``module``, found without importing it (the path follows the
    name)."""
    relative = Path(*module.split(".")[1:])
    candidate = PACKAGE_ROOT / relative.with_suffix(".py")
    if candidate.exists():
        return candidate
    package = PACKAGE_ROOT / relative / "__init__.py"
    if package.exists():
        return package
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module {module!r} under {PACKAGE_ROOT}")
    return Path(spec.origin)


def fusedops_imports(path: Path) -> set[str]:
    """Dotted names of the fusedops modules ``path`` imports anywhere in it, function-level
    imports included (``from fusedops.x import y`` counts ``fusedops.x.y`` when that is a
    module, else ``fusedops.x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("fusedops"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("fusedops"):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                relative = Path(*sub.split(".")[1:])
                is_module = (PACKAGE_ROOT / relative.with_suffix(".py")).exists() or (
                    PACKAGE_ROOT / relative / "__init__.py"
                ).exists()
                names.add(sub if is_module else node.module)
    return names


@functools.cache
def module_sources(module: str) -> frozenset[Path]:
    """The files of kernel module ``module``: its own and, transitively, every module under
    ``fusedops/kernels/`` it imports (``KERNELS_PACKAGE``; host plumbing outside it left out).
    A backend's ``source_files`` adds what else its kernels are built from (the CUDA
    extension's files)."""
    files: set[Path] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        path = module_file(name)
        if path in files:
            continue
        files.add(path)
        pending.extend(
            imported
            for imported in fusedops_imports(path)
            if imported.startswith(f"{KERNELS_PACKAGE}.")
        )
    return frozenset(files)


@functools.cache
def sources_hash(files: tuple[Path, ...]) -> str:
    """sha256 over the relative path and bytes of each file of ``files`` (in that order: a
    backend's ``source_files`` gives them sorted)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def recorded() -> dict[str, dict[str, dict]]:
    """op -> backend -> the recorded entry (sources, gpu, date, commit, evidence)."""
    if not VERIFIED_FILE.exists():
        return {}
    return json.loads(VERIFIED_FILE.read_text()).get("kernels", {})


def entry(op: str, backend: str, digest: str) -> dict | None:
    """The recorded entry of ``op``'s ``backend`` kernel if ``digest``, the ``sources_hash``
    of its source files now (the backend's ``source_files``), is the recorded one, else
    None (also for an empty digest: a backend with nothing to verify)."""
    found = recorded().get(op, {}).get(backend)
    if found is None or not digest or found.get("sources") != digest:
        return None
    return found

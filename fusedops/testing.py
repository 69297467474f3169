"""Test helpers shared by every op's tests: one tolerance rule, output poisoning, inputs.

Tolerances come from one rule, derived from the dtypes' unit roundoff ``u(dtype)`` (half the
machine epsilon: the largest relative error of one rounding)::

    rtol = c * (u(dtype) + u(compute) * sqrt(terms))
    atol = rtol * magnitude

with ``c = ROUNDINGS`` (4: the result's own rounding and the oracle's, each with a factor 2 of
margin). ``dtype`` is the dtype the result is stored in; ``compute`` the dtype the kernel (or
the oracle, whichever is coarser) accumulates in (float32 for 16- and 32-bit results, float64
for float64); ``terms`` the number of terms summed into one output element; ``magnitude`` the
scale of those terms (``sum |term|`` over one element, or its maximum over the output; a
tensor gives a bound per element). Summation errors grow as ``sqrt(terms)`` for random inputs
(the worst case is linear), so a tolerance below this is flaky: a difference of one ulp of the
values' magnitude is then a failure for some random inputs and not for others. The relative
part also carries the summation term: ``|result| <= sum |term|``, so it never allows more than
the absolute part would with the true magnitude.

``TOLERANCES`` (the default of every helper) is this rule with ``terms = DEFAULT_TERMS`` (2048)
and ``magnitude = 1``: a kernel's result against the float64 reference, for reductions over
rows of up to ~2k unit-scale terms. A comparison whose sums are longer or larger passes
``terms`` / ``magnitude``; ``scale`` multiplies both tolerances (kept for existing callers).

Results are compared in float64 against a float64 reference. Poisoning fills every kernel
output with NaN before the kernel runs, so an element the kernel forgot to write fails the
comparison.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from fusedops import _alloc

#: c in the rule: roundings (result's and oracle's, each with a factor 2) per error source.
ROUNDINGS = 4
#: terms summed per output element that the default tolerances allow for.
DEFAULT_TERMS = 2048


#: The compute "dtype" of fp32 products on tensor cores in plain TF32 (no torch.dtype exists):
#: operands rounded to a 10-bit mantissa, products accumulated in fp32. Pass it as
#: ``compute=TF32`` where a kernel's fp32 products may run in TF32 (allow_tf32 on).
TF32 = "tf32"
#: The compute "dtype" of fp32 products as three TF32 products (``tf32x3``, torch's
#: allow_tf32=False contract on tensor cores): a = hi + lo with hi = rn_tf32(a) and lo =
#: rn_tf32(a - hi) leaves 2^-22 |a| of each operand unrepresented, and hi*hi + hi*lo + lo*hi
#: drops lo*lo (<= 2^-22 |a b|): 3 * 2^-22 per product, 12x fp32's 2^-24, accumulated in fp32.
TF32X3 = "tf32x3"


def unit_roundoff(dtype: torch.dtype | str) -> float:
    """u(dtype): the largest relative error of rounding to the floating ``dtype`` (eps / 2);
    ``TF32``: 2^-11 (10 mantissa bits); ``TF32X3``: 3 * 2^-22 per product (see TF32X3)."""
    if dtype == TF32:
        return 2.0**-11
    if dtype == TF32X3:
        return 3 * 2.0**-22
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return torch.finfo(dtype).eps / 2


def default_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels accumulate in for results of ``dtype``: float64 for float64, else
    float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tolerance(
    dtype: torch.dtype,
    scale: float = 1.0,
    *,
    terms: int = DEFAULT_TERMS,
    magnitude: float = 1.0,
    compute: torch.dtype | str | None = None,
) -> tuple[float, float]:
    """(rtol, atol) for a result stored in ``dtype`` (see the module docstring's rule).

    terms: number of terms summed into one output element (>= 1); magnitude: their scale
    (sum of |term|, >= 0); compute: the accumulation dtype (default: float32, float64 for
    float64 results; ``TF32`` / ``TF32X3`` for fp32 products in TF32 / three TF32 passes); scale
    multiplies both.
    """
    if isinstance(terms, bool) or not isinstance(terms, int):
        raise TypeError(f"terms must be an int, got {type(terms).__name__}")
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if not magnitude >= 0:
        raise ValueError(f"magnitude must be >= 0, got {magnitude}")
    compute = compute or default_compute_dtype(dtype)
    rtol = ROUNDINGS * (unit_roundoff(dtype) + unit_roundoff(compute) * math.sqrt(terms)) * scale
    return rtol, rtol * magnitude


#: dtype -> (rtol, atol) for a kernel result against the float64 reference: the rule's
#: defaults (``tolerance(dtype)``), one table for all ops.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    dtype: tolerance(dtype)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
}


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    scale: float = 1.0,
    terms: int = DEFAULT_TERMS,
    magnitude: float | torch.Tensor = 1.0,
    compute: torch.dtype | str | None = None,
    msg: str = "",
) -> None:
    """Assert ``actual`` matches ``expected`` within :func:`tolerance` for ``dtype`` (default:
    ``actual.dtype``) and ``terms`` / ``magnitude`` / ``compute`` / ``scale``: elementwise
    ``|actual - expected| <= atol + rtol * |expected|``. ``magnitude`` may be a tensor
    broadcastable to ``expected`` (a bound per element). Shapes must match; NaN anywhere in
    ``actual`` fails unless ``expected`` has NaN in the same place."""
    dtype = dtype or actual.dtype
    if actual.shape != expected.shape:
        raise AssertionError(f"{msg} shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if isinstance(magnitude, torch.Tensor):
        rtol, atol = tolerance(dtype, scale, terms=terms, compute=compute)
        bound = atol * magnitude.detach().double().cpu().abs() + rtol * e.abs()
        # the error in units of the bound, 0 where both agree (equal infinities, both NaN)
        same = (a == e) | (a.isnan() & e.isnan())
        ratio = torch.where(same, 0.0, (a - e).abs() / bound)
        torch.testing.assert_close(
            ratio,
            torch.zeros_like(ratio),
            rtol=0,
            atol=1,
            msg=lambda m: f"{msg} [{dtype}, error / elementwise bound, terms={terms}]\n{m}",
        )
        return
    rtol, atol = tolerance(dtype, scale, terms=terms, magnitude=magnitude, compute=compute)
    torch.testing.assert_close(
        a,
        e,
        rtol=rtol,
        atol=atol,
        equal_nan=True,
        msg=(lambda m: f"{msg} [{dtype}, rtol={rtol:g}, atol={atol:g}]\n{m}") if msg else None,
    )


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True) -> Iterator[None]:
    """Inside the block, kernel outputs start as NaN (floats) or the max value (integers)."""
    previous = _alloc.set_poison(enabled)
    try:
        yield
    finally:
        _alloc.set_poison(previous)


def random_tensor(
    shape,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    generator: torch.Generator | None = None,
    low: float = -3.0,
    high: float = 3.0,
) -> torch.Tensor:
    """Uniform values in [low, high): random each call, never all zeros."""
    t = torch.rand(shape, dtype=torch.float64, device=device, generator=generator)
    return (low + (high - low) * t).to(dtype)


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view holding the same values as ``t`` (stride 2 in the last dim)."""
    doubled = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    view = doubled[..., ::2]
    view.copy_(t)
    return view


def device_under_test() -> torch.device:
    """The device tests run on: CUDA when present, else CPU (Triton through its interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def backends_under_test() -> list[str]:
    """Backends the suite can check on this machine: reference and native (PyTorch's own ops)
    always; triton on a GPU or under TRITON_INTERPRET=1; cuda on a GPU with a CUDA build of
    torch."""
    from fusedops._env import triton_interpreter

    backends = ["reference", "native"]
    if importlib.util.find_spec("triton") is not None and (
        torch.cuda.is_available() or triton_interpreter()
    ):
        backends.append("triton")
    if torch.cuda.is_available() and torch.version.cuda is not None:
        backends.append("cuda")
    return backends


def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include folder (beside nvcc's, or /usr/local/cuda*/include), or None
    (compile checks of the CUDA sources on machines without a GPU)."""
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    candidates += sorted(Path("/usr/local").glob("cuda*/include"))
    for path in candidates:
        if (path / "cuda_runtime_api.h").exists():
            return str(path)
    return None


def host_library(folder: Path, name: str, code: str, include_dirs=()):
    """C++ ``code`` (CUDA kernels cut from a .cu file with a host shim) compiled by g++ into the
    shared library ``folder/name.so`` and loaded (ctypes): the kernels' arithmetic checked on
    machines without a GPU. Fails the test with g++'s errors if it does not compile."""
    import ctypes

    source = folder / f"{name}.cpp"
    source.write_text(code)
    command = ["g++", "-shared", "-fPIC", "-O1", "-std=c++17", "-w"]
    command += [f"-I{d}" for d in include_dirs] + [str(source), "-o", str(folder / f"{name}.so")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(folder / f"{name}.so"))


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root`` (stand-in packages for hook
    tests); returns ``root``."""
    for name, text in files.items():
        path = Path(root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Path(root)


def kernel_backends_under_test() -> list[str]:
    """The fused-kernel backends among ``backends_under_test()`` (triton, cuda)."""
    from fusedops import dispatch

    return [b for b in backends_under_test() if dispatch.is_kernel(b)]


def autohooks_installed() -> bool:
    """Whether this interpreter's site-packages hold fusedops_hooks.pth (installed package)."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any((Path(d) / "fusedops_hooks.pth").exists() for d in dirs)


def run_python(
    *args: str,
    cwd,
    path: tuple = (),
    env: dict | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run ``python *args`` in a fresh interpreter with this checkout (and ``path``) importable,
    FUSEDOPS_HOOKS unset unless ``env`` sets it; returns the completed process (text output).
    Where the package is not installed (a source checkout on PYTHONPATH), ``-c`` code with
    FUSEDOPS_HOOKS set first does what the installed .pth file does at interpreter start."""
    repo = Path(__file__).resolve().parent.parent
    environment = {**os.environ, **(env or {})}
    if "FUSEDOPS_HOOKS" not in (env or {}):
        environment.pop("FUSEDOPS_HOOKS", None)
    environment["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(repo)])
    if "FUSEDOPS_HOOKS" in (env or {}) and args[:1] == ("-c",) and not autohooks_installed():
        args = ("-c", "import fusedops._autohooks\n" + args[1], *args[2:])
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def run_on_side_stream(fn, *inputs: torch.Tensor):
    """``fn(*inputs)`` on a new stream of ``inputs[0]``'s device, ordered as a caller must order
    it: the side stream first waits for the current stream (it reads what that stream wrote),
    each input is recorded on it (the caching allocator keeps an input's memory until the side
    stream is done with it), then the current stream waits for the side stream and each tensor
    of the result is recorded on the current stream. On the CPU the same calls run on torch.cpu's
    streams, which order nothing (CPU work is synchronous) and need no recording; the result
    is ``fn``'s either way."""
    device = inputs[0].device
    module = torch.get_device_module(device)
    current = module.current_stream(device)
    side = module.Stream(device) if device.type == "cuda" else module.Stream()
    side.wait_stream(current)
    with module.stream(side):
        result = fn(*inputs)
    current.wait_stream(side)
    if device.type == "cuda":
        outputs = torch.utils._pytree.tree_leaves(result)
        for tensor, stream in [(t, side) for t in inputs] + [(t, current) for t in outputs]:
            if isinstance(tensor, torch.Tensor):
                tensor.record_stream(stream)
    return result


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free just now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_entry(rank: int, fn, world: int, port: int, args: tuple, env: dict) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        fn(rank, world, *args)
        dist.barrier()  # every rank done before any tears gloo down
    finally:
        dist.destroy_process_group()
    # Every check passed. About 1 run in 40 on a 2-core machine, a rank then aborted at
    # interpreter shutdown, after its atexit handlers ("terminate called without an active
    # exception": a C++ thread destroyed while joinable, in some library's static teardown).
    # Skip that teardown: a failure above still raises before this line and reaches the parent.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_gloo(fn, world: int, *args, timeout: float = 60.0, env: dict | None = None) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes joined in one gloo process
    group (CPU tensors); ``fn`` must be importable (a module-level function). Raises the first
    rank's error (``torch.multiprocessing.ProcessRaisedException``), or ``TimeoutError`` after
    ``timeout`` seconds; every process is ended (terminate, then kill) before it returns.
    ``env``: variables set in each process before the group starts."""
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _gloo_entry,
        args=(fn, world, free_port(), args, dict(env or {})),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run_gloo: {world} ranks of {fn.__name__} ran past {timeout} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()

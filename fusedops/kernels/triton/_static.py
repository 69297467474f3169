"""What a Triton kernel asks of a GPU, found without one: compile it for a CUDA arch on this
machine (Triton builds PTX and, with its bundled ptxas, the cubin on any host) and read the
compiled kernel's shared memory, registers and spills.

``compile_static(kernel, signature, constexprs, arch=90)`` returns a ``StaticInfo``;
``signature_of`` builds the signature from the kernel's argument names. Imported by tests and
the benchmark tools only (kernel modules never import it): it needs no GPU and launches nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import triton

#: Shared memory one thread block may use on an H100 (sm_90): 227 KiB.
H100_SHARED_BYTES = 232_448


@dataclasses.dataclass(frozen=True)
class StaticInfo:
    """A compiled kernel's needs: ``shared`` bytes of shared memory per block (Triton's
    metadata), ``registers`` per thread, ``spill_stores``/``spill_loads`` bytes per thread
    (ptxas; None unless asked for), and the launch options it was compiled with."""

    name: str
    shared: int
    num_warps: int
    num_stages: int
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None


def _jit_functions(module) -> dict:
    """name -> kernel of every ``@triton.jit`` function in ``module`` (compiled or interpreted)."""
    from triton.runtime.interpreter import InterpretedFunction

    kinds = (triton.runtime.JITFunction, InterpretedFunction)
    return {name: value for name, value in vars(module).items() if isinstance(value, kinds)}


def _interpreting() -> bool:
    """Whether this process runs Triton's interpreter (TRITON_INTERPRET=1, as the CPU tests do):
    then ``@triton.jit`` made interpreted functions, triton.language's own jit functions
    included, and nothing here can be compiled."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def signature_of(kernel, constexprs: dict, pointer: str, scalars: dict | None = None) -> dict:
    """Triton signature of ``kernel`` (a ``@triton.jit`` function): ``"constexpr"`` for the
    names in ``constexprs``, ``pointer`` (e.g. ``"*fp32"``, ``"*bf16"``) for arguments whose
    name ends in ``_ptr``, ``scalars[name]`` where given (e.g. ``{"scale": "fp32"}``), else
    ``"i32"`` (what a launch with an int below 2^31 specialises to)."""
    scalars = scalars or {}
    unknown = set(scalars) - set(kernel.arg_names)
    if unknown:
        raise ValueError(f"scalars names arguments {sorted(unknown)} that the kernel lacks")

    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name in scalars:
            return scalars[name]
        return pointer if name.endswith("_ptr") else "i32"

    return {name: kind(name) for name in kernel.arg_names}


def parse_ptxas(text: str) -> dict:
    """Per entry function of ``ptxas -v`` output (Triton's or nvcc's): registers, stack
    (bytes), spill_stores, spill_loads (bytes per thread), smem (static bytes)."""
    out = {}
    for section in text.split("Compiling entry function '")[1:]:
        name = section.split("'", 1)[0]

        def number(pattern: str, section: str = section) -> int:
            found = re.search(pattern, section)
            return int(found.group(1)) if found else 0

        out[name] = {
            "registers": number(r"Used (\d+) registers"),
            "stack": number(r"(\d+) bytes stack frame"),
            "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"),
            "smem": number(r"(\d+) bytes smem"),
        }
    return out


def compile_logged(source, arch: int, options: dict):
    """``triton.compile(source)`` for CUDA compute capability ``arch`` with ``options``
    (num_warps, num_stages, ...), always compiled afresh (Triton's cache would skip ptxas):
    (the compiled kernel, the ``ptxas -v`` log of Triton's own ptxas run, the one that made
    its cubin). One ptxas run per kernel, with Triton's flags."""
    import contextlib
    import io

    from triton import knobs
    from triton.backends.compiler import GPUTarget

    log = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return compiled, log.getvalue()


def compile_static(
    kernel,
    signature: dict,
    constexprs: dict,
    arch: int = 90,
    *,
    num_warps: int = 4,
    num_stages: int = 3,
    resources: bool = False,
    divisible: tuple[str, ...] | None = None,
) -> StaticInfo:
    """Compile ``kernel`` (a ``@triton.jit`` function) for CUDA compute capability ``arch``
    (90: H100) with ``signature`` (name -> Triton type, see ``signature_of``), ``constexprs``
    (name -> value) and the launch options ``num_warps``/``num_stages`` (Triton's defaults: 4,
    3), on any machine: no GPU is used. Returns its shared memory per block; with
    ``resources`` also registers and spills (from the log of Triton's own ptxas run: the
    kernel is then compiled afresh). ``divisible``: compile as Triton's launcher specializes a
    launch on aligned tensors, every pointer and these integer arguments marked divisible by 16
    (None: nothing marked). Compiled kernels land in Triton's cache, so asking again
    without ``resources`` is quick. Under TRITON_INTERPRET=1 (the CPU tests) the
    compile runs in a fresh Python process with the interpreter off, the kernel imported there
    from its module by name (a module-level kernel)."""
    if not isinstance(arch, int) or arch < 70:
        raise ValueError(f"arch must be a CUDA compute capability >= 70 such as 90, got {arch!r}")
    missing = set(constexprs) - set(signature)
    if missing:
        raise ValueError(f"constexprs {sorted(missing)} are not in the signature")
    fn = getattr(kernel, "fn", None)
    if fn is None:
        raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")
    request = {
        "module": fn.__module__,
        "kernel": fn.__name__,
        "signature": signature,
        "constexprs": constexprs,
        "arch": arch,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "resources": resources,
        "divisible": None if divisible is None else list(divisible),
    }
    if _interpreting() or not isinstance(kernel, triton.runtime.JITFunction):
        return _compile_elsewhere(request)
    return _compile(kernel, request)


def _compile(kernel, request: dict) -> StaticInfo:
    from triton.backends.compiler import GPUTarget

    arch, constexprs = request["arch"], request["constexprs"]
    signature, divisible = request["signature"], request.get("divisible")
    attrs = None
    if divisible is not None:
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, name in enumerate(kernel.arg_names)
            if signature[name].startswith("*") or name in divisible
        }
    source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    options = {"num_warps": request["num_warps"], "num_stages": request["num_stages"]}
    if request["resources"]:
        compiled, log = compile_logged(source, arch, options)
    else:
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    info = StaticInfo(
        request["kernel"],
        int(compiled.metadata.shared),
        options["num_warps"],
        options["num_stages"],
    )
    if request["resources"]:
        found = parse_ptxas(log)[compiled.metadata.name]
        info = dataclasses.replace(
            info,
            registers=found["registers"],
            spill_stores=found["spill_stores"],
            spill_loads=found["spill_loads"],
        )
    return info


def _compile_elsewhere(request: dict) -> StaticInfo:
    """``_compile`` in a fresh interpreter with TRITON_INTERPRET=0 (``python -m`` this module,
    the request as JSON on stdin), the kernel imported from its module by name."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(
        [sys.executable, "-m", __name__],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling {request['kernel']} failed:\n{done.stderr[-4000:]}")
    return StaticInfo(**json.loads(done.stdout.strip().splitlines()[-1]))


def source_hash(module) -> str:
    """A hash of the source of every ``@triton.jit`` function in ``module``: it changes when a
    kernel's code does, not when its launcher's or a comment outside the kernels does."""
    import hashlib

    sources = sorted((name, inspect.getsource(k.fn)) for name, k in _jit_functions(module).items())
    return hashlib.sha256(repr(sources).encode()).hexdigest()[:16]


def launch_key(kernel: str, pointer: str, constexprs: dict, num_warps: int, num_stages: int) -> str:
    """One launch's identity in a table: kernel name, pointer type, constexprs, options."""
    options = ",".join(f"{k}={constexprs[k]}" for k in sorted(constexprs))
    return f"{kernel}[{pointer}] {options} warps={num_warps} stages={num_stages}"


def table(
    module,
    launches,
    arch: int = 90,
    scalars=None,
    resources: bool = True,
    progress=None,
    divisible: tuple[str, ...] | None = None,
) -> dict:
    """Compile ``launches`` ((kernel, pointer type, constexprs, num_warps, num_stages) tuples,
    e.g. a kernel module's ``static_launches``) for ``arch``, float arguments named in
    ``scalars`` (see ``signature_of``): a JSON-ready dict with the Triton version,
    ``source_hash(module)`` and per ``launch_key`` its shared bytes (registers and spills with
    ``resources``). ``progress(key, info)`` is called after each compile. ``divisible``: as
    for ``compile_static``."""
    rows = {}
    for kernel, pointer, constexprs, num_warps, num_stages in launches:
        key = launch_key(kernel.__name__, pointer, constexprs, num_warps, num_stages)
        signature = signature_of(kernel, constexprs, pointer, scalars)
        info = compile_static(
            kernel,
            signature,
            constexprs,
            arch,
            num_warps=num_warps,
            num_stages=num_stages,
            resources=resources,
            divisible=divisible,
        )
        row = {"shared": info.shared}
        if resources:
            row.update(
                registers=info.registers,
                spill_stores=info.spill_stores,
                spill_loads=info.spill_loads,
            )
        rows[key] = row
        if progress is not None:
            progress(key, info)
    return {
        "triton": triton.__version__,
        "arch": arch,
        "source_hash": source_hash(module),
        "launches": rows,
    }


def _main() -> None:
    """``python -m fusedops.kernels.triton._static``: one compile request (JSON on stdin, see
    ``compile_static``), its ``StaticInfo`` as JSON on the last line of stdout."""
    request = json.loads(sys.stdin.read())
    module = importlib.import_module(request["module"])
    info = _compile(getattr(module, request["kernel"]), request)
    print(json.dumps(dataclasses.asdict(info)))


if __name__ == "__main__":
    _main()

"""PyTorch's OpInfo samples through ``partial_trace(fullgraph=True)``, compared with eager.

``check(info)`` runs the float32 samples of one OpInfo from
``torch.testing._internal.common_methods_invocations.op_db`` (PyTorch's own test inputs) as a
function of their tensors, once eagerly and once through ``partial_trace(fn, fullgraph=True)``,
forward and, where the op supports autograd, backward (``torch.autograd.grad`` of the outputs
against a random cotangent, for every float input). It says, per OpInfo:

- ``pass``: every sample gave eager's outputs and gradients (``RTOL``/``ATOL``, NaN where eager
  has NaN, same shapes and dtypes, integers and booleans exactly; a float result outside
  that passes when its largest error against the same sample computed in float64 is at most
  twice eager's float32 error: an ill-conditioned sample);
- ``missing``: some sample's graph has ops with no lowering (``missing_ops`` names them);
- ``wrong``: a sample ran and gave other numbers;
- ``error``: a sample raised something else inside partial_trace;
- out of scope: ``no-float32`` (the OpInfo has no float32 on the CPU), ``not-capturable``
  (``torch.compile(backend="aot_eager", fullgraph=True)`` cannot capture a sample: a graph break
  or an error outside fusedops), ``data-dependent`` (a sample's graph has ops whose output shape
  or value depends on the data, e.g. nonzero), ``nondeterministic`` (two eager runs under
  different torch seeds disagree: random ops, uninitialised memory), ``no-samples``.

``tests/xla/test_opinfo.py`` runs it for the OpInfos of lowered ops; ``benchmarks/
opinfo_coverage.py`` for all of op_db (the coverage figures in docs/xla.md).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree

#: tolerance of a float32 result against eager (XLA's transcendental functions and reduction
#: orders differ from ATen's by more than float32 rounding); beyond it, a result still passes
#: when its largest error against the float64 result is at most twice eager's float32 one
#: (ill-conditioned samples, where eager itself is that far off)
RTOL, ATOL = 1e-4, 1e-4

IN_SCOPE = ("pass", "missing", "wrong", "error")

#: ops returning uninitialised memory (two eager runs may even agree: the allocator reuses it)
_UNINITIALISED = frozenset(
    ("empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided")
)


@dataclass
class Result:
    """What ``check`` found for one OpInfo."""

    name: str
    status: str
    samples: int = 0
    backward: bool = False
    missing_ops: list[str] = field(default_factory=list)
    detail: str = ""


@functools.cache
def op_db() -> tuple:
    """PyTorch's OpInfo database (imported on first use: it takes a few seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    return tuple(db)


def opinfo_id(info) -> str:
    """``name`` or ``name.variant`` (unique in op_db)."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def aten_packets(info) -> list:
    """The ``torch.ops.aten`` overload packets the OpInfo names (its ``aten_name`` and
    ``aten_backward_name``), where they exist."""
    packets = []
    for name in (info.aten_name, getattr(info, "aten_backward_name", None)):
        packet = getattr(torch.ops.aten, name, None) if name else None
        if packet is not None:
            packets.append(packet)
    return packets


def _split(sample):
    """(tensor leaves, rebuild(tensors) -> (input, args, kwargs)) of a SampleInput."""
    leaves, spec = pytree.tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
    at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def rebuild(tensors):
        full = list(leaves)
        for i, t in zip(at, tensors):
            full[i] = t
        return pytree.tree_unflatten(full, spec)

    return [leaves[i] for i in at], rebuild


def _function(info, sample):
    tensors, rebuild = _split(sample)

    def fn(*ts):
        inp, args, kwargs = rebuild(ts)
        return sample.output_process_fn_grad(info.op(inp, *args, **kwargs))

    return fn, tensors


def _fresh(tensors):
    """Copies of the sample's tensors (float ones requiring grad where the sample's did)."""
    out = []
    for t in tensors:
        c = t.detach().clone()
        if t.requires_grad and (c.is_floating_point() or c.is_complex()):
            c.requires_grad_(True)
        out.append(c)
    return out


def _differentiable(outputs) -> list[torch.Tensor]:
    return [
        o
        for o in pytree.tree_leaves(outputs)
        if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point())
    ]


def _run(fn, tensors, cotangent_seed: int, backward: bool, seed: int = 0):
    """(outputs, grads or None) of ``fn`` on fresh copies of ``tensors`` (torch seeded with
    ``seed`` first). The cotangents are drawn in float32 whatever the outputs' dtype, so a
    float64 run gets the same ones."""
    inputs = _fresh(tensors)
    torch.manual_seed(seed)
    outputs = fn(*inputs)
    if not backward:
        return outputs, None
    outs = _differentiable(outputs)
    wrt = [t for t in inputs if t.requires_grad]
    if not outs or not wrt:
        return outputs, None
    generator = torch.Generator().manual_seed(cotangent_seed)
    cotangents = [torch.randn(o.shape, generator=generator).to(o.dtype) for o in outs]
    return outputs, list(torch.autograd.grad(outs, wrt, cotangents, allow_unused=True))


def _widened(tensors):
    """The sample's float32 (complex64) tensors in float64 (complex128)."""
    wide = {torch.float32: torch.float64, torch.complex64: torch.complex128}
    out = []
    for t in tensors:
        w = t.detach().to(wide.get(t.dtype, t.dtype))
        out.append(w.requires_grad_(t.requires_grad) if t.requires_grad else w)
    return out


def _run64(fn, tensors, cotangent_seed: int, backward: bool):
    """``_run`` in float64 (None where the op or its backward has no float64)."""
    try:
        return _run(fn, _widened(tensors), cotangent_seed, backward)
    except Exception:  # noqa: BLE001 - no float64 kernel: compare with eager alone
        return None


def _mismatch(actual, expected, what: str, exact=None) -> str | None:
    """Why ``actual`` differs from ``expected`` (pytrees of results), or None.

    A float element passes within ``RTOL``/``ATOL`` of eager, or when it is no further from
    the float64 result (``exact``, same structure, or None) than twice eager's own error."""
    a_leaves = pytree.tree_leaves(actual)
    e_leaves = pytree.tree_leaves(expected)
    x_leaves = pytree.tree_leaves(exact) if exact is not None else [None] * len(e_leaves)
    if len(a_leaves) != len(e_leaves) or len(x_leaves) != len(e_leaves):
        return f"{what}: {len(a_leaves)} results, eager {len(e_leaves)}"
    for i, (a, e, x) in enumerate(zip(a_leaves, e_leaves, x_leaves)):
        if not isinstance(e, torch.Tensor):
            if isinstance(a, torch.Tensor) or (a != e and not (a != a and e != e)):
                return f"{what}[{i}]: {a!r} != {e!r}"
            continue
        if not isinstance(a, torch.Tensor):
            return f"{what}[{i}]: {type(a).__name__}, eager a tensor"
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{what}[{i}]: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        a, e = _dense(a), _dense(e)
        if e.is_floating_point() or e.is_complex():
            why = _float_mismatch(a, e, x)
            if why:
                return f"{what}[{i}]: {why}"
        elif not torch.equal(a, e):
            return f"{what}[{i}]: values differ"
    return None


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, as a strided tensor (sparse layouts densified)."""
    t = t.detach()
    return t if t.layout == torch.strided else t.to_dense()


def _float_mismatch(a, e, x) -> str | None:
    """Why float tensor ``a`` differs from eager's ``e``: not within ``RTOL``/``ATOL`` of it
    and (when the float64 result ``x`` is known) further from ``x`` than twice eager's own
    largest error. None when it passes."""
    wide = torch.complex128 if e.is_complex() else torch.float64
    a, e = a.to(wide), e.to(wide)
    same = (torch.isnan(a) & torch.isnan(e)) | ((a == e) & torch.isinf(e))
    bad = ~same & ~((a - e).abs() <= ATOL + RTOL * e.abs())
    if not bool(bad.any()):
        return None
    if isinstance(x, torch.Tensor) and x.shape == e.shape:
        x = _dense(x).to(wide)
        finite = torch.isfinite(x) & torch.isfinite(e) & torch.isfinite(a)
        if bool((finite | same).all()):
            eager_error = float((e - x).abs()[finite].max()) if finite.any() else 0.0
            our_error = float((a - x).abs()[finite].max()) if finite.any() else 0.0
            if our_error <= 2 * eager_error + ATOL:
                return None  # as accurate as eager's float32 (an ill-conditioned sample)
    worst = ((a - e).abs() - RTOL * e.abs()).nan_to_num(nan=float("inf")).argmax()
    got, want = a.reshape(-1)[worst].item(), e.reshape(-1)[worst].item()
    return f"{int(bad.sum())}/{bad.numel()} elements differ, e.g. {got!r} vs eager {want!r}"


def _capturable(fn, tensors) -> str | None:
    """None when aot_eager captures ``fn`` as one graph with static shapes, else the status
    that puts the sample out of scope (``not-capturable`` / ``data-dependent``)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from fusedops.xla.backend import data_dependent_ops, decompositions

    found: list[str] = []

    def record(gm, _):
        found.extend(data_dependent_ops(gm))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=record, bw_compiler=record, decompositions=decompositions())
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
        _run(compiled, tensors, 0, backward=True)
    except Exception as error:  # noqa: BLE001 - any failure of torch's own capture
        text = str(error)
        if "data-dependent" in text or "data dependent" in text or "DataDependent" in text:
            return "data-dependent"
        return "not-capturable"
    return "data-dependent" if found else None


def _traced_outcome(fn, tensors, expected, exact, seed: int, backward: bool):
    """(status, missing ops, detail) of one sample through partial_trace(fullgraph=True)."""
    from fusedops.xla import partial_trace
    from fusedops.xla.errors import UnsupportedOpsError, XLATraceError

    torch._dynamo.reset()
    traced = partial_trace(fn, fullgraph=True)
    try:
        got = _run(traced, tensors, seed, backward)
    except UnsupportedOpsError as error:
        return "missing", list(error.ops), str(error).splitlines()[0][:200]
    except XLATraceError as error:
        if "data-dependent" in str(error):
            return "data-dependent", [], ""
        return "error", [], f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    except Exception as error:  # noqa: BLE001 - reported, not raised: this is a survey
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return "error", [], f"{type(error).__name__}: {first}"
    why = _mismatch(got[0], expected[0], "output", exact and exact[0])
    if why is None and expected[1] is not None:
        if got[1] is None:
            why = "no gradients"
        else:
            why = _mismatch(got[1], expected[1], "grad", exact and exact[1])
    return ("wrong", [], why) if why else ("pass", [], "")


def check(info, max_samples: int = 3, *, scope: bool = True, skip: frozenset = frozenset()):
    """Run up to ``max_samples`` float32 samples of OpInfo ``info`` eagerly and through
    ``partial_trace(fullgraph=True)``; ``scope=True`` first checks each sample is capturable
    by aot_eager and not data-dependent (else the result is out of scope). ``skip``: positions
    of samples to leave out. Returns a ``Result``."""
    name = opinfo_id(info)
    if torch.float32 not in info.supported_dtypes("cpu"):
        return Result(name, "no-float32")
    backward = bool(info.supports_autograd)
    try:
        every = info.sample_inputs("cpu", torch.float32, requires_grad=backward)
        kept = (sample for k, sample in enumerate(every) if k not in skip)
        samples = list(itertools.islice(kept, max_samples))
    except Exception as error:  # noqa: BLE001 - an OpInfo that cannot build samples here
        return Result(name, "no-samples", detail=f"{type(error).__name__}: {error}"[:200])
    if not samples:
        return Result(name, "no-samples")
    result = Result(name, "pass", backward=backward)
    for k, sample in enumerate(samples):
        fn, tensors = _function(info, sample)
        try:
            expected = _run(fn, tensors, k, backward)
            again = _run(fn, tensors, k, backward, seed=1)
        except Exception as error:  # noqa: BLE001 - eager itself fails: nothing to compare
            return Result(name, "not-capturable", detail=f"eager: {type(error).__name__}")
        if info.name in _UNINITIALISED or _mismatch(again[0], expected[0], "output"):
            return Result(name, "nondeterministic", samples=k)
        if scope:
            out_of_scope = _capturable(fn, tensors)
            if out_of_scope:
                return Result(name, out_of_scope, samples=k)
        exact = _run64(fn, tensors, k, backward)
        status, missing, detail = _traced_outcome(fn, tensors, expected, exact, k, backward)
        result.samples = k + 1
        if status != "pass":
            result.status, result.missing_ops = status, missing
            result.detail = f"sample {k}: {detail}"
            return result
    return result

"""Zero-copy crossings between torch tensors (CPU or CUDA) and JAX arrays.

Device: a program call runs on the JAX device matching its torch tensors' device
(:func:`call_device`): CPU tensors on ``jax.devices("cpu")[0]``, ``cuda:i`` tensors on the JAX
GPU device with hardware id ``i``, whatever JAX's default backend is.

torch -> JAX: parameters (``nn.Parameter``) are imported once and their JAX views cached, keyed
by device, storage pointer, shape, stride and dtype. On CPU a view that aliases the torch memory
stays valid when the optimizer updates the parameter in place, one that had to be copied is
renewed when the tensor's ``_version`` moves. Other CPU tensors cross as NumPy views of their
memory, which ``jax.jit`` takes without a copy; bfloat16 (which NumPy lacks) crosses by DLPack.
CUDA tensors cross by DLPack (``jnp.from_dlpack``): JAX hands its stream to the tensor's
``__dlpack__``, and torch makes that stream wait for the work queued on torch's current stream,
so JAX reads what torch wrote just before the call. A cached CUDA parameter is re-imported (and
so re-synchronised) whenever its ``_version`` moves.

JAX -> torch: DLPack (``torch.from_dlpack`` hands torch's current stream to JAX). On the CPU a
program's result crosses as a NumPy view of the JAX buffer, and the tensor made remembers the
JAX array it views while it lives (:func:`to_torch`): when that same tensor, unchanged, is the
input of a later program (a forward's activations saved for the backward are most of a
backward's inputs), the array itself is handed over instead of crossing again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
import weakref
from collections import OrderedDict

# JAX would otherwise take 75% of the GPU's memory when its GPU backend starts, starving torch;
# only read when the backend starts (lazily), so setting it here, before any use, is enough.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fusedops.xla.errors import XLATraceError  # noqa: E402

_CACHE_SIZE = 4096
_param_cache: OrderedDict[tuple, tuple] = OrderedDict()
_GPU_PLATFORMS = ("cuda", "gpu")


def _normalize(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@functools.cache
def _jax_device(kind: str, index: int | None):
    if kind == "cpu":
        try:
            return jax.devices("cpu")[0]
        except RuntimeError as error:
            raise XLATraceError(
                f"fusedops.xla: JAX has no CPU backend ({error}); include 'cpu' in JAX_PLATFORMS"
            ) from error
    if kind == "cuda":
        devices = []
        for platform in _GPU_PLATFORMS:
            try:
                devices = jax.devices(platform)
                break
            except RuntimeError:
                continue
        if not devices:
            raise XLATraceError(
                f"fusedops.xla: got CUDA tensors (cuda:{index}) but JAX has no GPU backend "
                f"(backends: {sorted({d.platform for d in jax.devices()})}); install jax with "
                "CUDA support, e.g. pip install 'jax[cuda13]'"
            )
        for d in devices:
            if getattr(d, "local_hardware_id", d.id) == index:
                return d
        raise XLATraceError(
            f"fusedops.xla: no JAX GPU device for cuda:{index} (JAX sees {devices}); check "
            "CUDA_VISIBLE_DEVICES is the same for torch and JAX"
        )
    raise XLATraceError(
        f"fusedops.xla: tensors on device type {kind!r} cannot run as XLA programs "
        "(only cpu and cuda)"
    )


def jax_device(device: torch.device | str):
    """The JAX device that runs programs on tensors of torch ``device``: ``cpu`` ->
    ``jax.devices("cpu")[0]``, ``cuda:i`` -> the JAX GPU device with hardware id ``i``.
    Raises ``XLATraceError`` for other device types or a JAX without a GPU backend."""
    device = _normalize(torch.device(device))
    return _jax_device(device.type, device.index)


def _is_cpu_scalar(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dim() == 0


def call_device(args, default: torch.device | None = None):
    """The JAX device of a program call on ``args`` (the tensors among them decide).

    All tensors must share one device, except CPU scalars (0-dim), which torch lets mix with
    CUDA tensors and which are then moved to the CUDA device. With no tensor, ``default`` (the
    CPU if None). Raises ``XLATraceError`` naming the devices when the inputs mix devices."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    devices = {_normalize(t.device) for t in tensors if not _is_cpu_scalar(t)}
    if not devices:
        devices = {torch.device("cpu")} if tensors else {torch.device(default or "cpu")}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise XLATraceError(
            f"fusedops.xla: a program's inputs are on different devices ({names}); move them to "
            "one device (CPU scalars may stay on the CPU)"
        )
    return jax_device(devices.pop())


def _bool_via_uint8(t: torch.Tensor):
    return jnp.from_dlpack(t.view(torch.uint8)) != 0


class _HostView:
    """A NumPy-importable view of a CPU tensor's memory (``__array_interface__``) that keeps
    the tensor alive. Unlike ``Tensor.numpy()`` it leaves the storage resizable: ``numpy()``
    marks it fixed for good, and FSDP2 frees and re-allocates its unsharded parameters'
    storage (``resize_``) around each forward and backward."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, typestr: str):
        self.tensor = t
        self.__array_interface__ = {
            "data": (t.data_ptr(), False),
            "shape": tuple(t.shape),
            "typestr": typestr,
            "version": 3,
        }


@functools.cache
def _typestr(dtype: torch.dtype) -> str:
    return torch.empty(0, dtype=dtype).numpy().dtype.str


def _is_parameter(t: torch.Tensor) -> bool:
    """``isinstance(t, torch.nn.Parameter)`` (which is True for any tensor flagged
    ``_is_param``) without the metaclass's Python ``__instancecheck__`` for the common types:
    a quarter of the time, asked for every input of every program call."""
    kind = type(t)
    if kind is torch.nn.Parameter:
        return True
    if kind is torch.Tensor:
        return getattr(t, "_is_param", False)
    return isinstance(t, torch.nn.Parameter)


def _keeps_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` must cross without pinning its storage (``_HostView``): parameters (their
    views cached, so the cost is once) and, under torch.distributed, every tensor (FSDP2's
    saved parameter views among them)."""
    return _is_parameter(t) or (
        torch.distributed.is_available() and torch.distributed.is_initialized()
    )


def _import(t: torch.Tensor):
    keep_storage = t.device.type == "cpu" and _keeps_storage(t)
    t = t.detach()
    if t.is_conj() or t.is_neg():  # lazy conjugate / negative views: materialise them
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.complex32:  # JAX has no complex32: programs compute it in complex64
        t = t.to(torch.complex64)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type != "cpu":
        if t.dtype == torch.bool:
            try:
                return jnp.from_dlpack(t)
            except (BufferError, RuntimeError, TypeError, ValueError):
                return _bool_via_uint8(t)
        return jnp.from_dlpack(t)
    if t.dtype == torch.bfloat16:
        return jnp.from_dlpack(t)
    if keep_storage and t.numel():
        return np.asarray(_HostView(t, _typestr(t.dtype)))
    return t.numpy()


def contiguous_order(t) -> tuple[int, ...] | None:
    """For a non-contiguous tensor that is a permutation of a dense row-major one (a
    transposed weight, a permuted activation), the dims ``p`` with ``t.permute(p)``
    contiguous: crossing ``t.permute(p)`` and transposing back inside the program costs no copy,
    where ``t.contiguous()`` copies. None for contiguous tensors, parameters (cached as they
    are) and other layouts (expanded, sliced)."""
    if not isinstance(t, torch.Tensor) or t.is_contiguous() or _is_parameter(t):
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else None


def _cached_param(t: torch.Tensor, device):
    ptr = t.data_ptr()
    cuda = t.device.type != "cpu"
    key = (str(t.device), ptr)
    entry = _param_cache.get(key)
    if entry is not None:
        shape, stride, dtype, version, aliased, array = entry
        # on CUDA an aliasing view is still renewed when the version moves: the import is
        # what orders JAX's reads after torch's writes on torch's stream
        if (
            shape == t.shape
            and dtype == t.dtype
            and stride == t.stride()
            and ((aliased and not cuda) or version == t._version)
        ):
            return array
    view = _import(t)
    array = view if isinstance(view, jax.Array) else jax.device_put(view, device)
    aliased = array.unsafe_buffer_pointer() == ptr
    _param_cache[key] = (t.shape, t.stride(), t.dtype, t._version, aliased, array)
    if len(_param_cache) > _CACHE_SIZE:
        _param_cache.popitem(last=False)
    return array


class _ResultRef(weakref.ref):
    """A weak reference to a tensor made from a CPU program result (``to_torch``), with what
    the tensor was when made: its id (the key in ``_results``), data pointer, shape, stride
    and version, and the JAX array it views."""

    __slots__ = ("key", "ptr", "shape", "stride", "version", "array")


def _forget_result(ref: _ResultRef) -> None:
    _results.pop(ref.key, None)


#: id(tensor) -> _ResultRef of the CPU tensors that view a program result, while they live
_results: dict[int, _ResultRef] = {}


def _remember_result(t: torch.Tensor, array) -> None:
    if t.is_inference():  # no version counter to tell a later write by
        return
    ref = _ResultRef(t, _forget_result)
    ref.key, ref.ptr, ref.shape = id(t), t.data_ptr(), t.shape
    ref.stride, ref.version, ref.array = t.stride(), t._version, array
    _results[ref.key] = ref


def _unchanged_result(t: torch.Tensor):
    """The JAX array ``t`` was made from (``to_torch``) when ``t`` is that very tensor, not
    written to (its version, shared by its views, has not moved) nor re-pointed or reshaped
    in place since: the array holds exactly what ``t`` holds. Else None."""
    ref = _results.get(id(t))
    if (
        ref is None
        or ref() is not t
        or ref.version != t._version
        or ref.ptr != t.data_ptr()
        or ref.shape != t.shape
        or ref.stride != t.stride()
    ):
        return None
    return ref.array


def to_jax(t, device=None):
    """A torch tensor (CPU or CUDA, any dtype XLA holds, any shape) as something ``jax.jit``
    takes without a copy: a cached ``jax.Array`` for parameters, a NumPy view for other CPU
    tensors, a DLPack view for CUDA tensors. Non-tensors pass through.

    ``device``: the call's JAX device (:func:`call_device`; by default the tensor's own). A
    CPU scalar in a CUDA call crosses as a NumPy value that ``jax.jit`` moves to the device."""
    if not isinstance(t, torch.Tensor):
        return t
    if device is None:
        device = jax_device(t.device)
    cpu = t.device.type == "cpu"
    if cpu and device.platform != "cpu":
        return _import(t)
    if _is_parameter(t):
        return _cached_param(t, device)
    array = _unchanged_result(t) if cpu else None
    return _import(t) if array is None else array


def _bool_to_torch(a) -> torch.Tensor:
    return torch.from_dlpack(a.astype(jnp.uint8)).bool()


#: dtypes a CPU JAX array crosses to torch as through a NumPy view (``to_torch``)
_NUMPY_CROSSING = frozenset(
    np.dtype(t)
    for t in (
        np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8,
        np.bool_, np.complex64, np.complex128,
    )
)  # fmt: skip


def _on_cpu(a) -> bool:
    return all(d.platform == "cpu" for d in a.devices())


def to_torch(a, on_cpu: bool | None = None) -> torch.Tensor:
    """A JAX array (computation finished) as a torch tensor on the matching device (CPU or
    ``cuda:i``), sharing its memory: on the CPU a NumPy view for the dtypes NumPy has (3 us a
    crossing instead of 8 us by DLPack; a ResNet step crosses 260 tensors), else DLPack.
    Many crossings in a row are quicker under :func:`quiet_crossings`. ``on_cpu``: whether
    ``a`` is on the CPU, where the caller knows (asking the array costs about 5 us)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    cpu = _on_cpu(a) if on_cpu is None else on_cpu
    if cpu and a.dtype in _NUMPY_CROSSING:
        with contextlib.nullcontext() if _quiet else quiet_crossings():
            t = torch.from_numpy(np.asarray(a))
        if isinstance(a, jax.Array):
            _remember_result(t, a)
        return t
    if a.dtype == jnp.bool_ and not cpu:
        try:
            return torch.from_dlpack(a)
        except (BufferError, RuntimeError, TypeError, ValueError):
            return _bool_to_torch(a)
    return torch.from_dlpack(a)


_quiet = 0  # depth of quiet_crossings contexts


@contextlib.contextmanager
def quiet_crossings():
    """A context for ``to_torch`` calls, without torch's warning about the read-only NumPy
    views they make: the arrays viewed are a program's own results, which nothing but the
    returned tensors refers to, so torch may write them (as it may a DLPack import's)."""
    global _quiet
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        _quiet += 1
        try:
            yield
        finally:
            _quiet -= 1


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host NumPy copy-or-view of ``t`` (any device) with its exact dtype; bfloat16 becomes
    ``ml_dtypes.bfloat16`` (NumPy has none). For constants baked into programs."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


def clear_cache() -> None:
    """Forget every cached parameter view and every remembered program result."""
    _param_cache.clear()
    _results.clear()

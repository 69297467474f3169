"""The dispatch rule's observable behaviour as one table, for comparing two versions of it.

``observe(controls)`` runs every op's automatic pick and every forced backend on stand-in CUDA
inputs and real CPU tensors, under each combination of the environment's switches (the CUDA
extension built or failed, triton installed or not, ``FUSEDOPS_UNVERIFIED``,
``TRITON_INTERPRET``, which kernels count as GPU-verified), and records each answer: the
backend picked, or the error's type and message, and the warnings given. ``controls`` is what
differs between versions of the dispatch code: how to make the CUDA build succeed or fail,
triton present or missing, and a set of (op, backend) pairs verified. Only public names of
``fusedops.dispatch`` are used here (``select_name``, ``availability``, ``use_backend``).

``tests/data/dispatch_before_backends.json`` holds this table as the code at d35f0b7 gave it
(before backends were registered objects); ``tests/test_dispatch_unchanged.py`` compares.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable
from types import SimpleNamespace

import torch

#: The backends every version knows by these names (forced one by one).
NAMES = ("cuda", "triton", "reference", "native")

#: Verification states: no kernel verified, every kernel verified, and the table of 2026-11-26
#: (what verified.json held at d35f0b7), written out so a later GPU run does not change it.
VERIFIED_SETS = {
    "none": frozenset(),
    "all": None,  # filled per op: every (op, cuda) and (op, triton)
    "2026-11-26": frozenset(
        (op, backend)
        for op in ("adam", "bias_dropout_add", "deform_conv2d", "nms", "quick_gelu", "soft_nms")
        for backend in ("cuda", "triton")
    ),
}


def stand_in(shape, dtype=torch.float32):
    """What dispatch and the ops' ``unsupported_reasons`` read of a CUDA tensor."""
    return SimpleNamespace(
        device=torch.device("cuda"),
        is_cuda=True,
        dtype=dtype,
        shape=torch.Size(shape),
        dim=lambda: len(shape),
    )


def _cpu(shape, dtype=torch.float32):
    """A real CPU tensor of ``shape`` holding one element (a broadcast view: rows of 2^31
    elements cost nothing)."""
    return torch.zeros((), dtype=dtype).expand(shape)


def cases(make: Callable) -> dict[str, tuple[str, tuple]]:
    """label -> (op, the tensors passed to dispatch), built with ``make(shape, dtype)``."""
    f32, bf16, f16, f64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
    out = {}
    for dtype in (f32, bf16, f16, f64):
        tag = str(dtype).removeprefix("torch.")
        out[f"quick_gelu {tag}"] = ("quick_gelu", (make((4, 8), dtype),))
        out[f"layer_norm {tag}"] = ("layer_norm", (make((4, 8), dtype),))
        out[f"rms_norm {tag}"] = ("rms_norm", (make((4, 8), dtype),))
        out[f"adam {tag}"] = ("adam", (make((10,), dtype),))
        windows = make((2, 14, 14, 8), dtype)
        out[f"window_partition_roll {tag}"] = ("window_partition_roll", (windows,))
        out[f"window_reverse_roll {tag}"] = ("window_reverse_roll", (make((8, 7, 7, 8), dtype),))
        out[f"nms {tag}"] = ("nms", (make((10, 4), dtype),))
        out[f"soft_nms {tag}"] = ("soft_nms", (make((10, 4), dtype),))
        out[f"swin_attention_softmax {tag}"] = (
            "swin_attention_softmax",
            (make((12, 3, 49, 49), dtype),),
        )
        q = make((8, 2, 49, 32), dtype)
        out[f"window_attention {tag}"] = ("window_attention", (q, q, q, None, None))
        x = make((4, 6, 8), dtype)
        out[f"bias_dropout_add {tag}"] = ("bias_dropout_add", (x, x, make((8,), dtype)))
        inp = make((2, 4, 9, 9), dtype)
        deform = (inp, make((2, 18, 9, 9), dtype), None, make((4, 4, 3, 3), dtype), None)
        out[f"deform_conv2d {tag}"] = ("deform_conv2d", deform)
    out["layer_norm rows past 2^31"] = ("layer_norm", (make((1, 2**31), f32),))
    out["rms_norm rows past 2^31"] = ("rms_norm", (make((1, 2**31), bf16),))
    out["swin softmax N=2000"] = ("swin_attention_softmax", (make((1, 1, 2000, 2000), f32),))
    out["swin softmax N=5000"] = ("swin_attention_softmax", (make((1, 1, 5000, 5000), f32),))
    q300 = make((1, 1, 300, 32), f32)
    out["window_attention N=300"] = ("window_attention", (q300, q300, q300, None, None))
    q48 = make((1, 1, 49, 48), f32)
    out["window_attention d=48"] = ("window_attention", (q48, q48, q48, None, None))
    q = make((8, 2, 49, 32), bf16)
    wide_bias = make((2, 49, 49), f64)
    out["window_attention fp64 bias"] = ("window_attention", (q, q, q, wide_bias, None))
    x = make((4, 6, 8), f32)
    out["bias_dropout_add fp64 residual"] = ("bias_dropout_add", (x, make((4, 6, 8), f64), None))
    out["bias_dropout_add grad only"] = ("bias_dropout_add", (x,))
    return out


def _answer(call: Callable[..., str], *args, **kwargs) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = {"picked": call(*args, **kwargs)}
        except Exception as error:  # noqa: BLE001  (the type and message are the answer)
            result = {"error": f"{type(error).__name__}: {error}"}
    told = sorted(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))
    if told:
        result["warned"] = told
    return result


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def observe(controls) -> dict:
    """The table: ``{switches: {case: {"auto": answer, <backend>: answer, ...}}}`` and the
    availability table. ``controls`` has ``cuda_build(ok)``, ``triton_installed(ok)``,
    ``verified(pairs)`` (None: every kernel), ``forget_warnings()`` and ``restore()``."""
    from fusedops import dispatch, ops

    ops.load_all()
    saved = {k: os.environ.get(k) for k in ("FUSEDOPS_UNVERIFIED", "TRITON_INTERPRET")}
    _set_env("FUSEDOPS_BACKEND", None)
    table: dict = {}
    try:
        for build_ok, triton_ok, unverified, interpret, verified in itertools.product(
            (True, False), (True, False), ("0", "1"), ("0", "1"), sorted(VERIFIED_SETS)
        ):
            controls.cuda_build(build_ok)
            controls.triton_installed(triton_ok)
            controls.verified(VERIFIED_SETS[verified])
            _set_env("FUSEDOPS_UNVERIFIED", unverified)
            _set_env("TRITON_INTERPRET", interpret)
            key = (
                f"build={'ok' if build_ok else 'failed'} triton={'yes' if triton_ok else 'no'} "
                f"UNVERIFIED={unverified} INTERPRET={interpret} verified={verified}"
            )
            rows = {}
            for place, make in (("cuda", stand_in), ("cpu", _cpu)):
                for label, (op, tensors) in cases(make).items():
                    controls.forget_warnings()
                    row = {"auto": _answer(dispatch.select_name, op, *tensors)}
                    for name in NAMES:
                        row[name] = _answer(dispatch.select_name, op, *tensors, backend=name)
                    rows[f"{place}: {label}"] = row
            table[key] = rows
        controls.cuda_build(False)
        controls.triton_installed(True)
        table["availability, build failed"] = dispatch.availability()
    finally:
        controls.restore()
        for name, value in saved.items():
            _set_env(name, value)
    return table

"""Adam / AdamW multi-tensor apply in Triton: one launch updates many tensors.

The launcher cuts every tensor of a group into chunks of CHUNK elements and writes one int64
*table* per launch::

    table[0 * T + t] .. table[6 * T + t]   addresses of param, grad, exp_avg, exp_avg_sq,
                                           max_exp_avg_sq, master, step of tensor slot t
                                           (0 where the list is unused)
    table[7 * T + t]                       numel of tensor slot t
    table[8 * T + c], table[8 * T + C + c] tensor slot and chunk index of program c

(T tensor slots, C chunks). The chunking, table capacity, cache and interpreter rules are
fusedops/kernels/triton/_multi_tensor.py's (checked by tests/test_adam.py).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from fusedops.kernels.shared.adam import step_arguments
from fusedops.kernels.triton import _multi_tensor
from fusedops.kernels.triton._multi_tensor import (
    MAX_CHUNKS,
    MAX_TENSORS,
    Tables,
    _round,
    _table_pointer,
    plan_tables,  # noqa: F401  (its tests ask here)
)

_ROWS = 8  # address rows (7) + size row

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _adam_block(
    offsets, mask, param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, max_ptr, master_ptr,
    lr, step_size, bias_correction2_sqrt, beta1, beta2, eps, weight_decay, grad_scale_ptr,
    clip_coef, PARAM_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr, AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr, DECOUPLED: tl.constexpr, HAS_WEIGHT_DECAY: tl.constexpr,
    HAS_MASTER: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr, HAS_CLIP: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):  # fmt: skip
    """The update of the elements at ``offsets`` (mask None: every one is in bounds); the
    gradient written back (unscaled) is never clipped."""
    g = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_GRAD_SCALE:
        g = g / tl.load(grad_scale_ptr)
        tl.store(grad_ptr + offsets, _round(g, PARAM_DTYPE, EMULATE_RTNE), mask=mask)
    if HAS_CLIP:
        g = g * clip_coef
    if MAXIMIZE:
        g = -g
    if HAS_MASTER:
        p = tl.load(master_ptr + offsets, mask=mask)
    else:
        p = tl.load(param_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_WEIGHT_DECAY:
        if DECOUPLED:
            p = p * (1.0 - lr * weight_decay)
        else:
            g = g + weight_decay * p
    m = tl.load(exp_avg_ptr + offsets, mask=mask).to(tl.float32)
    v = tl.load(exp_avg_sq_ptr + offsets, mask=mask).to(tl.float32)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    tl.store(exp_avg_ptr + offsets, _round(m, STATE_DTYPE, EMULATE_RTNE), mask=mask)
    tl.store(exp_avg_sq_ptr + offsets, _round(v, STATE_DTYPE, EMULATE_RTNE), mask=mask)
    if AMSGRAD:
        v_max = tl.load(max_ptr + offsets, mask=mask).to(tl.float32)
        v = tl.maximum(v_max, v)
        tl.store(max_ptr + offsets, _round(v, STATE_DTYPE, EMULATE_RTNE), mask=mask)
    denom = tl.sqrt(v) / bias_correction2_sqrt + eps
    p = p - step_size * (m / denom)
    if HAS_MASTER:
        tl.store(master_ptr + offsets, p, mask=mask)
    tl.store(param_ptr + offsets, _round(p, PARAM_DTYPE, EMULATE_RTNE), mask=mask)


@triton.jit
def _adam_kernel(
    table_ptr,
    n_slots,
    n_chunks,
    lr,
    lr_ptr,
    beta1,
    beta2,
    eps,
    weight_decay,
    grad_scale_ptr,
    found_inf_ptr,
    clip_coef_ptr,
    PARAM_DTYPE: tl.constexpr,
    STATE_DTYPE: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    DECOUPLED: tl.constexpr,
    HAS_WEIGHT_DECAY: tl.constexpr,
    HAS_MASTER: tl.constexpr,
    LR_ON_DEVICE: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    HAS_FOUND_INF: tl.constexpr,
    HAS_CLIP: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    pid = tl.program_id(0)
    slot = tl.load(table_ptr + 8 * n_slots + pid)
    chunk = tl.load(table_ptr + 8 * n_slots + n_chunks + pid)
    param_ptr = _table_pointer(table_ptr, 0, n_slots, slot, PARAM_DTYPE, ALIGNED)
    grad_ptr = _table_pointer(table_ptr, 1, n_slots, slot, PARAM_DTYPE, ALIGNED)
    exp_avg_ptr = _table_pointer(table_ptr, 2, n_slots, slot, STATE_DTYPE, ALIGNED)
    exp_avg_sq_ptr = _table_pointer(table_ptr, 3, n_slots, slot, STATE_DTYPE, ALIGNED)
    max_ptr = _table_pointer(table_ptr, 4, n_slots, slot, STATE_DTYPE, ALIGNED)
    master_ptr = _table_pointer(table_ptr, 5, n_slots, slot, tl.float32, ALIGNED)
    step_ptr = _table_pointer(table_ptr, 6, n_slots, slot, tl.float32, False)
    numel = tl.load(table_ptr + 7 * n_slots + slot)

    # Per-program scalars: everything read on the device (no host synchronisation).
    step = tl.load(step_ptr)
    if LR_ON_DEVICE:
        lr = tl.load(lr_ptr)
    bias_correction1 = 1.0 - tl.exp(step * tl.log(beta1))
    bias_correction2_sqrt = tl.sqrt(1.0 - tl.exp(step * tl.log(beta2)))
    step_size = lr / bias_correction1
    clip_coef = 1.0
    if HAS_CLIP:
        clip_coef = tl.load(clip_coef_ptr)
    # found_inf: the chunk is empty, so nothing is read or written.
    live = numel
    if HAS_FOUND_INF:
        live = tl.where(tl.load(found_inf_ptr) != 0.0, 0, numel)
    chunk_start = chunk * CHUNK
    chunk_len = tl.maximum(tl.minimum(live - chunk_start, CHUNK), 0)
    # Whole blocks without a mask (a mask against a size read from memory stops the loads from
    # vectorising), then the partial block at the end of a tensor with one.
    full = (chunk_len // BLOCK) * BLOCK
    for start in range(0, full, BLOCK):
        offsets = chunk_start + start + tl.arange(0, BLOCK)
        _adam_block(
            offsets, None, param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, max_ptr,
            master_ptr, lr, step_size, bias_correction2_sqrt, beta1, beta2, eps, weight_decay,
            grad_scale_ptr, clip_coef, PARAM_DTYPE, STATE_DTYPE, AMSGRAD, MAXIMIZE, DECOUPLED,
            HAS_WEIGHT_DECAY, HAS_MASTER, HAS_GRAD_SCALE, HAS_CLIP, EMULATE_RTNE,
        )  # fmt: skip
    if full < chunk_len:
        offsets = chunk_start + full + tl.arange(0, BLOCK)
        _adam_block(
            offsets, offsets < chunk_start + chunk_len, param_ptr, grad_ptr, exp_avg_ptr,
            exp_avg_sq_ptr, max_ptr, master_ptr, lr, step_size, bias_correction2_sqrt, beta1,
            beta2, eps, weight_decay, grad_scale_ptr, clip_coef, PARAM_DTYPE, STATE_DTYPE,
            AMSGRAD, MAXIMIZE, DECOUPLED, HAS_WEIGHT_DECAY, HAS_MASTER, HAS_GRAD_SCALE, HAS_CLIP,
            EMULATE_RTNE,
        )  # fmt: skip


def build_tables(
    lists: list[list[torch.Tensor]], chunk: int, max_tensors: int, max_chunks: int
) -> Tables:
    """The launch tables for the lists (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq,
    master, step; empty lists for unused ones), on the params' device
    (``_multi_tensor.build_tables``; the layout of the module docstring)."""
    return _multi_tensor.build_tables(
        lists, chunk, max_tensors, max_chunks, address_rows=7, aligned_rows=6
    )


_tables_cache = _multi_tensor.TableCache()


_LIST_NAMES = ("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "masters")


def check_lists(lists: list[list[torch.Tensor]], amsgrad: bool) -> None:
    """Raise ValueError/TypeError unless the lists fit the kernel (layout: fusedops.ops.adam):
    params, grads, the moments (and max_exp_avg_sqs with amsgrad) given, as many tensors as
    params, on the params' device, elementwise aligned with their param
    (same number of elements, contiguous or laid out like it), grads in the param dtype, one
    moment dtype (fp32 or the param dtype), fp32 masters and 1-element fp32 steps."""
    params, steps = lists[0], lists[6]
    device, dtype = params[0].device, params[0].dtype
    moment_dtype = lists[2][0].dtype
    if moment_dtype not in (torch.float32, dtype):
        raise TypeError(f"exp_avgs have dtype {moment_dtype}; expected float32 or {dtype}")
    dtypes = (dtype, dtype, moment_dtype, moment_dtype, moment_dtype, torch.float32)
    for row, name in enumerate(_LIST_NAMES):
        tensors = lists[row]
        if not tensors and (row == 5 or (row == 4 and not amsgrad)):
            continue  # optional: masters, and max_exp_avg_sqs without amsgrad
        if len(tensors) != len(params):
            raise ValueError(f"{name} has {len(tensors)} tensors, expected {len(params)}")
        for i, (t, p) in enumerate(zip(tensors, params)):
            if t.device != device or t.dtype != dtypes[row]:
                raise TypeError(
                    f"{name}[{i}] is {t.dtype} on {t.device}, expected {dtypes[row]} on {device}"
                )
            laid_out = (t.is_contiguous() and p.is_contiguous()) or (
                t.shape == p.shape and t.stride() == p.stride()
            )
            if t.numel() != p.numel() or not laid_out:
                raise ValueError(f"{name}[{i}] must have params[{i}]'s elements and layout")
    if len(steps) != len(params) or any(
        s.device != device or s.dtype != torch.float32 or s.numel() != 1 for s in steps
    ):
        raise ValueError(f"steps must be one 1-element float32 tensor per param on {device}")


def _tables(lists, chunk, max_tensors, max_chunks, amsgrad):
    """The launch tables for ``lists`` (cached by their addresses and sizes; the lists are
    checked on a cache miss)."""
    return _tables_cache.get(
        lists,
        (chunk, max_tensors, max_chunks, amsgrad),
        lambda: check_lists(lists, amsgrad),
        lambda: build_tables(lists, chunk, max_tensors, max_chunks),
    )


def step(
    *lists: list[torch.Tensor],
    chunk: int | None = None,
    block: int | None = None,
    max_tensors: int = MAX_TENSORS,
    max_chunks: int = MAX_CHUNKS,
    **options: Any,
) -> None:
    """Adam/AdamW update of a tensor group, one launch per table: the backend interface of
    fusedops/kernels/shared/adam.py (layout: fusedops.ops.adam); ``clip_coef`` (0-d float32 on
    the device, or None) multiplies the unscaled gradient.

    chunk/block (elements per program / per iteration; chunk a multiple of block) and the
    table capacities default to the module constants (smaller chunks under the interpreter).
    """
    chunk, block, interpreted = _multi_tensor.launch_sizes(chunk, block)
    lists, o = step_arguments(lists, options)
    params, _, exp_avgs, _, _, masters, steps = lists
    dummy = steps[0]  # any tensor: stands for pointers a kernel variant never reads
    tables = _tables(lists, chunk, max_tensors, max_chunks, o.amsgrad)
    for table, n_slots, n_chunks, aligned in tables:
        _adam_kernel[(n_chunks,)](
            table,
            n_slots,
            n_chunks,
            o.lr,
            o.lr_tensor if o.lr_tensor is not None else dummy,
            o.beta1,
            o.beta2,
            o.eps,
            o.weight_decay,
            o.grad_scale if o.grad_scale is not None else dummy,
            o.found_inf if o.found_inf is not None else dummy,
            o.clip_coef if o.clip_coef is not None else dummy,
            PARAM_DTYPE=_TL_DTYPES[params[0].dtype],
            STATE_DTYPE=_TL_DTYPES[exp_avgs[0].dtype],
            AMSGRAD=o.amsgrad,
            MAXIMIZE=o.maximize,
            DECOUPLED=o.decoupled,
            HAS_WEIGHT_DECAY=o.weight_decay != 0,
            HAS_MASTER=bool(masters),
            LR_ON_DEVICE=o.lr_tensor is not None,
            HAS_GRAD_SCALE=o.grad_scale is not None,
            HAS_FOUND_INF=o.found_inf is not None,
            HAS_CLIP=o.clip_coef is not None,
            CHUNK=chunk,
            BLOCK=block,
            ALIGNED=aligned,
            EMULATE_RTNE=interpreted,
        )

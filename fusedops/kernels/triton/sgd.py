"""SGD multi-tensor apply in Triton: one launch updates many tensors.

The launcher cuts every tensor of a group into chunks of CHUNK elements and writes one int64
*table* per launch (as fusedops/kernels/triton/adam.py does)::

    table[0 * T + t] .. table[4 * T + t]   addresses of param, grad, momentum_buffer, master and
                                           first flag of tensor slot t (0 where unused)
    table[5 * T + t]                       numel of tensor slot t
    table[6 * T + c], table[6 * T + C + c] tensor slot and chunk index of program c

(T tensor slots, C chunks). The chunking, table capacity, cache and interpreter rules are
fusedops/kernels/triton/_multi_tensor.py's (checked by tests/test_sgd.py).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from fusedops.kernels.shared.sgd import step_arguments
from fusedops.kernels.triton import _multi_tensor
from fusedops.kernels.triton._multi_tensor import (
    MAX_CHUNKS,
    MAX_TENSORS,
    Tables,
    _round,
    _table_pointer,
    plan_tables,  # noqa: F401  (its tests ask here)
)

_ADDRESS_ROWS = 5  # param, grad, momentum_buffer, master, first
_ROWS = _ADDRESS_ROWS + 1  # + the size row

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _sgd_block(
    offsets, mask, param_ptr, grad_ptr, buf_ptr, master_ptr, first, lr, momentum, dampening,
    weight_decay, grad_scale_ptr, PARAM_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr,
    HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, MAXIMIZE: tl.constexpr,
    HAS_WEIGHT_DECAY: tl.constexpr, HAS_MASTER: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr,
    HAS_FIRST: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):  # fmt: skip
    """The update of the elements at ``offsets`` (mask None: every one is in bounds)."""
    g = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_GRAD_SCALE:
        g = g / tl.load(grad_scale_ptr)
        tl.store(grad_ptr + offsets, _round(g, PARAM_DTYPE, EMULATE_RTNE), mask=mask)
    if MAXIMIZE:
        g = -g
    if HAS_MASTER:
        p = tl.load(master_ptr + offsets, mask=mask)
    else:
        p = tl.load(param_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_WEIGHT_DECAY:
        g = g + weight_decay * p
    if HAS_MOMENTUM:
        b = tl.load(buf_ptr + offsets, mask=mask).to(tl.float32)
        b = momentum * b + (1.0 - dampening) * g
        if HAS_FIRST:
            b = tl.where(first, g, b)
        tl.store(buf_ptr + offsets, _round(b, STATE_DTYPE, EMULATE_RTNE), mask=mask)
        if NESTEROV:  # noqa: SIM108 (a static branch of the kernel)
            g = g + momentum * b
        else:
            g = b
    p = p - lr * g
    if HAS_MASTER:
        tl.store(master_ptr + offsets, p, mask=mask)
    tl.store(param_ptr + offsets, _round(p, PARAM_DTYPE, EMULATE_RTNE), mask=mask)


@triton.jit
def _sgd_kernel(
    table_ptr,
    n_slots,
    n_chunks,
    lr,
    lr_ptr,
    momentum,
    dampening,
    weight_decay,
    grad_scale_ptr,
    found_inf_ptr,
    PARAM_DTYPE: tl.constexpr,
    STATE_DTYPE: tl.constexpr,
    HAS_MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_WEIGHT_DECAY: tl.constexpr,
    HAS_MASTER: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    LR_ON_DEVICE: tl.constexpr,
    HAS_GRAD_SCALE: tl.constexpr,
    HAS_FOUND_INF: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    pid = tl.program_id(0)
    slot = tl.load(table_ptr + 6 * n_slots + pid)
    chunk = tl.load(table_ptr + 6 * n_slots + n_chunks + pid)
    param_ptr = _table_pointer(table_ptr, 0, n_slots, slot, PARAM_DTYPE, ALIGNED)
    grad_ptr = _table_pointer(table_ptr, 1, n_slots, slot, PARAM_DTYPE, ALIGNED)
    buf_ptr = _table_pointer(table_ptr, 2, n_slots, slot, STATE_DTYPE, ALIGNED)
    master_ptr = _table_pointer(table_ptr, 3, n_slots, slot, tl.float32, ALIGNED)
    numel = tl.load(table_ptr + 5 * n_slots + slot)

    # Per-program scalars: everything read on the device (no host synchronisation).
    if LR_ON_DEVICE:
        lr = tl.load(lr_ptr)
    first = False
    if HAS_FIRST:
        first_ptr = _table_pointer(table_ptr, 4, n_slots, slot, tl.float32, False)
        first = tl.load(first_ptr) != 0.0
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
        _sgd_block(
            offsets, None, param_ptr, grad_ptr, buf_ptr, master_ptr, first, lr, momentum,
            dampening, weight_decay, grad_scale_ptr, PARAM_DTYPE, STATE_DTYPE, HAS_MOMENTUM,
            NESTEROV, MAXIMIZE, HAS_WEIGHT_DECAY, HAS_MASTER, HAS_GRAD_SCALE, HAS_FIRST,
            EMULATE_RTNE,
        )  # fmt: skip
    if full < chunk_len:
        offsets = chunk_start + full + tl.arange(0, BLOCK)
        _sgd_block(
            offsets, offsets < chunk_start + chunk_len, param_ptr, grad_ptr, buf_ptr, master_ptr,
            first, lr, momentum, dampening, weight_decay, grad_scale_ptr, PARAM_DTYPE,
            STATE_DTYPE, HAS_MOMENTUM, NESTEROV, MAXIMIZE, HAS_WEIGHT_DECAY, HAS_MASTER,
            HAS_GRAD_SCALE, HAS_FIRST, EMULATE_RTNE,
        )  # fmt: skip


def build_tables(
    lists: list[list[torch.Tensor]], chunk: int, max_tensors: int, max_chunks: int
) -> Tables:
    """The launch tables for the lists (params, grads, momentum_buffers, masters, firsts;
    empty lists for unused ones), on the params' device (``_multi_tensor.build_tables``; the
    layout of the module docstring; aligned: the array addresses, not the flags')."""
    return _multi_tensor.build_tables(
        lists, chunk, max_tensors, max_chunks, address_rows=_ADDRESS_ROWS, aligned_rows=4
    )


_tables_cache = _multi_tensor.TableCache()


_LIST_NAMES = ("params", "grads", "momentum_buffers", "masters")


def check_lists(lists: list[list[torch.Tensor]], has_momentum: bool) -> None:
    """Raise ValueError/TypeError unless the lists fit the kernel (layout: fusedops.ops.sgd):
    params and grads given, momentum_buffers with momentum, as many tensors as params, on the
    params' device, elementwise aligned with their param (same number of elements, contiguous
    or laid out like it), grads in the param dtype, buffers in float32 or the param dtype
    (float32 with masters), float32 masters, and 1-element float32 first flags."""
    params, firsts = lists[0], lists[4]
    device, dtype = params[0].device, params[0].dtype
    state_dtype = torch.float32 if lists[3] else dtype
    dtypes = (dtype, dtype, state_dtype, torch.float32)
    for row, name in enumerate(_LIST_NAMES):
        tensors = lists[row]
        if not tensors and (row == 3 or (row == 2 and not has_momentum)):
            continue  # optional: masters, and momentum_buffers without momentum
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
    if firsts and (
        len(firsts) != len(params)
        or any(f.device != device or f.dtype != torch.float32 or f.numel() != 1 for f in firsts)
    ):
        raise ValueError(f"firsts must be one 1-element float32 tensor per param on {device}")


def _tables(lists, chunk, max_tensors, max_chunks, has_momentum):
    """The launch tables for ``lists`` (cached by their addresses and sizes; the lists are
    checked on a cache miss)."""
    return _tables_cache.get(
        lists,
        (chunk, max_tensors, max_chunks, has_momentum),
        lambda: check_lists(lists, has_momentum),
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
    """SGD update of a tensor group, one launch per table: the backend interface of
    fusedops/kernels/shared/sgd.py (layout: fusedops.ops.sgd).

    chunk/block (elements per program / per iteration; chunk a multiple of block) and the
    table capacities default to the module constants (smaller chunks under the interpreter).
    """
    chunk, block, interpreted = _multi_tensor.launch_sizes(chunk, block)
    lists, o = step_arguments(lists, options)
    params, grads, momentum_buffers, masters, firsts = lists
    has_momentum = o.momentum != 0
    if not has_momentum:  # the buffers and flags are neither read nor written
        lists = [params, grads, [], masters, []]
    tables = _tables(lists, chunk, max_tensors, max_chunks, has_momentum)  # (checks the lists)
    state_dtype = (momentum_buffers[0] if has_momentum else params[0]).dtype
    dummy = grads[0]  # any tensor: stands for pointers a kernel variant never reads
    for table, n_slots, n_chunks, aligned in tables:
        _sgd_kernel[(n_chunks,)](
            table,
            n_slots,
            n_chunks,
            o.lr,
            o.lr_tensor if o.lr_tensor is not None else dummy,
            o.momentum,
            o.dampening,
            o.weight_decay,
            o.grad_scale if o.grad_scale is not None else dummy,
            o.found_inf if o.found_inf is not None else dummy,
            PARAM_DTYPE=_TL_DTYPES[params[0].dtype],
            STATE_DTYPE=_TL_DTYPES[state_dtype],
            HAS_MOMENTUM=has_momentum,
            NESTEROV=o.nesterov,
            MAXIMIZE=o.maximize,
            HAS_WEIGHT_DECAY=o.weight_decay != 0,
            HAS_MASTER=bool(masters),
            HAS_FIRST=has_momentum and bool(firsts),
            LR_ON_DEVICE=o.lr_tensor is not None,
            HAS_GRAD_SCALE=o.grad_scale is not None,
            HAS_FOUND_INF=o.found_inf is not None,
            CHUNK=chunk,
            BLOCK=block,
            ALIGNED=aligned,
            EMULATE_RTNE=interpreted,
        )

"""What the multi-tensor Triton kernels (Adam, SGD) share: their launch tables and two
device helpers.

A kernel's launcher cuts every tensor of a group into chunks of ``chunk`` elements and writes one
int64 *table* per launch: ``address_rows`` rows of tensor addresses (one row per list, a
column per tensor slot; 0 where a list is unused), the row of sizes, then the tensor slot and
chunk index of each program (the layout each kernel module's docstring spells out for its
lists). A table holds at most ``max_tensors`` tensors and ``max_chunks`` chunks; while tensors
remain, the next table is filled (a tensor whose chunks do not all fit continues in the next).
Program c loads its row, casts the addresses with ``tl.pointer_type`` and updates its chunk,
``block`` elements at a time, in fp32. Tables depend only on the tensors' addresses and sizes,
so ``TableCache`` keeps the last ones built per group and hands them back while they stay the
same (the usual case: params and state never move, and the caching allocator hands gradients
the same blocks each step).

Under TRITON_INTERPRET=1 (the CPU interpreter used by the tests) loads and stores go to the raw
host addresses, so the data_ptr tables work unchanged on CPU tensors: the interpreter runs the
same kernels and the same tables as a GPU does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from fusedops._env import triton_interpreter

Tables = list[tuple[torch.Tensor, int, int, bool]]

#: Elements per chunk (one program) and per inner iteration.
CHUNK = 65536
BLOCK = 1024
#: Capacity of one table (one launch).
MAX_TENSORS = 4096
MAX_CHUNKS = 65536
#: Smaller chunks under the CPU interpreter: more programs, each cheap to interpret.
INTERPRETER_CHUNK = 16384
INTERPRETER_BLOCK = 16384


def launch_sizes(chunk: int | None, block: int | None) -> tuple[int, int, bool]:
    """``(chunk, block, interpreted)`` of a launch: the elements per program and per iteration,
    ``chunk``/``block`` where given, else the constants (the interpreter's smaller ones under
    TRITON_INTERPRET=1); block at most chunk."""
    interpreted = triton_interpreter()
    chunk = chunk or (INTERPRETER_CHUNK if interpreted else CHUNK)
    block = min(block or (INTERPRETER_BLOCK if interpreted else BLOCK), chunk)
    return chunk, block, interpreted


@triton.jit
def _round(x, dtype: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """x (fp32) rounded to ``dtype`` to nearest even. The CPU interpreter truncates fp32 -> bf16
    casts (a GPU rounds to nearest even), so there the rounding is done on the bits first and
    the cast then only drops zero bits."""
    if EMULATE_RTNE and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _table_pointer(table_ptr, row, n_slots, slot, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """The address in ``row`` of the table for ``slot``, as a pointer to DTYPE; ALIGNED: the
    launcher checked that every address is a multiple of 16 bytes (lets loads vectorise)."""
    pointer = tl.load(table_ptr + row * n_slots + slot).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)
    return pointer


def plan_tables(
    sizes: torch.Tensor, chunk: int, max_tensors: int, max_chunks: int
) -> list[tuple[int, int, int, int]]:
    """Split the chunks of tensors with ``sizes`` (int64, every size > 0) into tables.

    Returns one (first_tensor, last_tensor_exclusive, first_chunk, last_chunk_exclusive) per
    table, chunks numbered over all tensors in order; each table has at most ``max_tensors``
    tensors and ``max_chunks`` chunks.
    """
    counts = (sizes + chunk - 1) // chunk
    ends = torch.cumsum(counts, 0)  # chunk index one past each tensor's last chunk
    total = int(ends[-1])
    tables = []
    start = 0
    while start < total:
        first = int(torch.searchsorted(ends, start, right=True))
        stop = min(start + max_chunks, total)
        if first + max_tensors < len(sizes):
            stop = min(stop, int(ends[first + max_tensors - 1]))
        last = int(torch.searchsorted(ends, stop - 1, right=True)) + 1
        tables.append((first, last, start, stop))
        start = stop
    return tables


def build_tables(
    lists: list[list[torch.Tensor]],
    chunk: int,
    max_tensors: int,
    max_chunks: int,
    *,
    address_rows: int,
    aligned_rows: int,
) -> Tables:
    """The launch tables for ``lists`` (``address_rows`` lists, params first; empty lists for
    unused ones), on the params' device: one (table, n_slots, n_chunks, aligned) per launch;
    aligned: every address in the first ``aligned_rows`` rows of the table is a multiple of 16
    bytes."""
    params = lists[0]
    n = len(params)
    addresses = torch.zeros((address_rows, n), dtype=torch.int64)
    for row, tensors in enumerate(lists):
        if tensors:
            addresses[row] = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    sizes = torch.tensor([p.numel() for p in params], dtype=torch.int64)
    counts = (sizes + chunk - 1) // chunk
    chunk_tensor = torch.repeat_interleave(torch.arange(n), counts)
    chunk_index = torch.arange(int(counts.sum())) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts
    )
    host = []
    for first, last, start, stop in plan_tables(sizes, chunk, max_tensors, max_chunks):
        table = torch.cat(
            [
                addresses[:, first:last].reshape(-1),
                sizes[first:last],
                chunk_tensor[start:stop] - first,
                chunk_index[start:stop],
            ]
        )
        aligned = bool((addresses[:aligned_rows, first:last] % 16 == 0).all())
        host.append((table, last - first, stop - start, aligned))
    flat = torch.cat([entry[0] for entry in host]).to(params[0].device, non_blocking=True)
    tables, offset = [], 0
    for table, n_slots, n_chunks, aligned in host:
        tables.append((flat[offset : offset + table.numel()], n_slots, n_chunks, aligned))
        offset += table.numel()
    return tables


class TableCache:
    """The last ``entries`` groups' tables, keyed by the tensors' addresses and sizes."""

    def __init__(self, entries: int = 64):
        self.entries = entries
        self._lock = threading.Lock()
        self._tables: dict[tuple, Tables] = {}

    def get(
        self,
        lists: list[list[torch.Tensor]],
        variant: tuple,
        check: Callable[[], None],
        build: Callable[[], Tables],
    ) -> Tables:
        """The tables of ``lists`` for a kernel ``variant`` (launch sizes and flags): cached, or
        ``check()``-ed (the lists are checked once, on a miss) and ``build()``-ed."""
        addresses = tuple(tuple(map(torch.Tensor.data_ptr, tensors)) for tensors in lists)
        key = (variant, tuple(map(torch.Tensor.numel, lists[0])), addresses)
        with self._lock:
            tables = self._tables.get(key)
        if tables is None:
            check()
            tables = build()
            with self._lock:
                if len(self._tables) >= self.entries:
                    self._tables.pop(next(iter(self._tables)))
                self._tables[key] = tables
        return tables

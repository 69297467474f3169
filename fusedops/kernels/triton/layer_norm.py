"""LayerNorm and RMSNorm Triton kernels and their launchers.

Rows of ``N`` elements (x viewed as ``(M, N)``, contiguous). Statistics in fp32; padded lanes are
zeroed before every reduction.

Forward:
- register path (``N <= MAX_FUSED_N_FORWARD``): a program holds ``BLOCK_M`` whole rows in registers
  (several rows per program for small N), mean and variance in two passes over registers. Where
  x takes half the registers a thread has (fp32 rows past 16384 on 32 warps), y is made in
  chunks of ``CHUNK`` columns that read x again (``_forward_chunk``): the rows the program has
  just read, expected from L1/L2 (one such program a multiprocessor), not DRAM; x, w and b of
  whole rows at once spilled there.
- looped path (longer rows): one program per row; pass 1 reads the row in chunks accumulating
  shifted sums (shift = the row's first element, against cancellation), pass 2 normalises.

RMSNorm variants (transformers' LlamaRMSNorm, T5LayerNorm): ``XHAT_ROUND`` rounds xhat to fp16 (1)
or bf16 (2) before the weight multiply, and y is stored in the dtype of the tensor it is written
to (the launcher allocates it in ``out_dtype``); the backward's dweight sums ``dy * xhat`` with
xhat rounded the same way, and dy is read in its own dtype.

Backward: ``dx = (g - (xhat * c1 + c2)) * rstd`` with ``g = dy * w``, ``c1 = mean(xhat * g)``,
``c2 = mean(g)`` (RMSNorm: ``c2 = 0``, ``xhat = x * rstd``). dweight and dbias are reduced in two
deterministic stages: each program writes one fp32 partial row, then ``_column_sum_kernel`` adds
the partial rows in a fixed order (dweight's and dbias's in one launch; two launches past
SPLIT_ROWS rows, ``_column_sums``). No atomics: the same bits on every run.
- register path: ``G`` programs each take row tiles ``pid, pid + G, ...``, accumulating their
  partial row in registers.
- looped path: ``_backward_coeffs_kernel`` gives c1, c2 per row; ``_backward_columns_kernel``
  (programs over column chunks x G row groups) writes dx and the partial rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops.kernels.device import programs_to_fill
from fusedops.kernels.shared.launch import cdiv, next_power_of_2

#: Rows up to this length are held in registers; longer rows take the looped path. Read at
#: every call, so tests lower it to check the looped path with small N. The forward holds one
#: row (x, y) per program, the backward also two fp32 partial rows (dweight, dbias): the
#: forward keeps whole rows in registers further.
#: From benchmarks/tune_layer_norm.py on an H100 (M=4096, kernels alone): the forward's
#: register path at 16 warps (N <= 16384) and 32 warps (N <= 32768) reached 91-95% of copy
#: bandwidth (fp32) where the looped path reached 64%; at N = 65536 it spills and the looped
#: path wins. The backward's register path beyond 8192 was slower than the looped path.
MAX_FUSED_N = 8192
MAX_FUSED_N_FORWARD = 32768
#: Most warps of a register-path program for rows up to 8192 (wider rows: BLOCK_N / 1024);
#: the backward at N = 8192 gained with 16 warps (51% -> 60% fp32, 38% -> 43% bf16).
MAX_WARPS = 8
BACKWARD_WARPS_8192 = 16
#: Chunk width of the looped path (a power of two).
LOOP_BLOCK_N = 2048
#: Elements per program in the register path (BLOCK_M * BLOCK_N, rows per program for small N).
TILE_ELEMENTS = 4096
#: Partial rows of the dweight/dbias reduction on a CPU (interpreter) run.
INTERPRETER_PROGRAMS = 4
#: ``_column_sums``: partial rows a first-stage program adds (more rows: two stages), and the
#: first stage's column block (256 bytes of each fp32 row a program).
SPLIT_ROWS = 64
SPLIT_BLOCK_N = 64


@triton.jit
def _div_n(total, N):
    """total / N, correctly rounded (Triton's ``/`` is approximate on NVIDIA GPUs)."""
    return tl.div_rn(total, N * 1.0)


@triton.jit
def _rstd(var, eps):
    """1 / sqrt(var + eps), correctly rounded: Triton's ``/`` and ``tl.sqrt`` are approximate
    (2 ulp) on NVIDIA GPUs, which rstd amplifies in dx when var is near 0 (N = 1, constant
    rows)."""
    return tl.div_rn(tl.full(var.shape, 1.0, tl.float32), tl.sqrt_rn(var + eps))


#: XHAT_ROUND code of each dtype xhat may be rounded to (None and fp32: no rounding).
_XHAT_ROUND = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _round_xhat(xhat, XHAT_ROUND: tl.constexpr):
    """xhat rounded to fp16 (XHAT_ROUND 1) or bf16 (2), to nearest even, back in fp32.

    bf16 is rounded on the bits (add half an ulp, ties to even, clear the low half; NaN kept):
    the same result as the GPU's conversion and torch's, where Triton's interpreter truncates."""
    if XHAT_ROUND == 1:
        xhat = xhat.to(tl.float16).to(tl.float32)
    elif XHAT_ROUND == 2:
        bits = xhat.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        xhat = tl.where(xhat == xhat, bits.to(tl.float32, bitcast=True), xhat)
    return xhat


@triton.jit
def _scale_shift_store(
    xc,
    rstd,
    cols,
    col_mask,
    offsets,
    mask,
    w_ptr,
    b_ptr,
    y_ptr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    XHAT_ROUND: tl.constexpr,
):
    """Stores y = xhat * w + b at ``offsets`` (``mask``): xc (BLOCK_M, C) fp32 centred rows,
    rstd (BLOCK_M,), xhat = xc * rstd rounded per XHAT_ROUND, w and b at ``cols`` (C,)."""
    y = _round_xhat(xc * rstd[:, None], XHAT_ROUND)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y + b[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _forward_rows_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    M,
    N,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    XHAT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if RMS:
        mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
        xc = x
    else:
        mean = _div_n(tl.sum(x, axis=1), N)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(mean_ptr + rows, mean, mask=row_mask)
    var = _div_n(tl.sum(xc * xc, axis=1), N)
    rstd = _rstd(var, eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    if CHUNK == BLOCK_N:  # y from the rows held in registers
        _scale_shift_store(xc, rstd, cols, col_mask, offsets, mask, w_ptr, b_ptr, y_ptr,
                           HAS_WEIGHT, HAS_BIAS, XHAT_ROUND)  # fmt: skip
    else:  # y in chunks of CHUNK columns, x read again: the rows just read (L1/L2)
        for start in range(0, BLOCK_N, CHUNK):
            part = start + tl.arange(0, CHUNK)
            part_cols = part < N
            part_mask = row_mask[:, None] & part_cols[None, :]
            part_offsets = rows[:, None] * N + part[None, :]
            x_part = tl.load(x_ptr + part_offsets, mask=part_mask, other=0.0).to(tl.float32)
            _scale_shift_store(x_part - mean[:, None], rstd, part, part_cols, part_offsets,
                               part_mask, w_ptr, b_ptr, y_ptr, HAS_WEIGHT, HAS_BIAS,
                               XHAT_ROUND)  # fmt: skip


@triton.jit
def _forward_loop_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    M,
    N,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    XHAT_ROUND: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * N
    y_row = y_ptr + row * N
    base = tl.arange(0, BLOCK_N)
    shift = 0.0 if RMS else tl.load(x_row).to(tl.float32)
    s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + base
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - shift, 0.0)
        s1 += d
        s2 += d * d
    m1 = _div_n(tl.sum(s1, axis=0), N)
    m2 = _div_n(tl.sum(s2, axis=0), N)
    if RMS:
        mean = 0.0
        var = m2
    else:
        mean = shift + m1
        var = tl.maximum(m2 - m1 * m1, 0.0)
        tl.store(mean_ptr + row, mean)
    rstd = _rstd(var, eps)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + base
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = _round_xhat((x - mean) * rstd, XHAT_ROUND)
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_rows_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    M,
    N,
    tiles,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    XHAT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for tile in range(pid, tiles, programs):
        # (int64 zeros + tile): 64-bit offsets whether tile is a tensor or, interpreted, an int
        rows = (tl.zeros([BLOCK_M], dtype=tl.int64) + tile) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :] if HAS_WEIGHT else dy
        c1 = _div_n(tl.sum(xhat * g, axis=1), N)
        if RMS:
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = _div_n(tl.sum(g, axis=1), N)
            dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * _round_xhat(xhat, XHAT_ROUND)
        db_acc += dy
    partial = pid.to(tl.int64) * N + cols
    if HAS_WEIGHT:
        tl.store(dw_ptr + partial, tl.sum(dw_acc, axis=0), mask=col_mask)
    if HAS_BIAS:
        tl.store(db_ptr + partial, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _backward_coeffs_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    c_ptr,
    M,
    N,
    HAS_WEIGHT: tl.constexpr,
    RMS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = tl.arange(0, BLOCK_N)
    rstd = tl.load(rstd_ptr + row)
    mean = 0.0 if RMS else tl.load(mean_ptr + row)
    s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + base
        mask = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) if HAS_WEIGHT else dy
        s1 += xhat * g
        s2 += g
    tl.store(c_ptr + row, _div_n(tl.sum(s1, axis=0), N))
    if RMS:
        tl.store(c_ptr + M + row, 0.0)
    else:
        tl.store(c_ptr + M + row, _div_n(tl.sum(s2, axis=0), N))


@triton.jit
def _backward_columns_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    c_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,
    M,
    N,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    XHAT_ROUND: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    group = tl.program_id(1)
    groups = tl.num_programs(1)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for row in range(group, M, groups):
        offsets = (tl.zeros([BLOCK_N], dtype=tl.int64) + row) * N + cols
        x = tl.load(x_ptr + offsets, mask=col_mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=col_mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd if RMS else tl.where(col_mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        g = dy * w if HAS_WEIGHT else dy
        c1 = tl.load(c_ptr + row)
        c2 = tl.load(c_ptr + M + row)
        dx = (g - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
        dw_acc += dy * _round_xhat(xhat, XHAT_ROUND)
        db_acc += dy
    partial = group.to(tl.int64) * N + cols
    if HAS_WEIGHT:
        tl.store(dw_ptr + partial, dw_acc, mask=col_mask)
    if HAS_BIAS:
        tl.store(db_ptr + partial, db_acc, mask=col_mask)


@triton.jit
def _column_sum_kernel(
    partial_ptr, out_ptr, out2_ptr, P, N, ROWS, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr
):
    # program (column block c, split s, matrix m) of partial (matrices, P, N): row s of out (m =
    # 0) or out2 (m = 1) at those columns = the sum of matrix m's rows [s * ROWS, min((s + 1) *
    # ROWS, P)), in a fixed order
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    split = tl.program_id(1)
    first = split * ROWS
    end = tl.minimum(first + ROWS, P)
    base = tl.program_id(2).to(tl.int64) * P * N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(first, end, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < end)[:, None] & col_mask[None, :]
        offsets = base + rows[:, None].to(tl.int64) * N + cols[None, :]
        acc += tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    out = split.to(tl.int64) * N + cols
    if tl.program_id(2) == 0:
        tl.store(out_ptr + out, total.to(out_ptr.dtype.element_ty), mask=col_mask)
    else:
        tl.store(out2_ptr + out, total.to(out2_ptr.dtype.element_ty), mask=col_mask)


# ------------------------------------------------------------------------------------------
# Launchers


def _register_tile(N: int, backward: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the register path for rows of N elements."""
    block_n = next_power_of_2(N)
    block_m = max(1, min(16, TILE_ELEMENTS // block_n))
    num_warps = max(1, min(MAX_WARPS, block_m * block_n // 256))
    if block_n > 8192:
        num_warps = min(32, block_n // 1024)
    elif backward and block_n == 8192:
        num_warps = BACKWARD_WARPS_8192
    return block_m, block_n, num_warps


def _forward_chunk(block_m: int, block_n: int, num_warps: int, itemsize: int) -> int:
    """CHUNK of the forward's register path (``_forward_rows_kernel``): BLOCK_N (y made from
    the rows held in registers), or, where x in its own dtype takes half the registers a
    thread may have (65536 a multiprocessor over the program's threads), two 16-byte vectors
    a thread: the second pass then reads x again in chunks of that many columns. At N = 32768
    fp32 (32 warps, 64 registers a thread) x, w and b at once spilled 24-64 bytes."""
    threads = 32 * num_warps
    x_registers = block_m * block_n // threads * itemsize // 4
    if x_registers < min(255, 65536 // threads) // 2:
        return block_n
    return min(block_n, threads * 2 * (16 // itemsize))


def _max_programs(device: torch.device) -> int:
    """How many partial rows (programs) the dweight/dbias reduction uses at most."""
    return programs_to_fill(device, 4, INTERPRETER_PROGRAMS)


def _column_sums(partial: torch.Tensor, dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    """Sums of ``partial`` (k, P, N) fp32 (k = 1 or 2 matrices, contiguous) over their rows, in
    a fixed order: a (N,) tensor of ``dtypes[m]`` for each matrix m. One launch (two past
    SPLIT_ROWS rows) for both matrices.

    More than SPLIT_ROWS rows are summed in two stages: programs over (64-column blocks, splits
    of SPLIT_ROWS rows, matrices) write one fp32 row per split, then one program per column
    block and matrix adds those. One stage over P = 4 x SMs rows (528 on an H100) ran N / 128
    programs a matrix (8 at N = 1024), each reading its 528 x 128 fp32 tile alone; two stages
    run (N / 64) x 9 programs a matrix, each on 64 rows. The order is fixed by the shapes: the
    same bits on every run."""
    k, P, N = partial.shape
    splits = cdiv(P, SPLIT_ROWS)
    if splits > 1:
        stage = _alloc.empty((k, splits, N), dtype=torch.float32, device=partial.device)
        grid = (cdiv(N, SPLIT_BLOCK_N), splits, k)
        _column_sum_kernel[grid](
            partial, stage[0], stage[k - 1], P, N, SPLIT_ROWS,
            BLOCK_P=min(32, SPLIT_ROWS), BLOCK_N=SPLIT_BLOCK_N,
        )  # fmt: skip
        partial, P = stage, splits
    sums = [_alloc.empty((N,), dtype=dtype, device=partial.device) for dtype in dtypes]
    block_p = min(32, next_power_of_2(P))
    block_n = min(max(128, TILE_ELEMENTS // block_p), next_power_of_2(N))
    grid = (cdiv(N, block_n), 1, k)
    _column_sum_kernel[grid](
        partial, sums[0], sums[k - 1], P, N, P, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4
    )
    return sums


def _column_sum(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Sum of ``partial`` (P, N) fp32 (contiguous) over its rows, in a fixed order, as a (N,)
    ``dtype`` (``_column_sums`` of one matrix)."""
    return _column_sums(partial[None], [dtype])[0]


def _forward(x, weight, bias, eps: float, rms: bool, out_dtype=None, xhat_dtype=None):
    M, N = x.shape
    y = _alloc.empty_like(x, dtype=out_dtype)
    mean = _alloc.empty((0 if rms else M,), dtype=torch.float32, device=x.device)
    rstd = _alloc.empty((M,), dtype=torch.float32, device=x.device)
    if M == 0:
        return y, mean, rstd
    flags = dict(
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        RMS=rms,
        XHAT_ROUND=_XHAT_ROUND[xhat_dtype],
    )
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    m = mean if not rms else rstd
    if MAX_FUSED_N_FORWARD >= N:
        block_m, block_n, warps = _register_tile(N)
        chunk = _forward_chunk(block_m, block_n, warps, x.element_size())
        _forward_rows_kernel[(cdiv(M, block_m),)](
            x, w, b, y, m, rstd, M, N, eps,
            BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=chunk, num_warps=warps, **flags,
        )  # fmt: skip
    else:
        _forward_loop_kernel[(M,)](
            x, w, b, y, m, rstd, M, N, eps, BLOCK_N=LOOP_BLOCK_N, num_warps=8, **flags
        )
    return y, mean, rstd


def _backward(dy, x, weight, bias, mean, rstd, rms: bool, xhat_dtype=None):
    M, N = x.shape
    dx = _alloc.empty_like(x)
    has_weight, has_bias = weight is not None, bias is not None
    dweight = dbias = None
    if M == 0:
        if has_weight:
            dweight = torch.zeros((N,), dtype=weight.dtype, device=x.device)
        if has_bias:
            dbias = torch.zeros((N,), dtype=bias.dtype, device=x.device)
        return dx, dweight, dbias
    flags = dict(HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, RMS=rms)
    rounding = dict(XHAT_ROUND=_XHAT_ROUND[xhat_dtype])
    w = weight if has_weight else x
    m = mean if not rms else rstd
    if N <= MAX_FUSED_N:
        block_m, block_n, warps = _register_tile(N, backward=True)
        tiles = cdiv(M, block_m)
        programs = min(tiles, _max_programs(x.device))
    else:
        programs = min(M, _max_programs(x.device))
    f32 = dict(dtype=torch.float32, device=x.device)
    # one fp32 partial row per program and parameter, dweight's then dbias's matrix in one
    # buffer (summed in one launch); an absent parameter's pointer is a dummy never touched
    matrices = has_weight + has_bias
    partials = _alloc.empty((matrices, programs, N), **f32) if matrices else None
    dw_partial = partials[0] if has_weight else dx
    db_partial = partials[-1] if has_bias else dx
    if N <= MAX_FUSED_N:
        _backward_rows_kernel[(programs,)](
            dy, x, w, m, rstd, dx, dw_partial, db_partial, M, N, tiles,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, **flags, **rounding,
        )  # fmt: skip
    else:
        coeffs = _alloc.empty((2, M), **f32)
        _backward_coeffs_kernel[(M,)](
            dy, x, w, m, rstd, coeffs, M, N,
            HAS_WEIGHT=has_weight, RMS=rms, BLOCK_N=LOOP_BLOCK_N, num_warps=8,
        )  # fmt: skip
        block_n = min(LOOP_BLOCK_N, 1024)
        grid = (cdiv(N, block_n), programs)
        _backward_columns_kernel[grid](
            dy, x, w, m, rstd, coeffs, dx, dw_partial, db_partial, M, N,
            BLOCK_N=block_n, num_warps=4, **flags, **rounding,
        )  # fmt: skip
    if matrices:
        sums = _column_sums(partials, [p.dtype for p in (weight, bias) if p is not None])
        dweight = sums[0] if has_weight else None
        dbias = sums[-1] if has_bias else None
    return dx, dweight, dbias


def layer_norm_forward(x, weight, bias, eps: float):
    """LayerNorm of the rows of x (M, N) contiguous fp16/bf16/fp32; weight, bias: (N,) or None
    (any float dtype). Returns y (M, N) in x's dtype, mean (M,) fp32, rstd (M,) fp32."""
    return _forward(x, weight, bias, eps, rms=False)


def layer_norm_backward(dy, x, weight, bias, mean, rstd):
    """dx (like x), dweight (like weight, or None), dbias (like bias, or None)."""
    return _backward(dy, x, weight, bias, mean, rstd, rms=False)


def rms_norm_forward(x, weight, eps: float, out_dtype=None, xhat_dtype=None):
    """RMSNorm of the rows of x (M, N); weight (N,) or None. Returns y (M, N) in out_dtype
    (default x's), xhat rounded to xhat_dtype (fp16/bf16; None: not rounded) before the weight
    multiply, and rstd (M,) fp32."""
    y, _, rstd = _forward(x, weight, None, eps, True, out_dtype, xhat_dtype)
    return y, rstd


def rms_norm_backward(dy, x, weight, rstd, xhat_dtype=None):
    """dx (like x) and dweight (like weight, or None); dy (M, N) in y's dtype."""
    dx, dweight, _ = _backward(dy, x, weight, None, None, rstd, True, xhat_dtype)
    return dx, dweight

"""Window attention Triton kernels (flash style): scores are never written to memory.

Layout: q, k, v, dout ``(Z, H, N, D)`` with any strides over (Z, H, N) and stride 1 over D;
out, dq, dk, dv contiguous; bias ``(H, N, N)`` and mask ``(nW, N, N)`` contiguous, read as they
are (window z reads ``mask[z % nW]``) and converted to fp32. Scores, softmax statistics and
every accumulator are fp32; the products P @ V, dS @ K... take P / dS in the input dtype, as
flash attention does.

Forward (``_forward_kernel``): one program per (window * head, query block) loops over key
blocks with an online softmax; it writes out and the row logsumexp (+inf for a row whose
scores are all -inf: its output is 0 and ``exp(s - lse)`` is 0 in the backward; NaN for a row
holding NaN or +inf, whose output is NaN as torch.softmax's).

Backward (``_backward_kernel``): one program per (head, key block, group g); it loops over the
windows ``g, g + G, ...`` and, per window, over query blocks, recomputing ``P = exp(S - lse)``
and accumulating dk, dv for its key block. The softmax backward's ``delta = rowsum(P dP)`` is
exact (not ``rowsum(dO * O)`` with O rounded to the input dtype, which flash attention uses and
which cost d_bias several bf16 ulps at d = 128). When one key block covers the window (N <=
block, Swin's 7x7 windows) the program holds whole rows: it takes delta from them and writes dq
too. Otherwise ``_backward_dq_kernel`` runs first (one program per window * head and query
block): one pass over the key blocks for delta, a second for dq. d_bias: each program adds its
dS into its own fp32 partial ``(G, H, N, N)`` (in registers when one query block covers the
window, else in its own region of the partial buffer); the partials are then summed over G in
one fixed order. No atomics: the same bits on every run.

Short windows (``short_window``: N <= 64, d <= 64, but for fp32 with 3-pass TF32 at d = 64
over 32 tokens, where they spill; Swin's 7 x 7): ``_short_forward_kernel``
and ``_short_backward_kernel``, one program per (image chunk, window position w, head h) on
grid dim 0, looping over the windows of its images that share ``bias[h] + mask[w]``; a
window-head's whole N x N score tile (padded to 16/32/64) stays on chip. The forward holds the
table in registers (loaded once per program); the backward makes one pass per window-head
(P recomputed once; dq, dk, dv written; dS added to the program's own fp32 d_bias partial,
partials (chunks * nW, H, N, N) summed in one fixed order) and re-reads the table from an fp32
copy the launcher pads to (block, block) with -inf (aligned loads, few registers). Where
inlined it spills (``CALL_PASS`` in SHORT_LAUNCHES: fp32 with 3-pass TF32 at Swin-T among
them) that pass is a function call, not inlined
(``_short_window_backward_call``): inlined into the window loop, LLVM hoisted the
loop-invariant shared-memory addresses of the products' operands (sm_90 wgmma descriptors,
about 100 registers) out of the loop and it spilled; as Triton 3.6 cannot return a tensor from
such a function, the call adds dS to the partial in memory (read-add-store per window,
L2-resident) rather than to a register tile. The cost: ptxas serializes every wgmma of a
kernel that makes a call (sm_90), hence inlined passes wherever one is spill-free.
fp32 products run on tensor cores with torch matmul's contract: TF32 where
``torch.backends.cuda.matmul`` allows it, else 3-pass TF32 (``_dot_options``).

Grids (blocked kernels): windows * heads (or heads) on dim 0, which takes up to 2^31 - 1
programs (Swin-B stage 1 at batch 256 has 65536 window-heads); dims 1 and 2, capped at 65535
by CUDA, carry the query / key blocks (at most 16) and the window groups (at most 65535,
``device.groups_to_fill``).
"""

from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.language as tl

from fusedops import _alloc
from fusedops._env import triton_interpreter
from fusedops.kernels.device import device_index, groups_to_fill, multiprocessors, tf32_allowed

#: Key/query block of the kernels; windows longer than this take several blocks.
MAX_BLOCK = 64
#: Windows of up to this many tokens (Swin's 7 x 7: 49, padded to 64) and head dims up to
#: SHORT_MAX_D take the short-window kernels: the whole score tile of a window-head on chip,
#: the windows of one (image chunk, window position, head) looped in one program, a one-pass
#: backward. Longer windows (12 x 12: 144) and d = 128 keep the blocked kernels.
SHORT_BLOCK = 64
SHORT_MAX_D = 64
#: The blocked kernels' launches (windows longer than SHORT_BLOCK, or d > SHORT_MAX_D), keyed by
#: (kernel, products, d) with products "16-bit" (fp16/bf16 inputs), "tf32" (fp32, TF32 allowed)
#: or "tf32x3" (fp32, TF32 off): (largest query block, largest key block, warps, pipelining
#: depth). Chosen from an sm_90 compile of every (32 or 64, 32 or 64, 4 or 8 warps, 1-3 stages)
#: and, for the (kernel, products, d) where all of those spill, a second tier with a 16-token
#: block on one side or both and 2-8 warps (``triton_static.second_tier``), at 144-token
#: windows, aligned as Triton's launcher specializes aligned tensors (16-bit: the worse of bias
#: and mask in the inputs' dtype and in fp32, as under autocast)
#: (``python benchmarks/triton_static.py --sweep``, Triton 3.9): among the spill-free ones
#: within an H100 block's shared memory, the most warps resident per SM (up to 16), then the
#: larger tiles, then the deeper pipeline, then fewer warps a CTA (``triton_static.pick``). The
#: blocks used before (64 x 64, 4 warps, 3 stages) spilled 24-4,196 B a thread in 15 of these 36
#: launches, every backward among them; the first tier's picks in 2 (fp32 3-pass TF32, d = 128);
#: with the second tier none does (``SPILLING`` is empty).
#: tests/test_window_attention_static.py checks this table against the committed sweep and every
#: launch the dispatch can make against an H100's shared memory.
LONG_LAUNCHES = {
    ("_forward_kernel", "16-bit", 16): (64, 64, 8, 3),
    ("_forward_kernel", "16-bit", 32): (64, 64, 8, 3),
    ("_forward_kernel", "16-bit", 64): (64, 64, 8, 2),
    ("_forward_kernel", "16-bit", 128): (32, 32, 8, 3),
    ("_forward_kernel", "tf32", 16): (64, 64, 8, 1),
    ("_forward_kernel", "tf32", 32): (64, 64, 8, 1),
    ("_forward_kernel", "tf32", 64): (32, 32, 8, 3),
    ("_forward_kernel", "tf32", 128): (32, 32, 8, 3),
    ("_forward_kernel", "tf32x3", 16): (32, 32, 4, 3),
    ("_forward_kernel", "tf32x3", 32): (64, 64, 8, 3),
    ("_forward_kernel", "tf32x3", 64): (32, 32, 4, 3),
    ("_forward_kernel", "tf32x3", 128): (32, 32, 8, 3),
    ("_backward_kernel", "16-bit", 16): (32, 64, 4, 1),
    ("_backward_kernel", "16-bit", 32): (32, 64, 8, 1),
    ("_backward_kernel", "16-bit", 64): (32, 32, 8, 1),
    ("_backward_kernel", "16-bit", 128): (32, 64, 8, 3),
    ("_backward_kernel", "tf32", 16): (32, 64, 8, 1),
    ("_backward_kernel", "tf32", 32): (32, 64, 8, 1),
    ("_backward_kernel", "tf32", 64): (32, 64, 8, 3),
    ("_backward_kernel", "tf32", 128): (32, 64, 8, 1),
    ("_backward_kernel", "tf32x3", 16): (32, 64, 8, 3),
    ("_backward_kernel", "tf32x3", 32): (32, 64, 8, 2),
    ("_backward_kernel", "tf32x3", 64): (32, 32, 8, 1),
    ("_backward_kernel", "tf32x3", 128): (16, 32, 8, 1),
    ("_backward_dq_kernel", "16-bit", 16): (64, 64, 8, 3),
    ("_backward_dq_kernel", "16-bit", 32): (64, 64, 8, 2),
    ("_backward_dq_kernel", "16-bit", 64): (64, 64, 8, 2),
    ("_backward_dq_kernel", "16-bit", 128): (64, 32, 4, 1),
    ("_backward_dq_kernel", "tf32", 16): (64, 64, 8, 3),
    ("_backward_dq_kernel", "tf32", 32): (64, 64, 8, 2),
    ("_backward_dq_kernel", "tf32", 64): (64, 32, 4, 1),
    ("_backward_dq_kernel", "tf32", 128): (32, 64, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 16): (64, 32, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 32): (64, 64, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 64): (64, 32, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 128): (16, 32, 8, 2),
}
#: The (kernel, products, d) of LONG_LAUNCHES with no spill-free candidate in the sweep: none
#: since the sweep's second tier (16-token blocks, 2-8 warps, compiled where every first-tier
#: candidate spills, ``triton_static.second_tier``) gave fp32 with 3-pass TF32 at d = 128
#: spill-free launches; its first-tier picks spilled 344 B (backward) and 144 B (dq) a thread.
SPILLING: set = set()
#: LONG_LAUNCHES for GPUs of compute capability 8.x (A100: 164 KiB of shared memory an SM, a
#: block up to 163 KiB), picked by the same rule from an sm_80 sweep
#: (``python benchmarks/triton_static.py --arch 80 --sweep --csv
#: benchmarks/results/triton_sweep_window_attention_sm80.csv``). On sm_80 the sm_90 table's
#: launches spill in 11 of the 36 (8-460 B a thread) and its fp32 d = 128 dq launch with TF32
#: (196,608 B) would not launch; these spill in none (``SPILLING_SM80``: the first tier's picks
#: spilled in 2).
LONG_LAUNCHES_SM80 = {
    ("_forward_kernel", "16-bit", 16): (64, 64, 8, 3),
    ("_forward_kernel", "16-bit", 32): (32, 32, 4, 3),
    ("_forward_kernel", "16-bit", 64): (32, 32, 4, 3),
    ("_forward_kernel", "16-bit", 128): (32, 32, 8, 3),
    ("_forward_kernel", "tf32", 16): (64, 64, 8, 2),
    ("_forward_kernel", "tf32", 32): (32, 32, 4, 3),
    ("_forward_kernel", "tf32", 64): (32, 32, 8, 3),
    ("_forward_kernel", "tf32", 128): (32, 32, 8, 2),
    ("_forward_kernel", "tf32x3", 16): (32, 32, 4, 3),
    ("_forward_kernel", "tf32x3", 32): (32, 32, 4, 3),
    ("_forward_kernel", "tf32x3", 64): (32, 32, 4, 2),
    ("_forward_kernel", "tf32x3", 128): (32, 32, 8, 3),
    ("_backward_kernel", "16-bit", 16): (32, 32, 4, 1),
    ("_backward_kernel", "16-bit", 32): (32, 32, 4, 1),
    ("_backward_kernel", "16-bit", 64): (32, 32, 8, 2),
    ("_backward_kernel", "16-bit", 128): (64, 32, 8, 2),
    ("_backward_kernel", "tf32", 16): (32, 32, 4, 1),
    ("_backward_kernel", "tf32", 32): (64, 32, 8, 2),
    ("_backward_kernel", "tf32", 64): (64, 32, 8, 3),
    ("_backward_kernel", "tf32", 128): (32, 32, 8, 3),
    ("_backward_kernel", "tf32x3", 16): (32, 64, 8, 1),
    ("_backward_kernel", "tf32x3", 32): (16, 16, 4, 2),
    ("_backward_kernel", "tf32x3", 64): (32, 32, 8, 2),
    ("_backward_kernel", "tf32x3", 128): (16, 32, 8, 1),
    ("_backward_dq_kernel", "16-bit", 16): (32, 64, 4, 3),
    ("_backward_dq_kernel", "16-bit", 32): (64, 32, 8, 3),
    ("_backward_dq_kernel", "16-bit", 64): (32, 64, 8, 3),
    ("_backward_dq_kernel", "16-bit", 128): (32, 64, 8, 2),
    ("_backward_dq_kernel", "tf32", 16): (32, 64, 8, 3),
    ("_backward_dq_kernel", "tf32", 32): (64, 32, 8, 3),
    ("_backward_dq_kernel", "tf32", 64): (32, 64, 8, 2),
    ("_backward_dq_kernel", "tf32", 128): (64, 32, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 16): (64, 32, 4, 2),
    ("_backward_dq_kernel", "tf32x3", 32): (64, 32, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 64): (32, 64, 8, 3),
    ("_backward_dq_kernel", "tf32x3", 128): (32, 64, 8, 1),
}
#: LONG_LAUNCHES_SM80's launches with no spill-free candidate: none since the second tier (as
#: SPILLING); the first tier's fp32 3-pass TF32 backward picks spilled 12 B (d = 32) and 264 B
#: (d = 128) a thread.
SPILLING_SM80: set = set()
#: The short-window kernels' launches, keyed by (kernel, products, d, block) with block the
#: padded window (16, 32 or 64 tokens): (warps, CALL_PASS: the backward's per-window pass a
#: function call rather than inlined). Chosen from an sm_90 compile of every (2, 4 or 8 warps,
#: pass inlined or a call) with N marked divisible by 16 and not (Swin's 49 is not, 64 is), each
#: candidate counted by its worse case (``python benchmarks/triton_static.py --sweep-short``,
#: Triton 3.9): among the spill-free ones an inlined pass first (a call serializes every wgmma
#: of the kernel on sm_90), then the most warps resident per SM (up to 16), then fewer warps a
#: CTA (``triton_static.short_picks``). Before, 2 warps below 64 tokens and 4 at 64, the pass a
#: call exactly for fp32 with 3-pass TF32: the fp32 and d = 64 launches among them spilled.
SHORT_KERNELS = ("_short_forward_kernel", "_short_backward_kernel")
SHORT_LAUNCHES = {
    ("_short_forward_kernel", "16-bit", 16, 16): (2, False),
    ("_short_forward_kernel", "16-bit", 16, 32): (2, False),
    ("_short_forward_kernel", "16-bit", 16, 64): (4, False),
    ("_short_forward_kernel", "16-bit", 32, 16): (2, False),
    ("_short_forward_kernel", "16-bit", 32, 32): (2, False),
    ("_short_forward_kernel", "16-bit", 32, 64): (4, False),
    ("_short_forward_kernel", "16-bit", 64, 16): (2, False),
    ("_short_forward_kernel", "16-bit", 64, 32): (4, False),
    ("_short_forward_kernel", "16-bit", 64, 64): (8, False),
    ("_short_forward_kernel", "tf32", 16, 16): (2, False),
    ("_short_forward_kernel", "tf32", 16, 32): (2, False),
    ("_short_forward_kernel", "tf32", 16, 64): (4, False),
    ("_short_forward_kernel", "tf32", 32, 16): (2, False),
    ("_short_forward_kernel", "tf32", 32, 32): (4, False),
    ("_short_forward_kernel", "tf32", 32, 64): (8, False),
    ("_short_forward_kernel", "tf32", 64, 16): (2, False),
    ("_short_forward_kernel", "tf32", 64, 32): (4, False),
    ("_short_forward_kernel", "tf32", 64, 64): (4, False),
    ("_short_forward_kernel", "tf32x3", 16, 16): (2, False),
    ("_short_forward_kernel", "tf32x3", 16, 32): (4, False),
    ("_short_forward_kernel", "tf32x3", 16, 64): (4, False),
    ("_short_forward_kernel", "tf32x3", 32, 16): (2, False),
    ("_short_forward_kernel", "tf32x3", 32, 32): (4, False),
    ("_short_forward_kernel", "tf32x3", 32, 64): (4, False),
    ("_short_forward_kernel", "tf32x3", 64, 16): (8, False),
    ("_short_forward_kernel", "tf32x3", 64, 32): (4, False),
    ("_short_forward_kernel", "tf32x3", 64, 64): (8, False),
    ("_short_backward_kernel", "16-bit", 16, 16): (2, False),
    ("_short_backward_kernel", "16-bit", 16, 32): (2, False),
    ("_short_backward_kernel", "16-bit", 16, 64): (4, False),
    ("_short_backward_kernel", "16-bit", 32, 16): (2, False),
    ("_short_backward_kernel", "16-bit", 32, 32): (2, False),
    ("_short_backward_kernel", "16-bit", 32, 64): (4, False),
    ("_short_backward_kernel", "16-bit", 64, 16): (2, False),
    ("_short_backward_kernel", "16-bit", 64, 32): (8, False),
    ("_short_backward_kernel", "16-bit", 64, 64): (4, False),
    ("_short_backward_kernel", "tf32", 16, 16): (2, False),
    ("_short_backward_kernel", "tf32", 16, 32): (2, False),
    ("_short_backward_kernel", "tf32", 16, 64): (4, False),
    ("_short_backward_kernel", "tf32", 32, 16): (2, False),
    ("_short_backward_kernel", "tf32", 32, 32): (2, False),
    ("_short_backward_kernel", "tf32", 32, 64): (4, False),
    ("_short_backward_kernel", "tf32", 64, 16): (4, False),
    ("_short_backward_kernel", "tf32", 64, 32): (4, False),
    ("_short_backward_kernel", "tf32", 64, 64): (8, True),
    ("_short_backward_kernel", "tf32x3", 16, 16): (2, False),
    ("_short_backward_kernel", "tf32x3", 16, 32): (2, False),
    ("_short_backward_kernel", "tf32x3", 16, 64): (4, True),
    ("_short_backward_kernel", "tf32x3", 32, 16): (4, False),
    ("_short_backward_kernel", "tf32x3", 32, 32): (2, False),
    ("_short_backward_kernel", "tf32x3", 32, 64): (4, True),
    ("_short_backward_kernel", "tf32x3", 64, 16): (2, False),
    ("_short_backward_kernel", "tf32x3", 64, 32): (8, False),
    ("_short_backward_kernel", "tf32x3", 64, 64): (4, True),
}
#: Short launches with no spill-free candidate: fp32 with 3-pass TF32 at d = 64 over 32 tokens
#: (152 B forward, 16 B backward a thread). Those windows take the blocked kernels
#: (``short_window``), spill-free there.
SHORT_SPILLING = {
    ("_short_forward_kernel", "tf32x3", 64, 64),
    ("_short_backward_kernel", "tf32x3", 64, 64),
}
#: Programs the backward aims for per SM (their windows loop inside; untuned: no GPU yet).
PROGRAMS_PER_SM = 8
#: Window groups G of a CPU (interpreter) run: small, but more than one.
INTERPRETER_GROUPS = 2


@triton.jit
def _load_rows(base, rows, stride_n, N, D: tl.constexpr):
    """Rows ``rows`` (masked to < N, zero elsewhere) of a (N, D) slice with row stride
    ``stride_n`` and unit column stride."""
    cols = tl.arange(0, D)
    return tl.load(
        base + rows[:, None] * stride_n + cols[None, :], mask=(rows < N)[:, None], other=0.0
    )


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` with fp32 accumulation. UPCAST: operands converted to fp32 first (exact for
    bf16 values; Triton's CPU interpreter multiplies bf16 operands' raw bits otherwise)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _tf32_round(x):
    """fp32 tile x rounded to TF32 (11 significant bits), to nearest with ties away from zero
    (PTX's cvt.rna.tf32.f32, written in integer operations so the CPU interpreter runs it)."""
    return ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _tf32_split(x):
    """(hi, lo) of an fp32 tile as Triton's ``"tf32x3"`` splits it: hi = x rounded to TF32,
    lo = x - hi rounded to TF32 (|lo| <= 2^-11 |x|; an infinite x gives a NaN lo)."""
    hi = _tf32_round(x)
    return hi, _tf32_round(x - hi)


@triton.jit
def _dot_split(a_hi, a_lo, b_hi, b_lo):
    """``a @ b`` (fp32) from split operands (``_tf32_split``) in three TF32 products,
    ``a_lo b_lo`` left out: Triton's ``"tf32x3"`` (each term within about 2^-21 of its fp32
    value) with each operand split once however many products take it. Ordered so that each
    operand's products are adjacent (b_lo, then a_hi, then b_hi, then a_lo: one operand live
    across each step; on sm_80, where every warp holds all of b, Triton's order ``a_lo b_hi,
    a_hi b_lo, a_hi b_hi`` cost the short backward 580 B/thread of spills at Swin-T)."""
    acc = tl.dot(a_hi, b_lo, input_precision="tf32")
    acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
    return tl.dot(a_lo, b_hi, acc, input_precision="tf32")


@triton.jit
def _scores(
    q,
    k,
    bias_base,
    mask_base,
    rows,
    cols,
    N,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """fp32 tile ``q k^T * scale + bias + mask`` for query rows x key cols; -inf at cols >= N."""
    s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
    inside = (rows < N)[:, None] & (cols < N)[None, :]
    offsets = rows[:, None] * N + cols[None, :]
    if HAS_BIAS:
        s += tl.load(bias_base + offsets, mask=inside, other=0.0).to(tl.float32)
    if HAS_MASK:
        s += tl.load(mask_base + offsets, mask=inside, other=0.0).to(tl.float32)
    return tl.where((cols < N)[None, :], s, float("-inf"))


@triton.jit
def _probs(
    q,
    k,
    v,
    do,
    lse,
    bias_base,
    mask_base,
    rows,
    cols,
    N,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """``P = exp(S - lse)`` and ``dP = dO V^T`` (fp32) for query rows x key cols."""
    s = _scores(
        q, k, bias_base, mask_base, rows, cols, N, scale, HAS_BIAS, HAS_MASK, PRECISION, UPCAST
    )
    return tl.exp(s - lse[:, None]), _dot(do, tl.trans(v), PRECISION, UPCAST)


@triton.jit
def _forward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    mask_ptr,
    out_ptr,
    lse_ptr,
    sqz,
    sqh,
    sqn,
    skz,
    skh,
    skn,
    svz,
    svh,
    svn,
    H,
    N,
    num_masks,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    zh = tl.program_id(0).to(tl.int64)  # window * head on grid dim 0: up to 2^31 - 1
    z = zh // H
    h = zh % H
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(q_ptr + z * sqz + h * sqh, rows, sqn, N, D)
    k_base = k_ptr + z * skz + h * skh
    v_base = v_ptr + z * svz + h * svh
    bias_base = bias_ptr + h * N * N
    mask_base = mask_ptr + (z % num_masks) * N * N
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, cols, skn, N, D)
        v = _load_rows(v_base, cols, svn, N, D)
        s = _scores(
            q, k, bias_base, mask_base, rows, cols, N, scale, HAS_BIAS, HAS_MASK, PRECISION, UPCAST
        )
        new_max = tl.maximum(row_max, tl.max(s, axis=1))  # skips NaN: it shows in total
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # all -inf so far: no NaN
        alpha = tl.exp(row_max - shift)
        p = tl.exp(s - shift[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        row_max = new_max
    # fully masked: every score -inf (the row max, NaN counted, is -inf): output 0, lse +inf; a
    # NaN or +inf score makes total NaN, hence the row's output and lse NaN, as torch.softmax
    masked = (row_max == float("-inf")) & (total == total)
    total = tl.where(masked, 1.0, total)
    out = acc / total[:, None]
    lse = tl.where(masked, float("inf"), row_max + tl.log(total))
    row_ok = rows < N
    out_rows = zh * N + rows
    cols_d = tl.arange(0, D)
    tl.store(
        out_ptr + out_rows[:, None] * D + cols_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    tl.store(lse_ptr + out_rows, lse, mask=row_ok)


@triton.jit
def _backward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    mask_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    dbias_ptr,
    sqz,
    sqh,
    sqn,
    skz,
    skh,
    skn,
    svz,
    svh,
    svn,
    sdz,
    sdh,
    sdn,
    Z,
    H,
    N,
    num_masks,
    groups,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    ONE_KEY_BLOCK: tl.constexpr,
    ONE_QUERY_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    h = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = tl.program_id(2)
    cols_d = tl.arange(0, D)
    col_ok = cols < N
    bias_base = bias_ptr + h * N * N
    # this program's own fp32 partial of d_bias: (G, H, N, N)[g, h]
    partial_base = dbias_ptr + (g * H + h) * N * N
    dbias_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for z in range(g, Z, groups):
        z64 = tl.cast(z, tl.int64)  # 64-bit offsets (z is an int when interpreted)
        zh = z64 * H + h
        k = _load_rows(k_ptr + z64 * skz + h * skh, cols, skn, N, D)
        v = _load_rows(v_ptr + z64 * svz + h * svh, cols, svn, N, D)
        mask_base = mask_ptr + (z64 % num_masks) * N * N
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        for start in range(0, N, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            q = _load_rows(q_ptr + z64 * sqz + h * sqh, rows, sqn, N, D)
            do = _load_rows(do_ptr + z64 * sdz + h * sdh, rows, sdn, N, D)
            lse = tl.load(lse_ptr + zh * N + rows, mask=rows < N, other=float("inf"))
            p, dp = _probs(
                q,
                k,
                v,
                do,
                lse,
                bias_base,
                mask_base,
                rows,
                cols,
                N,
                scale,
                HAS_BIAS,
                HAS_MASK,
                PRECISION,
                UPCAST,
            )
            if ONE_KEY_BLOCK:  # every key of these rows is here: rowsum(P dP), exactly
                delta = tl.sum(p * dp, axis=1)
            else:  # written by _backward_dq_kernel, which ran first
                delta = tl.load(delta_ptr + zh * N + rows, mask=rows < N, other=0.0)
            ds = p * (dp - delta[:, None])
            dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
            dk += _dot(tl.trans(ds.to(q.dtype)), q, PRECISION, UPCAST)
            if ONE_KEY_BLOCK:  # this program sees every key of these rows: dq is complete
                dq = _dot(ds.to(k.dtype), k, PRECISION, UPCAST) * scale
                tl.store(
                    dq_ptr + (zh * N + rows)[:, None] * D + cols_d[None, :],
                    dq.to(dq_ptr.dtype.element_ty),
                    mask=(rows < N)[:, None],
                )
            if BIAS_GRAD:
                if ONE_QUERY_BLOCK:
                    dbias_acc += ds
                else:
                    tile = partial_base + rows[:, None] * N + cols[None, :]
                    inside = (rows < N)[:, None] & col_ok[None, :]
                    tl.store(tile, tl.load(tile, mask=inside, other=0.0) + ds, mask=inside)
        out_cols = (zh * N + cols)[:, None] * D + cols_d[None, :]
        tl.store(dk_ptr + out_cols, (dk * scale).to(dk_ptr.dtype.element_ty), mask=col_ok[:, None])
        tl.store(dv_ptr + out_cols, dv.to(dv_ptr.dtype.element_ty), mask=col_ok[:, None])
    if BIAS_GRAD and ONE_QUERY_BLOCK:
        rows = tl.arange(0, BLOCK_M)
        tl.store(
            partial_base + rows[:, None] * N + cols[None, :],
            dbias_acc,
            mask=(rows < N)[:, None] & col_ok[None, :],
        )


@triton.jit
def _backward_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    mask_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    sqz,
    sqh,
    sqn,
    skz,
    skh,
    skn,
    svz,
    svh,
    svn,
    sdz,
    sdh,
    sdn,
    H,
    N,
    num_masks,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    zh = tl.program_id(0).to(tl.int64)  # window * head on grid dim 0: up to 2^31 - 1
    z = zh // H
    h = zh % H
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(q_ptr + z * sqz + h * sqh, rows, sqn, N, D)
    do = _load_rows(do_ptr + z * sdz + h * sdh, rows, sdn, N, D)
    lse = tl.load(lse_ptr + zh * N + rows, mask=rows < N, other=float("inf"))
    bias_base = bias_ptr + h * N * N
    mask_base = mask_ptr + (z % num_masks) * N * N
    k_base = k_ptr + z * skz + h * skh
    v_base = v_ptr + z * svz + h * svh
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    # phase 0: delta = rowsum(P dP) over every key block (exact, unlike rowsum(dO * O) with O
    # rounded to the input dtype), stored for the dk/dv kernel; phase 1: dq
    for phase in tl.static_range(2):
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            k = _load_rows(k_base, cols, skn, N, D)
            v = _load_rows(v_base, cols, svn, N, D)
            p, dp = _probs(
                q,
                k,
                v,
                do,
                lse,
                bias_base,
                mask_base,
                rows,
                cols,
                N,
                scale,
                HAS_BIAS,
                HAS_MASK,
                PRECISION,
                UPCAST,
            )
            if phase == 0:
                delta += tl.sum(p * dp, axis=1)
            else:
                dq += _dot((p * (dp - delta[:, None])).to(k.dtype), k, PRECISION, UPCAST)
        if phase == 0:
            tl.store(delta_ptr + zh * N + rows, delta, mask=rows < N)
    cols_d = tl.arange(0, D)
    tl.store(
        dq_ptr + (zh * N + rows)[:, None] * D + cols_d[None, :],
        (dq * scale).to(dq_ptr.dtype.element_ty),
        mask=(rows < N)[:, None],
    )


# ------------------------------------------------------------------------------------------
# Short windows (N <= SHORT_BLOCK, Swin's 7 x 7): the whole N x N score tile in registers.


@triton.jit
def _table_tile(base, rows, cols, N):
    """fp32 (rows x cols) tile of an (N, N) table at ``base``, zero outside it."""
    inside = (rows < N)[:, None] & (cols < N)[None, :]
    return tl.load(base + rows[:, None] * N + cols[None, :], mask=inside, other=0.0).to(tl.float32)


@triton.jit
def _short_table(
    bias_ptr,
    mask_ptr,
    h,
    w,
    rows,
    N,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """What every window of head h at window position w adds to its scores: ``bias[h] +
    mask[w]`` (zeros for an absent one), fp32 (BLOCK, BLOCK), -inf in the padding columns."""
    table = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    if HAS_BIAS:
        table += _table_tile(bias_ptr + h * N * N, rows, rows, N)
    if HAS_MASK:
        table += _table_tile(mask_ptr + w * N * N, rows, rows, N)
    return tl.where((rows < N)[None, :], table, float("-inf"))


@triton.jit
def _short_forward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    mask_ptr,
    out_ptr,
    lse_ptr,
    sqz,
    sqh,
    sqn,
    skz,
    skh,
    skn,
    svz,
    svh,
    svn,
    images,
    H,
    N,
    num_masks,
    per_program,
    scale,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # program (chunk, w, h) on grid dim 0: head h of window position w (the windows sharing
    # bias[h] + mask[w]) in the images of its chunk
    pid = tl.program_id(0).to(tl.int64)
    h = pid % H
    w = pid // H % num_masks
    first = pid // H // num_masks * per_program
    rows = tl.arange(0, BLOCK)
    cols_d = tl.arange(0, D)
    table = _short_table(bias_ptr, mask_ptr, h, w, rows, N, HAS_BIAS, HAS_MASK, BLOCK)
    for image in range(first, tl.minimum(first + per_program, images)):
        z64 = tl.cast(image, tl.int64) * num_masks + w  # 64-bit offsets
        q = _load_rows(q_ptr + z64 * sqz + h * sqh, rows, sqn, N, D)
        k = _load_rows(k_ptr + z64 * skz + h * skh, rows, skn, N, D)
        v = _load_rows(v_ptr + z64 * svz + h * svh, rows, svn, N, D)
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale + table
        row_max = tl.max(s, axis=1)  # skips NaN: it shows in total
        shift = tl.where(row_max == float("-inf"), 0.0, row_max)  # all -inf: no NaN
        p = tl.exp(s - shift[:, None])
        total = tl.sum(p, axis=1)
        # fully masked (every score -inf): output 0, lse +inf; a NaN or +inf score makes total
        # NaN, hence the row's output and lse NaN, as torch.softmax
        masked = (row_max == float("-inf")) & (total == total)
        total = tl.where(masked, 1.0, total)
        out = _dot(p.to(v.dtype), v, PRECISION, UPCAST) / total[:, None]
        lse = tl.where(masked, float("inf"), row_max + tl.log(total))
        out_rows = (z64 * H + h) * N + rows
        tl.store(
            out_ptr + out_rows[:, None] * D + cols_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=(rows < N)[:, None],
        )
        tl.store(lse_ptr + out_rows, lse, mask=rows < N)


@triton.jit
def _short_window_backward(
    q_base,
    k_base,
    v_base,
    do_base,
    lse_ptr,
    table_base,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    zh,
    sqn,
    skn,
    svn,
    sdn,
    N,
    scale,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Window-head ``zh`` of ``_short_backward_kernel``: dq, dk, dv of its N rows (inputs at
    the ``*_base`` pointers with row strides ``s?n``; gradients contiguous (Z, H, N, D) at
    ``d?_ptr``) stored; returns its fp32 dS (BLOCK, BLOCK) for the d_bias partial."""
    rows = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + zh * N + rows, mask=rows < N, other=float("inf"))
    out = (zh * N + rows)[:, None] * D + tl.arange(0, D)[None, :]
    row_ok = (rows < N)[:, None]
    # Fewer tiles live at once: each input loaded where it is used (again where used twice:
    # L1-resident), each gradient stored as soon as it is made.
    if PRECISION == "tf32x3":
        # fp32 products as three TF32 ones from operands split here (Triton's own "tf32x3"
        # splits per product, ds twice: 1,668 B/thread of spills on sm_90 and 28,548 B on sm_80
        # at N = 49, d = 32 with Triton 3.9); do, q and k re-read and split again where a
        # second product takes them rather than held
        q_hi, q_lo = _tf32_split(_load_rows(q_base, rows, sqn, N, D))
        k_hi, k_lo = _tf32_split(_load_rows(k_base, rows, skn, N, D))
        s = _dot_split(q_hi, q_lo, tl.trans(k_hi), tl.trans(k_lo)) * scale
        p = tl.exp(s + tl.load(table_base + rows[:, None] * BLOCK + rows[None, :]) - lse[:, None])
        do_hi, do_lo = _tf32_split(_load_rows(do_base, rows, sdn, N, D))
        p_hi, p_lo = _tf32_split(tl.trans(p))
        dv = _dot_split(p_hi, p_lo, do_hi, do_lo)
        tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=row_ok)
        do_hi, do_lo = _tf32_split(_load_rows(do_base, rows, sdn, N, D))
        v_hi, v_lo = _tf32_split(tl.trans(_load_rows(v_base, rows, svn, N, D)))
        dp = _dot_split(do_hi, do_lo, v_hi, v_lo)
    else:
        q = _load_rows(q_base, rows, sqn, N, D)
        k = _load_rows(k_base, rows, skn, N, D)
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
        p = tl.exp(s + tl.load(table_base + rows[:, None] * BLOCK + rows[None, :]) - lse[:, None])
        do = _load_rows(do_base, rows, sdn, N, D)
        dv = _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
        tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=row_ok)
        dp = _dot(do, tl.trans(_load_rows(v_base, rows, svn, N, D)), PRECISION, UPCAST)
    # every key of these rows is here: the softmax backward's rowsum(P dP), exactly
    ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])
    if PRECISION == "tf32x3":
        ds_hi, ds_lo = _tf32_split(ds)
        k_hi, k_lo = _tf32_split(_load_rows(k_base, rows, skn, N, D))
        dq = _dot_split(ds_hi, ds_lo, k_hi, k_lo) * scale
        tl.store(dq_ptr + out, dq.to(dq_ptr.dtype.element_ty), mask=row_ok)
        q_hi, q_lo = _tf32_split(_load_rows(q_base, rows, sqn, N, D))
        dk = _dot_split(tl.trans(ds_hi), tl.trans(ds_lo), q_hi, q_lo) * scale
        ds = ds_hi + ds_lo  # ds exactly, for d_bias: ds itself is dead by now
    else:
        ds_in = ds.to(q.dtype)
        k = _load_rows(k_base, rows, skn, N, D)
        dq = _dot(ds_in, k, PRECISION, UPCAST) * scale
        tl.store(dq_ptr + out, dq.to(dq_ptr.dtype.element_ty), mask=row_ok)
        q = _load_rows(q_base, rows, sqn, N, D)
        dk = _dot(tl.trans(ds_in), q, PRECISION, UPCAST) * scale
    tl.store(dk_ptr + out, dk.to(dk_ptr.dtype.element_ty), mask=row_ok)
    return ds


# The parameters of _short_window_backward with the d_bias partial's, kept compact.
# fmt: off
@triton.jit(noinline=True)
def _short_window_backward_call(
    q_base, k_base, v_base, do_base, lse_ptr, table_base, dq_ptr, dk_ptr, dv_ptr, zh,
    dbias_base, accumulate, sqn, skn, svn, sdn, N, scale, BIAS_GRAD: tl.constexpr,
    BLOCK: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # fmt: on
    """``_short_window_backward`` as a function call (not inlined), its dS added to the fp32
    (N, N) d_bias partial at ``dbias_base`` with BIAS_GRAD (stored there if not
    ``accumulate``: the program's first window). Inlined into the caller's window loop, the
    fp32 tf32x3 pass spilled: LLVM hoisted the products' loop-invariant shared-memory
    descriptors out of the loop (sm_90: ~100 registers held across it). Returns nothing:
    Triton 3.6 cannot return a tensor from a function that is not inlined."""
    ds = _short_window_backward(
        q_base, k_base, v_base, do_base, lse_ptr, table_base, dq_ptr, dk_ptr, dv_ptr, zh,
        sqn, skn, svn, sdn, N, scale, BLOCK, D, PRECISION, UPCAST,
    )  # fmt: skip
    if BIAS_GRAD:  # read-add-store of the program's partial: the sums a register tile made
        rows = tl.arange(0, BLOCK)
        tile = dbias_base + rows[:, None] * N + rows[None, :]
        inside = (rows < N)[:, None] & (rows < N)[None, :]
        tl.debug_barrier()  # the previous window's store seen by every thread of the CTA
        ds += tl.load(tile, mask=tl.where(accumulate, inside, False), other=0.0)
        tl.store(tile, ds, mask=inside)


@triton.jit
def _short_backward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    do_ptr,
    lse_ptr,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    dbias_ptr,
    sqz,
    sqh,
    sqn,
    skz,
    skh,
    skn,
    svz,
    svh,
    svn,
    sdz,
    sdh,
    sdn,
    images,
    H,
    N,
    num_masks,
    per_program,
    scale,
    BIAS_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    CALL_PASS: tl.constexpr = False,
):
    # program (chunk, w, h) on grid dim 0: head h of window position w (the windows sharing
    # bias[h] + mask[w]) in the images of its chunk
    pid = tl.program_id(0).to(tl.int64)
    h = pid % H
    w = pid // H % num_masks
    first = pid // H // num_masks * per_program
    # bias[h] + mask[w] as the launcher padded it (-inf outside the window): re-read per
    # window (held in registers it costs 32 more per thread, and spills)
    table_base = table_ptr + (w * H + h) * BLOCK * BLOCK
    partial = dbias_ptr + pid * N * N  # this program's own fp32 partial (chunks, nW, H, N, N)
    rows = tl.arange(0, BLOCK)
    dbias = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)  # CALL_PASS: the partial in memory
    for image in range(first, tl.minimum(first + per_program, images)):
        z64 = tl.cast(image, tl.int64) * num_masks + w
        zh = z64 * H + h
        q_base = q_ptr + z64 * sqz + h * sqh
        k_base = k_ptr + z64 * skz + h * skh
        v_base = v_ptr + z64 * svz + h * svh
        do_base = do_ptr + z64 * sdz + h * sdh
        if CALL_PASS:
            _short_window_backward_call(
                q_base, k_base, v_base, do_base, lse_ptr, table_base, dq_ptr, dk_ptr, dv_ptr, zh,
                partial, image > first, sqn, skn, svn, sdn, N, scale,
                BIAS_GRAD, BLOCK, D, PRECISION, UPCAST,
            )  # fmt: skip
        else:
            ds = _short_window_backward(
                q_base, k_base, v_base, do_base, lse_ptr, table_base, dq_ptr, dk_ptr, dv_ptr, zh,
                sqn, skn, svn, sdn, N, scale, BLOCK, D, PRECISION, UPCAST,
            )  # fmt: skip
            if BIAS_GRAD:
                dbias += ds
    if BIAS_GRAD and not CALL_PASS:
        tile = partial + rows[:, None] * N + rows[None, :]
        tl.store(tile, dbias, mask=(rows < N)[:, None] & (rows < N)[None, :])


# ------------------------------------------------------------------------------------------
# Launchers.


def _block(n: int, limit: int = MAX_BLOCK) -> int:
    """Block covering n tokens (at least 16, the smallest tl.dot), at most ``limit``."""
    return min(max(16, triton.next_power_of_2(n)), limit)


def _dot_options(dtype: torch.dtype, interpreter: bool, tf32: bool = False) -> dict:
    """PRECISION: fp32 inputs on tensor cores with torch matmul's contract, ``"tf32"`` where
    ``tf32`` (``torch.backends.cuda.matmul.allow_tf32``) is on, else ``"tf32x3"`` (three TF32
    products: about fp32's accuracy); 16-bit ones the default. UPCAST: bf16 products in fp32
    under the CPU interpreter (which ignores PRECISION: its products are fp32)."""
    precision = "tf32" if dtype != torch.float32 or tf32 else "tf32x3"
    return {"PRECISION": precision, "UPCAST": dtype == torch.bfloat16 and interpreter}


def short_window(n: int, d: int, dtype: torch.dtype = torch.float16, tf32: bool = False) -> bool:
    """Whether windows of n tokens at head dim d, inputs of ``dtype`` (fp32 products in TF32
    where ``tf32``), take the short-window kernels: n <= SHORT_BLOCK and d <= SHORT_MAX_D,
    except at the blocks where a short kernel spills (SHORT_SPILLING)."""
    if n > SHORT_BLOCK or d > SHORT_MAX_D:
        return False
    block, products = _block(n, SHORT_BLOCK), _products(dtype, tf32)
    return all((kernel, products, d, block) not in SHORT_SPILLING for kernel in SHORT_KERNELS)


def _products(dtype: torch.dtype, tf32: bool) -> str:
    """LONG_LAUNCHES' key for the products of inputs of ``dtype``: "16-bit", "tf32" or "tf32x3"."""
    if dtype != torch.float32:
        return "16-bit"
    return "tf32" if tf32 else "tf32x3"


def _long_launch(
    kernel: str, n: int, d: int, dtype: torch.dtype, tf32: bool, arch: int = 90
) -> dict:
    """BLOCK_M, BLOCK_N, num_warps and num_stages of a blocked kernel (LONG_LAUNCHES, or
    LONG_LAUNCHES_SM80 below compute capability 9.0: ``arch`` 80 for 8.x) for windows of n
    tokens: blocks shrink to cover short windows (at least 16), and the warps in proportion (at
    least 2)."""
    table = LONG_LAUNCHES if arch >= 90 else LONG_LAUNCHES_SM80
    largest_m, largest_n, warps, stages = table[(kernel, _products(dtype, tf32), d)]
    block_m, block_n = _block(n, largest_m), _block(n, largest_n)
    warps = max(2, warps * block_m * block_n // (largest_m * largest_n))
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)


def launch_options(
    n: int,
    d: int,
    dtype: torch.dtype,
    interpreter: bool = False,
    tf32: bool = False,
    arch: int = 90,
) -> dict:
    """The compile-time options of the launches for windows of n tokens, head dim d and
    inputs of ``dtype`` (``tf32``: fp32 products in plain TF32, see ``_dot_options``), by kernel
    name: ``_short_forward_kernel`` and ``_short_backward_kernel`` where ``short_window(n, d)``,
    else ``_forward_kernel``, ``_backward_kernel`` and, when the backward's key block does not
    cover the window, ``_backward_dq_kernel``: constexprs (HAS_BIAS, HAS_MASK and BIAS_GRAD
    left to the call), ``num_warps`` and ``num_stages``."""
    dot = _dot_options(dtype, interpreter, tf32)
    if short_window(n, d, dtype, tf32):
        block, products = _block(n, SHORT_BLOCK), _products(dtype, tf32)
        # one stage: the window loop's loads are not pipelined (the shared memory and the
        # registers it takes cost more than the latency it hides at 2 programs per SM)
        short = dict(BLOCK=block, D=d, num_stages=1, **dot)
        forward_warps, _ = SHORT_LAUNCHES[("_short_forward_kernel", products, d, block)]
        backward_warps, call = SHORT_LAUNCHES[("_short_backward_kernel", products, d, block)]
        return {
            "_short_forward_kernel": dict(short, num_warps=forward_warps),
            "_short_backward_kernel": dict(short, num_warps=backward_warps, CALL_PASS=call),
        }
    launch = functools.partial(_long_launch, n=n, d=d, dtype=dtype, tf32=tf32, arch=arch)
    options = {"_forward_kernel": dict(launch("_forward_kernel"), D=d, **dot)}
    backward = dict(launch("_backward_kernel"), D=d, **dot)
    one_key_block = triton.cdiv(n, backward["BLOCK_N"]) == 1
    flags = dict(ONE_KEY_BLOCK=one_key_block, ONE_QUERY_BLOCK=backward["BLOCK_M"] >= n)
    options["_backward_kernel"] = {**backward, **flags}
    if not one_key_block:  # the rows' delta (and dq) from a pass over every key block first
        options["_backward_dq_kernel"] = dict(launch("_backward_dq_kernel"), D=d, **dot)
    return options


def static_launches(n_values, head_dims, dtypes) -> list[tuple]:
    """The distinct GPU launches windows of ``n_values`` tokens, head dims ``head_dims`` and
    inputs of ``dtypes`` make (fp32 with TF32 off and on), as (kernel, pointer type,
    constexprs, num_warps, num_stages) with kernel the ``@triton.jit`` function and pointer
    type e.g. ``"*bf16"``; HAS_BIAS, HAS_MASK and BIAS_GRAD on (their tiles only add to what a
    launch holds). For compiling them ahead of a GPU (kernels/triton/_static.py)."""
    kernels = {
        k.__name__: k
        for k in (
            _forward_kernel,
            _backward_kernel,
            _backward_dq_kernel,
            _short_forward_kernel,
            _short_backward_kernel,
        )
    }
    pointers = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
    seen = {}
    for dtype, d, n, tf32 in itertools.product(dtypes, head_dims, n_values, (False, True)):
        if tf32 and dtype != torch.float32:
            continue
        for name, options in launch_options(n, d, dtype, tf32=tf32).items():
            launch = static_launch(kernels[name], pointers[dtype], options)
            key = (name, launch[1], *sorted(launch[2].items()), *launch[3:])
            seen.setdefault(key, launch)
    return list(seen.values())


def static_launch(kernel, pointer: str, options: dict) -> tuple:
    """(kernel, pointer, constexprs, num_warps, num_stages) of one launch with ``options``
    (``launch_options``'s), every optional tile on: HAS_BIAS, HAS_MASK and BIAS_GRAD where the
    kernel takes them."""
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    for flag in ("HAS_BIAS", "HAS_MASK", "BIAS_GRAD"):
        if flag in kernel.arg_names:
            constexprs[flag] = True
    return kernel, pointer, constexprs, options["num_warps"], options["num_stages"]


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.numel() == 0 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _groups(q: torch.Tensor, key_blocks: int) -> int:
    """Window groups G of the backward: enough programs to fill the GPU, at most one per
    window. Fixed for a device and shape, so d_bias is summed in the same order every run."""
    windows, heads = q.shape[0], q.shape[1]
    if windows == 0:
        return 0
    if q.device.type != "cuda" or triton_interpreter():
        return min(windows, INTERPRETER_GROUPS)
    target = PROGRAMS_PER_SM * multiprocessors(q.device)
    return groups_to_fill(windows, heads * key_blocks, target)


def _dummy(q: torch.Tensor) -> torch.Tensor:
    return q.new_empty((1,), dtype=torch.float32)


def arch_of(capability: tuple[int, int] | None) -> int:
    """The launch tables' arch for a CUDA compute capability: 90 from 9.0 on (and for None: no
    GPU, the interpreter), 80 below."""
    return 90 if capability is None or capability >= (9, 0) else 80


@functools.cache
def _device_arch(index: int) -> int:
    return arch_of(torch.cuda.get_device_capability(index))


def _options(q: torch.Tensor) -> dict:
    """``launch_options`` for q's shape, dtype, device (its compute capability) and torch's
    TF32 setting."""
    n, d = q.shape[-2:]
    interpreter = triton_interpreter()
    cuda = q.device.type == "cuda" and not interpreter
    arch = _device_arch(device_index(q.device)) if cuda else 90
    return launch_options(n, d, q.dtype, interpreter, tf32_allowed(), arch)


def _short_chunks(q: torch.Tensor, masks: int) -> tuple[int, int]:
    """(chunks, images per chunk) of the short-window kernels: each program takes one
    (chunk, window position, head); enough chunks to fill the GPU, none of them empty. Fixed
    for a device and shape, so d_bias is summed in the same order every run."""
    images, heads = q.shape[0] // masks, q.shape[1]
    if q.device.type != "cuda" or triton_interpreter():
        chunks = min(images, INTERPRETER_GROUPS)
    else:
        target = PROGRAMS_PER_SM * multiprocessors(q.device)
        chunks = groups_to_fill(images, masks * heads, target)
    per_chunk = triton.cdiv(images, chunks)
    return triton.cdiv(images, per_chunk), per_chunk


def forward(q, k, v, bias, mask, scale):
    """(out, lse) of window attention; shapes and layout in the module docstring."""
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    windows, heads, n, d = q.shape
    out = _alloc.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _alloc.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return out, lse
    launches = _options(q)
    dummy = _dummy(q)
    masks = mask.shape[0] if mask is not None else 1
    tables = (bias if bias is not None else dummy, mask if mask is not None else dummy)
    flags = dict(HAS_BIAS=bias is not None, HAS_MASK=mask is not None)
    strides = (*_strides(q), *_strides(k), *_strides(v))
    if "_short_forward_kernel" in launches:
        chunks, per_chunk = _short_chunks(q, masks)
        _short_forward_kernel[(chunks * masks * heads,)](
            q, k, v, *tables, out, lse, *strides, windows // masks, heads, n, masks, per_chunk,
            scale, **flags, **launches["_short_forward_kernel"],
        )  # fmt: skip
        return out, lse
    options = launches["_forward_kernel"]
    grid = (windows * heads, triton.cdiv(n, options["BLOCK_M"]))  # dims 1, 2 <= 65535
    _forward_kernel[grid](
        q, k, v, *tables, out, lse, *strides, heads, n, masks, scale, **flags, **options
    )
    return out, lse


def _padded_table(bias, mask, heads: int, n: int, block: int, device) -> torch.Tensor:
    """fp32 ``(nW, H, block, block)``: ``bias[h] + mask[w]`` (zeros for an absent one) padded
    with -inf: what the short-window backward adds to window (image, w)'s head-h scores."""
    masks = mask.shape[0] if mask is not None else 1
    table = torch.full((masks, heads, block, block), float("-inf"), device=device)
    inner = table[..., :n, :n]
    inner.zero_()
    if bias is not None:
        inner += bias.float()
    if mask is not None:
        inner += mask.float()[:, None]
    return table


def _short_backward(dout, q, k, v, bias, mask, lse, scale, bias_grad, options):
    """(dq, dk, dv, dbias) from the short-window backward: one pass per window-head, the
    d_bias partials of the programs (chunk, w, h) summed in a fixed order."""
    windows, heads, n, d = q.shape
    dq = _alloc.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = _alloc.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = _alloc.empty(v.shape, dtype=v.dtype, device=v.device)
    masks = mask.shape[0] if mask is not None else 1
    chunks, per_chunk = _short_chunks(q, masks)
    partial = None
    if bias_grad:  # every program writes its whole region
        partial = torch.empty((chunks * masks, heads, n, n), dtype=torch.float32, device=q.device)
    table = _padded_table(bias, mask, heads, n, options["BLOCK"], q.device)
    _short_backward_kernel[(chunks * masks * heads,)](
        q, k, v, table, dout, lse, dq, dk, dv, partial if bias_grad else _dummy(q),
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
        windows // masks, heads, n, masks, per_chunk, scale, BIAS_GRAD=bias_grad, **options,
    )  # fmt: skip
    return dq, dk, dv, partial.sum(dim=0).to(bias.dtype) if bias_grad else None


def backward(dout, q, k, v, bias, mask, lse, scale, bias_grad):
    """(dq, dk, dv, dbias) of window attention (dbias None unless ``bias_grad``); the softmax
    backward's rowsum is taken from P dP, so the forward's output is not needed."""
    q, k, v, dout = _unit_stride(q), _unit_stride(k), _unit_stride(v), _unit_stride(dout)
    windows, heads, n, d = q.shape
    launches = _options(q)
    bias_grad = bias_grad and bias is not None
    if "_short_backward_kernel" in launches and q.numel():
        options = launches["_short_backward_kernel"]
        return _short_backward(dout, q, k, v, bias, mask, lse, scale, bias_grad, options)
    dq = _alloc.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = _alloc.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = _alloc.empty(v.shape, dtype=v.dtype, device=v.device)
    options = launches.get("_backward_kernel", {"BLOCK_N": MAX_BLOCK})  # (empty short: G = 0)
    key_blocks = triton.cdiv(n, options["BLOCK_N"])
    groups = _groups(q, key_blocks)
    partial = None
    if bias_grad:  # zeros: a region summed across query blocks starts at 0 (and G = 0 sums to 0)
        partial = torch.zeros((groups, heads, n, n), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return dq, dk, dv, partial.sum(dim=0).to(bias.dtype) if bias_grad else None
    dummy = _dummy(q)
    inputs = (
        q,
        k,
        v,
        bias if bias is not None else dummy,
        mask if mask is not None else dummy,
        dout,
        lse,
    )
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))
    num_masks = mask.shape[0] if mask is not None else 1
    flags = dict(HAS_BIAS=bias is not None, HAS_MASK=mask is not None)
    delta = dummy
    if "_backward_dq_kernel" in launches:  # dq and the rows' delta first: dk/dv reads delta
        delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
        dq_options = launches["_backward_dq_kernel"]
        _backward_dq_kernel[(windows * heads, triton.cdiv(n, dq_options["BLOCK_M"]))](
            *inputs, delta, dq, *strides, heads, n, num_masks, scale, **flags, **dq_options
        )
    _backward_kernel[(heads, key_blocks, groups)](  # groups <= 65535 (groups_to_fill)
        *inputs,
        delta,
        dq,
        dk,
        dv,
        partial if partial is not None else dummy,
        *strides,
        windows,
        heads,
        n,
        num_masks,
        groups,
        scale,
        BIAS_GRAD=bias_grad,
        **flags,
        **options,
    )
    return dq, dk, dv, partial.sum(dim=0).to(bias.dtype) if bias_grad else None

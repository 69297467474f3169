"""Shared memory, registers and spills of the Triton window-attention kernels, compiled for an
H100 (sm_90) on any machine, no GPU needed (fusedops/kernels/triton/_static.py).

Every distinct launch the dispatch can make (windows of 1..256 tokens, head dims 16/32/64/128,
fp32/fp16/bf16; forward, backward and the backward's dq kernel) is compiled as Triton's launcher
specializes it on aligned tensors (pointers and strides marked divisible by 16), once with N
marked too and once not, and the worse of the two recorded; the table
(``results/triton_static_window_attention_sm90.json``) records the Triton version, a hash of the
kernels' source and per launch its bytes of shared memory, registers and spill bytes.
tests/test_window_attention_static.py checks every launch against it (each within
``SHARED_LIMIT``) and recompiles a sample. Compiling them all takes minutes (fp32 products
unroll into long FMA code): run it after changing the kernels or their block choices,
``python benchmarks/triton_static.py --write``.

``--sweep`` compiles every candidate launch of the blocked kernels (windows longer than the
short kernels take, or d = 128) at 144-token windows: query and key blocks of 32 or 64, 4 or 8
warps, 1 to 3 stages, per kernel, products (bf16 for 16-bit, fp32 with TF32, fp32 with
3-pass TF32) and d; where every one of a (kernel, products, d)'s candidates spills, a second tier
with a 16-token block on one side or both and 2 to 8 warps (``second_tier``;
``--second-tier`` adds it to a committed sweep CSV). They are compiled as a launch on aligned
tensors is: pointers, strides and
N (144) marked divisible by 16, as Triton's launcher specializes them (without those marks the
same kernels take up to twice the registers). Writes
``results/triton_sweep_window_attention_sm90.csv`` and prints the pick per (kernel, products,
d) by ``pick``'s rule, which ``LONG_LAUNCHES`` in the kernel module must equal
(tests/test_window_attention_static.py). ``--kernels`` keeps some kernels (the CSV then holds
only theirs), ``--products`` some products: two processes split the 15 minutes it takes on 2
cores. Marked divisible, a launch may take more shared memory than unmarked (its loads are then
pipelined through shared memory: the 16-bit forward at 64 x 64, d = 32 takes 61,440 B against
24,576), which is why the table above is compiled marked too.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedops.kernels.triton import _static  # noqa: E402
from fusedops.kernels.triton import window_attention as kernels  # noqa: E402
from fusedops.ops.window_attention import HEAD_DIMS, MAX_TOKENS  # noqa: E402

TABLE = ROOT / "benchmarks" / "results" / "triton_static_window_attention_sm90.json"
#: Shared memory a launch may take: under an H100 block's 232,448 B with a margin for the
#: GPU machine's older Triton (3.6), which may lay out its buffers differently.
SHARED_LIMIT = 220 * 1024
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALARS = {"scale": "fp32"}


def launches() -> list[tuple]:
    """Every distinct launch of the window-attention kernels the dispatch can make."""
    return kernels.static_launches(range(1, MAX_TOKENS + 1), HEAD_DIMS, DTYPES)


RESULTS = ROOT / "benchmarks" / "results"
SWEEP = RESULTS / "triton_sweep_window_attention_sm90.csv"
#: The blocked kernels' sweep for A100s (``--arch 80 --sweep --csv`` this).
SWEEP_SM80 = RESULTS / "triton_sweep_window_attention_sm80.csv"
SWEEP_FIELDS = ("kernel", "products", "d", "block_m", "block_n", "warps", "stages", "registers")
SWEEP_FIELDS += ("spill_bytes", "shared")
#: Products swept, with the pointer type and PRECISION they compile with.
SWEEP_PRODUCTS = {
    "16-bit": ("*bf16", "tf32"),
    "tf32": ("*fp32", "tf32"),
    "tf32x3": ("*fp32", "tf32x3"),
}
#: Window length of the sweep's launches (12 x 12 windows: several blocks, every flag off; a
#: multiple of 16, so N is marked divisible as Triton's launcher marks it).
SWEEP_TOKENS = 144
#: An SM of sm_90 and sm_80 alike: 65,536 registers, 64 warps; each block reserves 1 KiB of
#: shared memory.
SM_REGISTERS, SM_WARPS, BLOCK_RESERVED = 65_536, 64, 1024
#: Shared memory of an SM (sm_90: 228 KiB; sm_80, an A100: 164 KiB) and what a launch may take
#: (a block's 227 / 163 KiB less a margin for other Triton versions' layouts).
SM_SHARED = {90: 233_472, 80: 167_936}
BLOCK_SHARED_LIMIT = {90: SHARED_LIMIT, 80: 160 * 1024}


def resident_warps(row: dict, arch: int = 90) -> int:
    """Warps of ``row``'s launch resident on one SM of ``arch`` (registers, shared memory,
    warps)."""
    warps = int(row["warps"])
    ctas = min(
        SM_REGISTERS // (int(row["registers"]) * 32 * warps),
        SM_SHARED[arch] // (int(row["shared"]) + BLOCK_RESERVED),
        SM_WARPS // warps,
    )
    return ctas * warps


def pick(rows: list[dict], arch: int = 90) -> dict:
    """The candidate launch (sweep rows of one kernel, products and d, compiled for ``arch``)
    to use: among the spill-free ones within BLOCK_SHARED_LIMIT, the most warps resident per SM
    (counted up to 16), then the larger tile, then the deeper pipeline, then fewer warps a CTA
    (the same warps resident in more, smaller CTAs: less of a tile replicated across warps),
    then fewer registers; with none spill-free, the least spilling one within the limit (then
    the most resident warps)."""
    fits = [r for r in rows if int(r["shared"]) <= BLOCK_SHARED_LIMIT[arch]]
    return _best(
        fits,
        lambda r: (
            min(resident_warps(r, arch), 16),
            int(r["block_m"]) * int(r["block_n"]),
            int(r["stages"]),
            -int(r["warps"]),
            -int(r["registers"]),
        ),
        arch,
    )


def _best(rows: list[dict], preference, arch: int = 90) -> dict:
    """The spill-free row of ``rows`` with the largest ``preference(row)``; with none
    spill-free, the least spilling one (then the most warps resident per SM of ``arch``)."""
    free = [r for r in rows if int(r["spill_bytes"]) == 0]
    if not free:
        return min(rows, key=lambda r: (int(r["spill_bytes"]), -resident_warps(r, arch)))
    return max(free, key=preference)


#: The sweep row fields that make a launch: (block_m, block_n, warps, stages).
LAUNCH_FIELDS = ("block_m", "block_n", "warps", "stages")


def _launch(row: dict) -> tuple[int, ...]:
    """A sweep row's launch, (block_m, block_n, warps, stages)."""
    return tuple(int(row[f]) for f in LAUNCH_FIELDS)


def _by_key(rows: list[dict]) -> dict:
    """The sweep's rows grouped by (kernel, products, d)."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["products"], int(row["d"])), []).append(row)
    return groups


def sweep_picks(rows: list[dict], arch: int = 90) -> dict:
    """(kernel, products, d) -> (block_m, block_n, warps, stages, spill bytes) picked from
    ``rows`` compiled for ``arch``."""
    picks = {}
    for key, group in _by_key(rows).items():
        best = pick(group, arch)
        picks[key] = (*_launch(best), int(best["spill_bytes"]))
    return picks


SWEPT = ("_forward_kernel", "_backward_kernel", "_backward_dq_kernel")


#: Buffers the launchers always pass as fp32, whatever the inputs' dtype: the row logsumexp and
#: delta, the d_bias partials, the short backward's padded bias + mask table.
FP32_BUFFERS = ("lse_ptr", "delta_ptr", "dbias_ptr", "table_ptr")


#: The bias and mask tables, read in their own dtype: the inputs' (a model cast to 16 bits) or
#: fp32 (16-bit inputs under autocast, whose parameters stay fp32).
TABLES = ("bias_ptr", "mask_ptr")


def _compile_aligned(kernel, pointer: str, constexprs: dict, n_divisible: bool, options: dict):
    """Compile ``kernel`` for sm_``options["arch"]`` as a launch on aligned tensors is: input
    pointers of type ``pointer``, FP32_BUFFERS fp32, every pointer and the strides (``s`` +
    two letters) marked divisible by 16, N too where ``n_divisible``; (registers, spill
    bytes, shared bytes). With 16-bit inputs and TABLES among the arguments, compiled with
    the tables 16-bit and fp32, the worse of the two (spills, then registers)."""
    signature = _static.signature_of(kernel, constexprs, pointer, SCALARS)
    signature.update({arg: "*fp32" for arg in FP32_BUFFERS if arg in signature})
    if pointer != "*fp32" and any(arg in signature for arg in TABLES):
        found = [
            _compile_signed(kernel, signature, constexprs, n_divisible, options),
            _compile_signed(
                kernel,
                {**signature, **{arg: "*fp32" for arg in TABLES if arg in signature}},
                constexprs,
                n_divisible,
                options,
            ),
        ]
        return max(found, key=lambda f: (f[1], f[0], f[2]))
    return _compile_signed(kernel, signature, constexprs, n_divisible, options)


def _compile_signed(kernel, signature: dict, constexprs: dict, n_divisible: bool, options: dict):
    """``_compile_aligned`` for one signature."""
    info = _static.compile_static(
        kernel,
        signature,
        constexprs,
        options["arch"],
        num_warps=options["num_warps"],
        num_stages=options["num_stages"],
        resources=True,
        divisible=(*STRIDES, "N") if n_divisible else STRIDES,
    )
    return info.registers, info.spill_stores, info.shared


#: Blocks (query, key) and warps of the sweep's second tier, compiled only for the (kernel,
#: products, d) whose first-tier candidates (blocks of 32 or 64, 4 or 8 warps) all spill: a
#: 16-token block on one side or both, 2 to 8 warps. The first tier's larger tiles keep their
#: place wherever one of them is spill-free (16-token blocks reload the other side's rows
#: twice as often); this tier is where fp32 with 3-pass TF32 finds its spill-free launches
#: (d = 128 on sm_90 and sm_80, d = 32 on sm_80).
SECOND_TIER_BLOCKS = ((16, 16), (16, 32), (16, 64), (32, 16), (64, 16))
SECOND_TIER_WARPS = (2, 4, 8)
STAGES = (1, 2, 3)


def _sweep_row(arch: int, name: str, products: str, d: int, launch: tuple) -> dict:
    """The sweep's CSV row of one candidate ``launch`` = (block_m, block_n, warps, stages)."""
    block_m, block_n, warps, stages = launch
    pointer, precision = SWEEP_PRODUCTS[products]
    constexprs = dict(HAS_BIAS=True, HAS_MASK=True, BLOCK_M=block_m, BLOCK_N=block_n, D=d)
    constexprs.update(PRECISION=precision, UPCAST=False)
    if name == "_backward_kernel":
        constexprs.update(BIAS_GRAD=True, ONE_KEY_BLOCK=False, ONE_QUERY_BLOCK=False)
    options = dict(arch=arch, num_warps=warps, num_stages=stages)
    found = _compile_aligned(
        getattr(kernels, name), pointer, constexprs, SWEEP_TOKENS % 16 == 0, options
    )
    row = dict(kernel=name, products=products, d=d, block_m=block_m, block_n=block_n)
    row.update(warps=warps, stages=stages)
    row.update(zip(("registers", "spill_bytes", "shared"), found))
    print(",".join(str(row[f]) for f in SWEEP_FIELDS), flush=True)
    return row


def _launches(name: str, blocks, warps) -> list[tuple]:
    """(block_m, block_n, warps, stages) candidates of kernel ``name`` (the forward: square
    tiles only)."""
    return [
        (block_m, block_n, w, stages)
        for (block_m, block_n), w, stages in itertools.product(blocks, warps, STAGES)
        if name != "_forward_kernel" or block_m == block_n
    ]


def sweep(
    arch: int, names: tuple[str, ...] = SWEPT, products: tuple[str, ...] = tuple(SWEEP_PRODUCTS)
) -> list[dict]:
    """Compile every candidate launch of the blocked kernels ``names`` with ``products`` (keys
    of SWEEP_PRODUCTS; see the module docstring), then the second tier where every first-tier
    candidate spills (``second_tier``); one CSV row each."""
    first = list(itertools.product((32, 64), (32, 64)))
    rows = [
        _sweep_row(arch, name, product, d, launch)
        for name, product, d in itertools.product(names, products, HEAD_DIMS)
        for launch in _launches(name, first, (4, 8))
    ]
    return second_tier(rows, arch)


def second_tier(rows: list[dict], arch: int) -> list[dict]:
    """``rows`` (a first-tier sweep) with the second tier's candidates (SECOND_TIER_BLOCKS x
    SECOND_TIER_WARPS x STAGES) added for each (kernel, products, d) none of whose rows is
    spill-free within BLOCK_SHARED_LIMIT (``pick``'s first choice); rows already there are not
    compiled again."""
    limit = BLOCK_SHARED_LIMIT[arch]
    added = []
    for (name, product, d), group in _by_key(rows).items():
        if any(int(r["spill_bytes"]) == 0 and int(r["shared"]) <= limit for r in group):
            continue
        seen = {_launch(r) for r in group}
        for launch in _launches(name, SECOND_TIER_BLOCKS, SECOND_TIER_WARPS):
            if launch not in seen:
                added.append(_sweep_row(arch, name, product, d, launch))
    return [*rows, *added]


SHORT_SWEEP = RESULTS / "triton_sweep_short_window_attention_sm90.csv"
SHORT_FIELDS = ("kernel", "products", "d", "block", "warps", "call_pass", "n_divisible")
SHORT_FIELDS += ("registers", "spill_bytes", "shared")
#: Short-window head dims (kernels.SHORT_MAX_D and below).
SHORT_HEAD_DIMS = (16, 32, 64)


def sweep_short(arch: int) -> list[dict]:
    """Compile every candidate launch of the short-window kernels: per products, d <= 64 and
    block (16, 32, 64: windows of up to 16, 32, 64 tokens), 2, 4 or 8 warps, the backward's
    per-window pass inlined or a call (CALL_PASS), N marked divisible by 16 or not (Swin's 49
    is not, 64 is); one stage (the kernels' loops are not pipelined). One CSV row each."""
    rows = []
    names = ("_short_forward_kernel", "_short_backward_kernel")
    candidates = itertools.product(
        names,
        SWEEP_PRODUCTS,
        SHORT_HEAD_DIMS,
        (16, 32, 64),
        (2, 4, 8),
        (False, True),
        (False, True),
    )
    for name, products, d, block, warps, call_pass, n_divisible in candidates:
        if name == "_short_forward_kernel" and call_pass:
            continue
        pointer, precision = SWEEP_PRODUCTS[products]
        constexprs = dict(BLOCK=block, D=d, PRECISION=precision, UPCAST=False)
        if name == "_short_forward_kernel":
            constexprs.update(HAS_BIAS=True, HAS_MASK=True)
        else:
            constexprs.update(BIAS_GRAD=True, CALL_PASS=call_pass)
        options = dict(arch=arch, num_warps=warps, num_stages=1)
        found = _compile_aligned(getattr(kernels, name), pointer, constexprs, n_divisible, options)
        row = dict(kernel=name, products=products, d=d, block=block, warps=warps)
        row.update(call_pass=int(call_pass), n_divisible=int(n_divisible))
        row.update(zip(("registers", "spill_bytes", "shared"), found))
        print(",".join(str(row[f]) for f in SHORT_FIELDS), flush=True)
        rows.append(row)
    return rows


def short_picks(rows: list[dict]) -> dict:
    """(kernel, products, d, block) -> (warps, call_pass, spill bytes) of the short-window
    launch to use: a candidate (warps, call_pass) counts with its worse N (divisible or not);
    among the spill-free ones an inlined pass first (a call serializes every wgmma of the
    kernel on sm_90, a cost registers do not show), then the most warps resident per SM (up to
    16), then fewer warps a CTA, then fewer registers; with none spill-free the least spilling
    one."""
    groups: dict = {}
    for row in rows:
        key = (row["kernel"], row["products"], int(row["d"]), int(row["block"]))
        candidate = (int(row["warps"]), int(row["call_pass"]))
        worst = groups.setdefault(key, {}).get(candidate)
        if worst is None or (int(row["spill_bytes"]), int(row["registers"])) > (
            int(worst["spill_bytes"]),
            int(worst["registers"]),
        ):
            groups[key][candidate] = row
    picks = {}
    for key, candidates in groups.items():
        chosen = pick_short(list(candidates.values()))
        picks[key] = (int(chosen["warps"]), bool(int(chosen["call_pass"])))
        picks[key] += (int(chosen["spill_bytes"]),)
    return picks


def pick_short(rows: list[dict]) -> dict:
    """``short_picks``' rule among the candidates (worst rows) of one short launch."""
    return _best(
        rows,
        lambda r: (
            -int(r["call_pass"]),
            min(resident_warps(r), 16),
            -int(r["warps"]),
            -int(r["registers"]),
        ),
    )


#: The window-attention kernels' stride arguments (``s`` + two letters): multiples of 16 for
#: every supported head dim, as Triton's launcher marks them.
STRIDES = tuple(
    sorted(
        {
            name
            for kernel in _static._jit_functions(kernels).values()
            for name in kernel.arg_names
            if re.fullmatch(r"s[a-z]{2}", name)
        }
    )
)


def worse(first: dict, second: dict) -> dict:
    """Two ``_static.table`` results of the same launches merged: per launch the larger of
    each number (shared memory, registers, spills)."""
    merged = dict(first, launches={})
    for key, row in first["launches"].items():
        other = second["launches"][key]
        merged["launches"][key] = {name: max(value, other[name]) for name, value in row.items()}
    return merged


def _write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE.name}")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability")
    parser.add_argument("--sweep", action="store_true", help=f"write {SWEEP.name}, print picks")
    parser.add_argument(
        "--sweep-short", action="store_true", help=f"write {SHORT_SWEEP.name}, print picks"
    )
    parser.add_argument("--kernels", default=",".join(SWEPT), help="--sweep: these kernels only")
    parser.add_argument(
        "--products", default=",".join(SWEEP_PRODUCTS), help="--sweep: these products only"
    )
    parser.add_argument("--csv", type=Path, default=SWEEP, help="--sweep: write here")
    parser.add_argument(
        "--second-tier",
        action="store_true",
        help="add the second tier to the sweep CSV --csv (for --arch) and print the picks",
    )
    args = parser.parse_args()
    if args.second_tier:
        with args.csv.open(newline="") as handle:
            rows = second_tier(list(csv.DictReader(handle)), args.arch)
        _write_csv(args.csv, SWEEP_FIELDS, rows)
        for key, chosen in sorted(sweep_picks(rows, args.arch).items()):
            print(f"{key}: {chosen[:4]}" + (f"  spills {chosen[4]} B" if chosen[4] else ""))
        return
    if args.sweep_short:
        rows = sweep_short(args.arch)
        _write_csv(SHORT_SWEEP, SHORT_FIELDS, rows)
        for key, chosen in sorted(short_picks(rows).items()):
            print(f"{key}: {chosen[:2]}" + (f"  spills {chosen[2]} B" if chosen[2] else ""))
        return
    if args.sweep:
        rows = sweep(args.arch, tuple(args.kernels.split(",")), tuple(args.products.split(",")))
        _write_csv(args.csv, SWEEP_FIELDS, rows)
        for key, chosen in sorted(sweep_picks(rows, args.arch).items()):
            print(f"{key}: {chosen[:4]}" + (f"  spills {chosen[4]} B" if chosen[4] else ""))
        return
    todo = launches()
    print(f"{len(todo)} launches, Triton {_static.triton.__version__}, sm_{args.arch}", flush=True)

    def progress(key, info):
        flag = "  OVER THE LIMIT" if info.shared > SHARED_LIMIT else ""
        print(
            f"{info.shared:7d} B shared {info.registers:4d} registers "
            f"{info.spill_stores:5d} B spilled  {key}{flag}",
            flush=True,
        )

    # as launched on aligned tensors (pointers and strides divisible by 16), with N divisible
    # by 16 and not: each launch's worse case
    tables = [
        _static.table(kernels, todo, args.arch, SCALARS, progress=progress, divisible=marked)
        for marked in (STRIDES, (*STRIDES, "N"))
    ]
    table = worse(*tables)
    over = [key for key, row in table["launches"].items() if row["shared"] > SHARED_LIMIT]
    if args.write:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {TABLE}")
    if over:
        sys.exit(f"{len(over)} launches over {SHARED_LIMIT} B of shared memory")


if __name__ == "__main__":
    main()

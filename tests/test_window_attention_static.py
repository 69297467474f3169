"""The Triton window-attention kernels fit an H100's shared memory in every launch the dispatch
can make, checked without a GPU: Triton compiles them for sm_90 here (kernels/triton/_static.py).

Compiling all of them takes minutes, so benchmarks/triton_static.py writes the table once
(``--write``); here every launch must be in it, within the limit, for the current kernel
source, and a sample is compiled again and must match it."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch
import triton

from fusedops.kernels.triton import _static, quick_gelu
from fusedops.kernels.triton import window_attention as kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import triton_static  # noqa: E402

F32 = torch.float32
REGENERATE = "regenerate it: python benchmarks/triton_static.py --write"


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads(triton_static.TABLE.read_text())


def _key(launch) -> str:
    kernel, pointer, constexprs, num_warps, num_stages = launch
    return _static.launch_key(kernel.__name__, pointer, constexprs, num_warps, num_stages)


def test_every_launch_is_in_the_table_within_the_limit(table):
    """Each distinct launch for N = 1..256, d in {16, 32, 64, 128}, fp32/fp16/bf16 (forward,
    backward, dq; the short-window forward and backward) was compiled for sm_90 from the current
    kernel source and takes at most SHARED_LIMIT bytes of shared memory (an H100 block may take
    232,448)."""
    assert table["source_hash"] == _static.source_hash(kernels), f"kernels changed: {REGENERATE}"
    assert table["arch"] == 90
    assert triton_static.SHARED_LIMIT < _static.H100_SHARED_BYTES
    launches = triton_static.launches()
    kinds = {(k.__name__, p, c["D"]) for k, p, c, _, _ in launches}
    # forward, backward, dq (N > the key block) x dtypes x d; short forward, backward (N <= 64)
    # x dtypes x d <= 64
    assert len(kinds) == 3 * 3 * 4 + 2 * 3 * 3
    missing = [key for key in map(_key, launches) if key not in table["launches"]]
    assert not missing, f"launches not in the table ({REGENERATE}): {missing[:3]}"
    over = {
        key: table["launches"][key]["shared"]
        for key in map(_key, launches)
        if table["launches"][key]["shared"] > triton_static.SHARED_LIMIT
    }
    assert not over, over


@pytest.fixture(scope="module")
def sweep() -> list[dict]:
    with triton_static.SWEEP.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_long_launches_are_the_sweeps_picks(sweep):
    """LONG_LAUNCHES is what ``triton_static.pick`` chooses from the committed sweep (every
    candidate of every blocked kernel, products and d, compiled for sm_90 as aligned tensors
    launch them) and SPILLING lists the picks that still spill; Triton's default blocks for
    the fp32 d = 128 forward (64 x 64, 3 stages) would not fit a block's shared memory."""
    # (products x d) x (forward: square tiles, backward and dq: any) x warps x stages, then
    # the second tier for the fp32 3-pass TF32 backward and dq at d = 128 (every 16-token
    # block x 2-8 warps x stages)
    assert len(sweep) == 3 * 4 * (2 + 4 + 4) * 2 * 3 + 2 * 5 * 3 * 3
    assert not kernels.SPILLING
    picks = triton_static.sweep_picks(sweep)
    assert {key: chosen[:4] for key, chosen in picks.items()} == kernels.LONG_LAUNCHES
    assert {key for key, chosen in picks.items() if chosen[4]} == kernels.SPILLING
    default = [
        r
        for r in sweep
        if (r["kernel"], r["products"], r["d"], r["block_m"], r["stages"])
        == ("_forward_kernel", "tf32x3", "128", "64", "3")
    ]
    assert default and all(int(r["shared"]) > triton_static.SHARED_LIMIT for r in default)
    options = kernels.launch_options(256, 128, torch.float32)["_forward_kernel"]
    assert (options["BLOCK_M"], options["num_stages"]) != (64, 3)


def test_a100_launches_are_the_sm80_sweeps_picks():
    """LONG_LAUNCHES_SM80 and SPILLING_SM80 are ``triton_static.pick``'s choices from the
    committed sm_80 sweep (within an A100 block's shared memory), and a device of compute
    capability 8.x launches them: ``arch_of`` maps capabilities to the tables."""
    with triton_static.SWEEP_SM80.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    # the second tier: the fp32 3-pass TF32 backward at d = 32 and d = 128
    assert len(rows) == 3 * 4 * (2 + 4 + 4) * 2 * 3 + 2 * 5 * 3 * 3
    assert not kernels.SPILLING_SM80
    picks = triton_static.sweep_picks(rows, 80)
    assert {key: chosen[:4] for key, chosen in picks.items()} == kernels.LONG_LAUNCHES_SM80
    assert {key for key, chosen in picks.items() if chosen[4]} == kernels.SPILLING_SM80
    index = {
        tuple(r[f] for f in ("kernel", "products", "d", "block_m", "block_n", "warps", "stages")): r
        for r in rows
    }
    for (kernel, products, d), chosen in kernels.LONG_LAUNCHES_SM80.items():
        row = index[(kernel, products, str(d), *map(str, chosen))]
        assert int(row["shared"]) <= triton_static.BLOCK_SHARED_LIMIT[80]
    assert [kernels.arch_of(c) for c in (None, (8, 0), (8, 6), (8, 9), (9, 0), (10, 0))] == [
        90, 80, 80, 80, 90, 90,
    ]  # fmt: skip
    for arch, table in ((80, kernels.LONG_LAUNCHES_SM80), (90, kernels.LONG_LAUNCHES)):
        options = kernels.launch_options(144, 32, torch.bfloat16, arch=arch)
        chosen = table[("_backward_kernel", "16-bit", 32)]
        backward = options["_backward_kernel"]
        assert (backward["BLOCK_M"], backward["BLOCK_N"], backward["num_warps"]) == chosen[:3]


def _row(block_m=32, block_n=32, warps=4, stages=3, registers=128, spill_bytes=0, shared=0):
    return dict(
        kernel="k", products="tf32", d="64", block_m=str(block_m), block_n=str(block_n),
        warps=str(warps), stages=str(stages), registers=str(registers),
        spill_bytes=str(spill_bytes), shared=str(shared),
    )  # fmt: skip


def test_second_tier_only_where_every_first_tier_candidate_spills(monkeypatch):
    """``second_tier`` compiles its candidates (a 16-token block, 2-8 warps, 1-3 stages; the
    forward's tiles square) only for the groups with no spill-free row within the shared-memory
    limit, and never a launch the sweep already holds."""
    compiled = []

    def fake_row(arch, name, products, d, launch):
        compiled.append((name, products, d, launch))
        fields = dict(zip(triton_static.LAUNCH_FIELDS, launch))
        return dict(kernel=name, products=products, d=d, **fields)

    monkeypatch.setattr(triton_static, "_sweep_row", fake_row)
    limit = triton_static.BLOCK_SHARED_LIMIT[90]
    free = dict(_row(), kernel="_backward_kernel", products="tf32", d="32")
    spilling = dict(_row(spill_bytes=8), kernel="_backward_kernel", products="tf32x3", d="128")
    held = dict(_row(16, 16, warps=2, stages=1, spill_bytes=4))
    held.update(kernel="_backward_kernel", products="tf32x3", d="128")
    too_big = dict(_row(shared=limit + 1), kernel="_forward_kernel", products="16-bit", d="64")
    rows = triton_static.second_tier([free, spilling, held, too_big], 90)
    assert rows[:4] == [free, spilling, held, too_big]
    assert {(name, products, d) for name, products, d, _ in compiled} == {
        ("_backward_kernel", "tf32x3", 128),
        ("_forward_kernel", "16-bit", 64),
    }
    backward = [launch for name, _, _, launch in compiled if name == "_backward_kernel"]
    assert len(backward) == 5 * 3 * 3 - 1 and (16, 16, 2, 1) not in backward
    forward = [launch for name, _, _, launch in compiled if name == "_forward_kernel"]
    assert len(forward) == 3 * 3 and all(m == n == 16 for m, n, _, _ in forward)
    assert all(16 in launch[:2] and launch[2] in (2, 4, 8) for *_, launch in compiled)


def test_pick_prefers_spill_free_then_resident_warps_then_tiles():
    """The rule behind LONG_LAUNCHES, on made-up candidates."""
    small = _row(registers=128)  # 4 warps x 4 CTAs = 16 warps a SM
    big = _row(64, 64, warps=8, registers=255)  # 1 CTA: 8 warps
    assert triton_static.resident_warps(small) == 16 and triton_static.resident_warps(big) == 8
    assert triton_static.pick([big, small]) is small
    spilling = _row(registers=64, spill_bytes=8)  # more warps resident, but spills
    assert triton_static.pick([spilling, big]) is big
    wide = _row(64, 32, warps=8, registers=64)  # 16 warps too (capped), larger tile
    assert triton_static.pick([small, wide]) is wide
    deeper = _row(stages=3, registers=100)
    assert triton_static.pick([_row(stages=1, registers=100), deeper]) is deeper
    over = _row(registers=32, shared=triton_static.SHARED_LIMIT + 1)
    assert triton_static.pick([over, big]) is big
    least = _row(spill_bytes=4, registers=255)
    assert triton_static.pick([_row(spill_bytes=40), least, over]) is least


def test_short_launches_are_the_sweeps_picks():
    """SHORT_LAUNCHES (warps, CALL_PASS) and SHORT_SPILLING are what
    ``triton_static.short_picks`` chooses from the committed short-window sweep, and windows at a
    block where a short kernel spills take the blocked kernels, which do not spill there."""
    with triton_static.SHORT_SWEEP.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    # products x d x block x warps x (N divisible or not) x (forward; backward inlined or call)
    assert len(rows) == 3 * 3 * 3 * 3 * 2 * (1 + 2)
    picks = triton_static.short_picks(rows)
    assert {key: chosen[:2] for key, chosen in picks.items()} == kernels.SHORT_LAUNCHES
    assert {key for key, chosen in picks.items() if chosen[2]} == kernels.SHORT_SPILLING
    dtypes = {"16-bit": (torch.bfloat16, False), "tf32": (F32, True), "tf32x3": (F32, False)}
    for kernel, products, d, block in kernels.SHORT_SPILLING:
        dtype, tf32 = dtypes[products]
        options = kernels.launch_options(block, d, dtype, tf32=tf32)
        assert "_short_forward_kernel" not in options, (kernel, products, d, block)
        for name in options:
            assert (name, products, d) not in kernels.SPILLING


def _short_row(warps=4, call_pass=0, registers=128, spill_bytes=0, n_divisible=0):
    return dict(
        kernel="k", products="tf32", d="32", block="64", warps=str(warps),
        call_pass=str(call_pass), n_divisible=str(n_divisible), registers=str(registers),
        spill_bytes=str(spill_bytes), shared="16384",
    )  # fmt: skip


def test_short_pick_takes_each_candidates_worse_n_then_prefers_inlined_passes():
    """The rule behind SHORT_LAUNCHES, on made-up candidates."""
    inlined, call = _short_row(registers=200), _short_row(call_pass=1, registers=120)
    assert triton_static.resident_warps(inlined) == 8 and triton_static.resident_warps(call) == 16
    assert triton_static.pick_short([call, inlined]) is inlined  # more warps, but a call
    spills_once = _short_row(registers=100, spill_bytes=8, n_divisible=1)
    rows = [_short_row(registers=100), spills_once, call, _short_row(call_pass=1, n_divisible=1)]
    # (4 warps, inlined) spills when N is divisible: the call is taken
    assert triton_static.short_picks(rows)[("k", "tf32", 32, 64)] == (4, True, 0)
    more = _short_row(warps=8, registers=128)  # 8 warps x 2 CTAs = 16 resident, against 4 x 2
    assert triton_static.pick_short([inlined, more]) is more
    fewer = _short_row(warps=2, registers=128)  # 2 warps x 8 CTAs: 16 too, in smaller CTAs
    assert triton_static.pick_short([more, fewer]) is fewer
    least = _short_row(spill_bytes=4)
    assert triton_static.pick_short([_short_row(spill_bytes=40), least]) is least


@pytest.mark.parametrize(
    ("kernel", "dtype", "d", "n"),
    [("_backward_kernel", torch.bfloat16, 128, 200), ("_forward_kernel", torch.float32, 16, 100)],
)
def test_a_fresh_compile_matches_the_table(table, kernel, dtype, d, n):
    """Two launches (the largest 16-bit one, an fp32 one that compiles in seconds) compiled
    again here as aligned tensors launch them (N divisible by 16 and not): the same bytes as
    the table with the same Triton, within the limit with any."""
    launch = next(x for x in kernels.static_launches([n], [d], [dtype]) if x[0].__name__ == kernel)
    fn, pointer, constexprs, num_warps, num_stages = launch
    signature = _static.signature_of(fn, constexprs, pointer, triton_static.SCALARS)
    shared = max(
        _static.compile_static(
            fn, signature, constexprs, num_warps=num_warps, num_stages=num_stages, divisible=marked
        ).shared
        for marked in (triton_static.STRIDES, (*triton_static.STRIDES, "N"))
    )
    assert shared <= triton_static.SHARED_LIMIT
    if table["triton"] == triton.__version__:
        assert shared == table["launches"][_key(launch)]["shared"]


def test_compile_static_reports_resources_and_checks_its_arguments():
    """QuickGELU's forward kernel (elementwise: no shared memory), compiled for sm_90."""
    kernel, constexprs = quick_gelu._forward_kernel, {"BLOCK": 1024}
    signature = _static.signature_of(kernel, constexprs, "*fp32", {"alpha": "fp32"})
    assert signature == {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "n": "i32",
        "alpha": "fp32",
        "BLOCK": "constexpr",
    }
    info = _static.compile_static(kernel, signature, constexprs, resources=True)
    assert info.name == "_forward_kernel" and info.shared == 0
    assert (info.num_warps, info.num_stages) == (4, 3)
    assert 0 < info.registers <= 255 and info.spill_stores == info.spill_loads == 0
    with pytest.raises(ValueError, match="scalars"):
        _static.signature_of(kernel, constexprs, "*fp32", {"scale": "fp32"})
    with pytest.raises(ValueError, match="arch"):
        _static.compile_static(kernel, signature, constexprs, arch=9)
    with pytest.raises(ValueError, match="constexprs"):
        _static.compile_static(kernel, signature, {"WIDTH": 1})
    with pytest.raises(TypeError, match="triton.jit"):
        _static.compile_static(len, signature, constexprs)

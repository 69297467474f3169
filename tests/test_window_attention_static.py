"""The Triton window-attention kernels fit an H100's shared memory in every launch the dispatch
can make, checked without a GPU: Triton compiles them for sm_90 here (kernels/triton/_static.py).

Compiling all of them takes minutes, so benchmarks/triton_static.py writes the table once
(``--write``); here every launch must be in it, within the limit, for the current kernel
source, and a sample is compiled again and must match it."""

from __future__ import annotations

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


def test_the_largest_uncapped_launch_would_not_fit(table):
    """The caps are needed: the fp32 forward at d = 128 with 64-wide blocks and Triton's default
    3 stages asks for more than an H100 block has (246,016 B with Triton 3.9)."""
    assert kernels.SHARED_MEMORY_CAPS, "no cap left: the fp32 d = 128 forward does not fit"
    options = kernels.launch_options(256, 128, torch.float32)["_forward_kernel"]
    assert (options["BLOCK_M"], options["num_stages"]) != (kernels.MAX_BLOCK, kernels.NUM_STAGES)


@pytest.mark.parametrize(
    ("kernel", "dtype", "d", "n"),
    [("_backward_kernel", torch.bfloat16, 128, 200), ("_forward_kernel", torch.float32, 16, 100)],
)
def test_a_fresh_compile_matches_the_table(table, kernel, dtype, d, n):
    """Two launches (the largest 16-bit one, an fp32 one that compiles in seconds) compiled
    again here: the same bytes as the table with the same Triton, within the limit with any."""
    launch = next(x for x in kernels.static_launches([n], [d], [dtype]) if x[0].__name__ == kernel)
    fn, pointer, constexprs, num_warps, num_stages = launch
    signature = _static.signature_of(fn, constexprs, pointer, triton_static.SCALARS)
    info = _static.compile_static(
        fn, signature, constexprs, num_warps=num_warps, num_stages=num_stages
    )
    assert info.shared <= triton_static.SHARED_LIMIT
    if table["triton"] == triton.__version__:
        assert info.shared == table["launches"][_key(launch)]["shared"]


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

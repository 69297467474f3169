"""The "dcn" hook: torchvision's deform_conv2d (so DeformConv2d) and mmcv's
modulated_deform_conv2d (so ModulatedDeformConv2d and its Pack) replaced by fusedops'.

Neither library is importable here: stand-in packages with their module layout, whose classes
call the module-level function as the libraries' do and whose functions return a marker, run in
fresh interpreters so no stand-in leaks into this one.
"""

import textwrap
from pathlib import Path

import pytest

from fusedops.testing import run_python, write_tree

_STAND_INS = {
    "torchvision/__init__.py": "from torchvision import ops\n",
    "torchvision/ops/__init__.py": (
        "from torchvision.ops.deform_conv import DeformConv2d, deform_conv2d\n"
    ),
    "torchvision/ops/deform_conv.py": """
import torch


def deform_conv2d(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0),
                  dilation=(1, 1), mask=None):
    return "torchvision"


class DeformConv2d(torch.nn.Module):
    def __init__(self, cin, cout, k, padding=0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(cout, cin, k, k))
        self.bias = torch.nn.Parameter(torch.rand(cout))
        self.padding = (padding, padding)

    def forward(self, input, offset, mask=None):
        return deform_conv2d(input, offset, self.weight, self.bias, padding=self.padding,
                             mask=mask)
""",
    "mmcv/__init__.py": "",
    "mmcv/ops/__init__.py": (
        "from .modulated_deform_conv import ModulatedDeformConv2dPack, modulated_deform_conv2d\n"
    ),
    "mmcv/ops/modulated_deform_conv.py": """
import torch


def modulated_deform_conv2d(input, offset, mask, weight, bias, stride=1, padding=0, dilation=1,
                            groups=1, deform_groups=1):
    return "mmcv"


class ModulatedDeformConv2dPack(torch.nn.Module):
    def __init__(self, cin, cout, k, padding=0, deform_groups=1):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(cout, cin, k, k))
        self.bias = torch.nn.Parameter(torch.rand(cout))
        self.padding, self.deform_groups = padding, deform_groups
        self.conv_offset = torch.nn.Conv2d(cin, deform_groups * 3 * k * k, k, padding=padding)

    def forward(self, x):
        o1, o2, mask = torch.chunk(self.conv_offset(x), 3, dim=1)
        offset = torch.cat((o1, o2), dim=1)
        return modulated_deform_conv2d(x, offset, torch.sigmoid(mask), self.weight, self.bias,
                                       1, self.padding, 1, 1, self.deform_groups)
""",
}

_RUN = """
import sys
from fusedops import hooks
hooks.enable_fused_dcn()
assert "torch" not in sys.modules
import torch, torchvision, mmcv.ops, fusedops
from torchvision.ops import deform_conv2d
x = torch.rand(2, 4, 5, 5)
offset = torch.rand(2, 2 * 2 * 9, 5, 5) * 2 - 1
mask = torch.rand(2, 2 * 9, 5, 5)
tv = torchvision.ops.DeformConv2d(4, 3, 3, padding=1)
pack = mmcv.ops.ModulatedDeformConv2dPack(4, 3, 3, padding=1, deform_groups=2)
o1, o2, m = torch.chunk(pack.conv_offset(x), 3, dim=1)
cases = {
    "function": (deform_conv2d(x, offset, tv.weight, padding=(1, 1), mask=mask),
                 fusedops.deform_conv2d(x, offset, tv.weight, padding=1, mask=mask)),
    "DeformConv2d": (tv(x, offset, mask), fusedops.deform_conv2d(x, offset, tv.weight, tv.bias,
                                                                 padding=1, mask=mask)),
    "Pack": (pack(x), fusedops.deform_conv2d(x, torch.cat((o1, o2), 1), pack.weight, pack.bias,
                                             padding=1, mask=torch.sigmoid(m))),
}
for name, (got, want) in cases.items():
    print(name, isinstance(got, torch.Tensor) and torch.equal(got, want))
try:
    mmcv.ops.modulated_deform_conv2d(x, offset, mask, tv.weight, None, 1, 1, 1, 1, 1)  # 2 groups
except ValueError as exc:
    print("bad deform_groups:", exc)
print("ran on", fusedops.dispatch.last_used)
hooks.disable_fused_dcn()
print("restored", tv(x, offset, mask), pack(x),
      torchvision.ops.deform_conv2d(x, offset, tv.weight, padding=1))
"""


def _stand_ins(tmp_path: Path) -> Path:
    return write_tree(tmp_path, _STAND_INS)


pytestmark = pytest.mark.usefixtures("restore_hooks")


def test_dcn_hook_swaps_torchvision_and_mmcv_and_restores_them(tmp_path):
    root = _stand_ins(tmp_path)
    done = run_python("-c", textwrap.dedent(_RUN), cwd=root, path=(root,))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in ("function", "DeformConv2d", "Pack"):
        assert f"{name} True" in lines, done.stdout
    assert any(line.startswith("bad deform_groups: deform_groups=1") for line in lines)
    assert "ran on {'deform_conv2d': 'native'}" in lines, done.stdout
    assert "restored torchvision mmcv torchvision" in lines, done.stdout


def test_fusedops_hooks_env_enables_the_dcn_hook(tmp_path):
    code = """
        import torchvision, mmcv.ops
        from fusedops import hooks
        print(hooks.enabled(), torchvision.ops.deform_conv2d.__module__,
              torchvision.ops.deform_conv.deform_conv2d.__module__,
              mmcv.ops.modulated_deform_conv.modulated_deform_conv2d.__module__)
    """
    root = _stand_ins(tmp_path)
    done = run_python(
        "-c", textwrap.dedent(code), cwd=root, path=(root,), env={"FUSEDOPS_HOOKS": "dcn"}
    )
    assert done.returncode == 0, done.stderr
    want = (
        "['dcn'] fusedops.ops.deform_conv2d fusedops.ops.deform_conv2d "
        "fusedops.integrations.mmcv.hooks"
    )
    assert want in done.stdout, done.stdout

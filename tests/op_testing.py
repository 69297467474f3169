"""The preamble every op test file shares: where its tensors live and which backends it checks.

Module constants, not fixtures: ``pytest.mark.parametrize`` reads them when the test module is
imported. Import what a file uses (``from tests.op_testing import BACKENDS, DEVICE, DTYPES``).
"""

import torch

from fusedops.testing import backends_under_test, device_under_test, kernel_backends_under_test

#: The device tests build their tensors on: the GPU where there is one, else the CPU.
DEVICE = device_under_test()
#: Every backend that runs here: reference and native always, triton and cuda where they can.
BACKENDS = backends_under_test()
#: The fused-kernel backends among ``BACKENDS`` (triton, cuda).
KERNEL_BACKENDS = kernel_backends_under_test()
#: The floating dtypes the ops take: float32, float16, bfloat16.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

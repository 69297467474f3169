"""Small tensors moved between devices without reading a copy that has not landed yet.

``Tensor.to(device, non_blocking=True)`` returns at once in both directions on CUDA, but only a
copy onto an accelerator may be used at once: the device's stream orders it before every later
kernel there (from pageable host memory the driver has staged the data before returning). A
copy from an accelerator onto the host lands in a pinned buffer that the host may read before
the device has filled it: it then reads whatever the block held, with the caching host allocator
often the value of a previous step (PyTorch's "A guide on good usage of non_blocking and
pin_memory()": ``cuda_tensor.to("cpu", non_blocking=True).mean()`` gives wrong results). So a
copy onto the host here always waits (from an accelerator: a host synchronisation, which callers
make at most once per step; ``to_host`` brings several values in one copy).
"""

from __future__ import annotations

import torch


def to_device(
    t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``t`` (any shape) on ``device`` in ``dtype`` (default: its own): ``t`` itself when
    nothing changes, an asynchronous copy onto an accelerator, a blocking one onto the host
    (from an accelerator: a host synchronisation). Never a non-blocking copy onto the host."""
    return t.to(device=device, dtype=dtype or t.dtype, non_blocking=device.type != "cpu")


def to_host(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``values`` (0-d or 1-element tensors of any real dtype, on any devices) as 0-d float32
    tensors on the host, under the same keys: those already there as they are (converted), all
    the others in one blocking copy (one host synchronisation; none when every value is on the
    host already)."""
    cpu = torch.device("cpu")
    host, remote = {}, {}
    for key, value in values.items():
        value = value.reshape(())
        if value.device.type == "cpu":
            host[key] = to_device(value, cpu, torch.float32)
        else:
            remote[key] = value
    if remote:
        gather = next(iter(remote.values())).device  # (a copy between accelerators: async)
        stacked = torch.stack([to_device(v, gather, torch.float32) for v in remote.values()])
        host.update(zip(remote, to_device(stacked, cpu).unbind()))
    return host

"""``multi_apply`` (mmdet's helper) and ``multi_apply_multi_stream``: the same results, with the
calls spread round-robin over CUDA side streams so small per-level kernels overlap."""

from __future__ import annotations

from collections.abc import Callable

from fusedops.utils._streams import CudaStreams, first_cuda_device


def _check_func(func) -> None:
    if not callable(func):
        raise TypeError(f"func must be callable, got {type(func).__name__}")


def _collect(results: list) -> tuple[list, ...]:
    """mmdet's result layout: one list per output of ``func``, in call order."""
    return tuple(map(list, zip(*results)))


def multi_apply(func: Callable, *args, **kwargs) -> tuple[list, ...]:
    """Apply ``func`` to each zipped group of ``args`` (``func(a[i], b[i], ..., **kwargs)``)
    and return a tuple of lists, one list per output of ``func`` (mmdet's ``multi_apply``).

    args: sequences of equal length (e.g. per-FPN-level feature maps, shape (N, C, H_l, W_l)
    each); kwargs: passed unchanged to every call. Dtypes and devices are whatever ``func``
    takes.
    """
    _check_func(func)
    return _collect([func(*group, **kwargs) for group in zip(*args)])


def multi_apply_multi_stream(func: Callable, num_streams: int, *args, **kwargs) -> tuple[list, ...]:
    """``multi_apply(func, *args, **kwargs)`` with call ``i`` queued on side stream
    ``i % num_streams`` when the arguments hold CUDA tensors; on CPU, the plain sequential apply.

    Same result as ``multi_apply``: a tuple of lists, one per output of ``func``. On CUDA every
    side stream first waits for the current stream (inputs are ready), each call's outputs are
    ``record_stream``-ed on the current stream (their memory is not reused while the caller's
    later work reads them), and the current stream waits for every side stream before this
    returns, so the results are safe to use on it and inputs the caller frees afterwards are not
    reused under a running call. Autograd works through it (backward of each call runs on the
    stream its forward ran on).

    num_streams: int >= 1 (1 still moves the work off the current stream); the device is that
    of the first CUDA tensor in ``args``/``kwargs``.
    """
    _check_func(func)
    if isinstance(num_streams, bool) or not isinstance(num_streams, int):
        raise TypeError(f"num_streams must be an int, got {type(num_streams).__name__}")
    if num_streams < 1:
        raise ValueError(f"num_streams must be >= 1, got {num_streams}")
    device = first_cuda_device((args, kwargs))
    if device is None:
        return _collect([func(*group, **kwargs) for group in zip(*args)])
    return apply_on_streams(CudaStreams(device), func, num_streams, list(zip(*args)), kwargs)


def apply_on_streams(
    streams, func: Callable, num_streams: int, groups: list, kwargs: dict
) -> tuple[list, ...]:
    """The stream logic of ``multi_apply_multi_stream`` over ``streams`` (a ``CudaStreams``, or
    a recording stand-in in tests): ``func(*groups[i], **kwargs)`` on side stream
    ``i % num_streams``, then the ordering described there."""
    current = streams.current()
    side = streams.side_streams(min(num_streams, max(len(groups), 1)))
    for stream in side:
        stream.wait_stream(current)
    results = []
    for i, group in enumerate(groups):
        with streams.use(side[i % len(side)]):
            results.append(func(*group, **kwargs))
    for stream in side:
        current.wait_stream(stream)
    streams.record(results, current)
    return _collect(results)

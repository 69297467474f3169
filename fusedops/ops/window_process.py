"""Swin window ops with the cyclic shift fused: one gather per direction.

``window_partition_roll(x, window_size, shift)``: x (B, H, W, C) -> windows (B*nW, wh, ww, C),
equal to ``window_partition(torch.roll(x, shift, dims=(1, 2)), window_size)`` with the windows of
one image consecutive (row-major over the nH x nW grid of windows, nW = (H/wh)*(W/ww)).

``window_reverse_roll(windows, window_size, H, W, shift)``: windows (B*nW, wh, ww, C) ->
(B, H, W, C), equal to ``torch.roll(window_reverse(windows, window_size, H, W), shift, (1, 2))``.

Swin shifts by ``-s`` before partitioning and by ``+s`` after reversing. Each backward is the
other gather with the shift negated. Shifts are taken modulo H and W. Every backend exposes
``partition(x, wh, ww, sh, sw)`` and ``reverse(windows, wh, ww, H, W, sh, sw)`` on contiguous
inputs with shifts already reduced to ``0 <= sh < H``, ``0 <= sw < W``.

Native backend (the automatic pick on CPU and where no GPU-verified kernel runs): in plain eager
mode ``torch.roll`` + view/permute + one copy with torch's autograd (form (b)), what Swin's own
code runs; the custom ops keep the reference's gathers (no native namespace).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fusedops import dispatch
from fusedops.kernels.shared.window_geometry import partition_shape, reverse_shape
from fusedops.ops._checks import check_tensor
from fusedops.ops._define import apply_function, define_op
from fusedops.ops._eager import eager_fast_path

__all__ = ["window_partition_roll", "window_reverse_roll"]

# ------------------------------------------------------------------------------------------
# Reference (plain PyTorch): the CPU path and the test oracle.


def _ref_partition(x, wh: int, ww: int, sh: int, sw: int) -> torch.Tensor:
    batch, height, width, channels = x.shape
    if sh or sw:
        x = torch.roll(x, (sh, sw), dims=(1, 2))
    out = x.new_empty(partition_shape(x, wh, ww))
    grid = x.view(batch, height // wh, wh, width // ww, ww, channels).permute(0, 1, 3, 2, 4, 5)
    out.view(batch, height // wh, width // ww, wh, ww, channels).copy_(grid)
    return out


def _ref_reverse(windows, wh: int, ww: int, height: int, width: int, sh: int, sw: int):
    shape = reverse_shape(windows, wh, ww, height, width)
    batch, channels = shape[0], shape[-1]  # explicit: a view(-1, ...) of no elements is ambiguous
    grid = windows.view(batch, height // wh, width // ww, wh, ww, channels)
    out = windows.new_empty(shape)
    out.view(batch, height // wh, wh, width // ww, ww, channels).copy_(
        grid.permute(0, 1, 3, 2, 4, 5)
    )
    return torch.roll(out, (sh, sw), dims=(1, 2)) if (sh or sw) else out


reference = SimpleNamespace(partition=_ref_partition, reverse=_ref_reverse)

for _name in ("window_partition_roll", "window_reverse_roll"):
    dispatch.register_op(
        _name,
        reference,
        kernels="window_process",
    )


def _mod(shift: int, size: int) -> int:
    return shift % size if size else 0


# ------------------------------------------------------------------------------------------
# Custom ops: each direction's backward is the other gather with the shift negated.


def _partition(
    x: torch.Tensor, window_h: int, window_w: int, shift_h: int, shift_w: int, backend: str | None
) -> torch.Tensor:
    impl = dispatch.select("window_partition_roll", x, backend=backend)
    return impl.partition(
        x, window_h, window_w, _mod(shift_h, x.shape[1]), _mod(shift_w, x.shape[2])
    )


def _reverse(
    windows: torch.Tensor,
    window_h: int,
    window_w: int,
    height: int,
    width: int,
    shift_h: int,
    shift_w: int,
    backend: str | None,
) -> torch.Tensor:
    impl = dispatch.select("window_reverse_roll", windows, backend=backend)
    return impl.reverse(
        windows, window_h, window_w, height, width, _mod(shift_h, height), _mod(shift_w, width)
    )


def _partition_backward(
    grad: torch.Tensor,
    window_h: int,
    window_w: int,
    height: int,
    width: int,
    shift_h: int,
    shift_w: int,
    backend: str | None,
) -> torch.Tensor:
    return _reverse(
        grad.contiguous(), window_h, window_w, height, width, -shift_h, -shift_w, backend
    )


def _reverse_backward(
    grad: torch.Tensor,
    window_h: int,
    window_w: int,
    shift_h: int,
    shift_w: int,
    backend: str | None,
) -> torch.Tensor:
    return _partition(grad.contiguous(), window_h, window_w, -shift_h, -shift_w, backend)


def _partition_fake(x, window_h, window_w, shift_h, shift_w, backend):
    return x.new_empty(partition_shape(x, window_h, window_w))


def _reverse_fake(windows, window_h, window_w, height, width, shift_h, shift_w, backend):
    return windows.new_empty(reverse_shape(windows, window_h, window_w, height, width))


def _partition_backward_fake(grad, window_h, window_w, height, width, shift_h, shift_w, backend):
    return _reverse_fake(grad, window_h, window_w, height, width, shift_h, shift_w, backend)


def _reverse_backward_fake(grad, window_h, window_w, shift_h, shift_w, backend):
    return _partition_fake(grad, window_h, window_w, shift_h, shift_w, backend)


def _setup_partition(ctx, inputs, output):
    x, ctx.window_h, ctx.window_w, ctx.shift_h, ctx.shift_w, _ = inputs
    ctx.height, ctx.width = x.shape[1], x.shape[2]


def _partition_grads(ctx, backward, grad):
    return backward(
        grad,
        ctx.window_h,
        ctx.window_w,
        ctx.height,
        ctx.width,
        ctx.shift_h,
        ctx.shift_w,
        ctx.backend,
    )


def _setup_reverse(ctx, inputs, output):
    _, ctx.window_h, ctx.window_w, _, _, ctx.shift_h, ctx.shift_w, _ = inputs


def _reverse_grads(ctx, backward, grad):
    return backward(grad, ctx.window_h, ctx.window_w, ctx.shift_h, ctx.shift_w, ctx.backend)


WINDOW_PARTITION_ROLL = define_op(
    "window_partition_roll",
    forward=_partition,
    fake=_partition_fake,
    backward=_partition_backward,
    backward_fake=_partition_backward_fake,
    setup_context=_setup_partition,
    grads=_partition_grads,
)

WINDOW_REVERSE_ROLL = define_op(
    "window_reverse_roll",
    forward=_reverse,
    fake=_reverse_fake,
    backward=_reverse_backward,
    backward_fake=_reverse_backward_fake,
    setup_context=_setup_reverse,
    grads=_reverse_grads,
)

# ------------------------------------------------------------------------------------------
# Argument checks and the functional API.


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return value


def _pair(value, name: str, *, positive: bool) -> tuple[int, int]:
    """An int or a pair of ints as (h, w); TypeError/ValueError naming ``name``."""
    if type(value) is int:  # the common case, without the general checks' calls
        if positive and value < 1:
            raise ValueError(f"{name} must be positive, got {value!r}")
        return (value, value)
    pair = (value, value) if isinstance(value, (int, torch.SymInt)) else value
    if not isinstance(pair, (tuple, list, torch.Size)) or len(pair) != 2:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    pair = (_int(pair[0], name), _int(pair[1], name))
    if positive and min(pair) < 1:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return pair


def _check_divisible(what: str, height: int, width: int, window: tuple[int, int]) -> None:
    """H and W (of ``what``) must be positive multiples of the window."""
    if height >= 1 and width >= 1 and not height % window[0] and not width % window[1]:
        return
    for axis, size, win in (("height", height, window[0]), ("width", width, window[1])):
        if size < 1:
            raise ValueError(f"{what}: {axis} must be at least 1, got {size}")
        if size % win:
            raise ValueError(
                f"{what}: {axis} {size} is not divisible by window_size {win} "
                "(pad the feature map to a multiple of the window first)"
            )


def _check_4d(t: torch.Tensor, name: str, layout: str) -> None:
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")


def window_partition_roll(
    x: torch.Tensor, window_size, shift=0, *, backend: str | None = None
) -> torch.Tensor:
    """Cyclic shift then window partition, in one gather.

    x: (B, H, W, C) float16/bfloat16/float32 (float64 on the reference backend), H and W
    multiples of the window. window_size, shift: int or (h, w); shift as ``torch.roll``'s
    (Swin passes ``-shift_size``), any value (taken modulo H and W). Returns a contiguous
    (B * H/wh * W/ww, wh, ww, C) tensor of x's dtype, the windows of each image consecutive.
    Differentiable (the backward is ``window_reverse_roll`` with ``-shift``).
    """
    check_tensor(x, "x")
    _check_4d(x, "x", "(B, H, W, C)")
    window = _pair(window_size, "window_size", positive=True)
    shifts = _pair(shift, "shift", positive=False)
    _check_divisible("x", x.shape[1], x.shape[2], window)
    x = x.contiguous()
    if eager_fast_path(x):  # plain eager: what WINDOW_PARTITION_ROLL(...) would check again
        if dispatch.pick("window_partition_roll", x, backend=backend) == "native":
            return _own(_native_partition(x, *window, *shifts), x)
        return apply_function(WINDOW_PARTITION_ROLL.function, (x, *window, *shifts, backend))
    return WINDOW_PARTITION_ROLL(x, *window, *shifts, backend)


def window_reverse_roll(
    windows: torch.Tensor, window_size, height: int, width: int, shift=0, *, backend=None
) -> torch.Tensor:
    """Window reverse then cyclic shift, in one gather (the inverse of window_partition_roll
    with the opposite shift).

    windows: (B * H/wh * W/ww, wh, ww, C) float16/bfloat16/float32 (float64 on the reference
    backend). window_size, shift: int or (h, w) (Swin passes ``+shift_size``); height, width: the
    feature map's H and W, multiples of the window. Returns a contiguous (B, H, W, C) tensor.
    """
    check_tensor(windows, "windows")
    _check_4d(windows, "windows", "(B*nW, wh, ww, C)")
    window = _pair(window_size, "window_size", positive=True)
    shifts = _pair(shift, "shift", positive=False)
    size = (_int(height, "height"), _int(width, "width"))
    _check_divisible("height/width", *size, window)
    if tuple(windows.shape[1:3]) != window:
        raise ValueError(
            f"windows has windows of {tuple(windows.shape[1:3])}, expected window_size {window}"
        )
    per_image = (size[0] // window[0]) * (size[1] // window[1])
    if windows.shape[0] % per_image:
        raise ValueError(
            f"windows has {windows.shape[0]} windows, not a multiple of the {per_image} windows "
            f"of one {size[0]}x{size[1]} map"
        )
    windows = windows.contiguous()
    if eager_fast_path(windows):  # as in window_partition_roll
        if dispatch.pick("window_reverse_roll", windows, backend=backend) == "native":
            return _own(_native_reverse(windows, *window, *size, *shifts), windows)
        return apply_function(
            WINDOW_REVERSE_ROLL.function, (windows, *window, *size, *shifts, backend)
        )
    return WINDOW_REVERSE_ROLL(windows, *window, *size, *shifts, backend)


def _own(out: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """out, copied where it is a view of ``source`` (no shift and a single window column)."""
    return out.clone() if out.data_ptr() == source.data_ptr() and out.numel() else out


def _native_partition(x, wh: int, ww: int, sh: int, sw: int) -> torch.Tensor:
    """The native path in eager mode: roll, view, permute, one copy (torch's autograd)."""
    batch, height, width, channels = x.shape  # height, width >= 1 (checked)
    if sh % height or sw % width:
        x = torch.roll(x, (sh, sw), dims=(1, 2))
    grid = x.view(batch, height // wh, wh, width // ww, ww, channels).permute(0, 1, 3, 2, 4, 5)
    return grid.reshape(batch * (height // wh) * (width // ww), wh, ww, channels)


def _native_reverse(windows, wh: int, ww: int, height: int, width: int, sh: int, sw: int):
    """The native path in eager mode: view, permute, one copy, roll (torch's autograd)."""
    shape = reverse_shape(windows, wh, ww, height, width)
    batch, channels = shape[0], shape[-1]
    grid = windows.view(batch, height // wh, width // ww, wh, ww, channels)
    out = grid.permute(0, 1, 3, 2, 4, 5).reshape(shape)
    # height, width >= 1 (checked)
    return torch.roll(out, (sh, sw), dims=(1, 2)) if (sh % height or sw % width) else out

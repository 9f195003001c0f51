"""Buffers whose rows lie further apart than their width own the gap after the last row.

`torch.empty_strided((n, v), (s, 1))` with s > v allocates (n - 1) * s + v elements: the
gap after every row but the last is the buffer's own, the last row's is not (whatever
the allocator puts there). fuser::cross_entropy's gradient has such rows (V rounded up
to 16 bytes, dynamo/ce_op.py), and the backward reads it as [n, s] rows whose extra
columns it zeroes first (dynamo/ce_pad.py): a view instead of a padded copy, which needs
every row's gap to be the buffer's. So every allocation of such a layout, by the ops
themselves, the kernels' runtime or the call program, spans whole rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def strided_extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements empty_strided allocates for this layout: up to the last element."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))


def whole_extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements a layout spans with each dim's last step whole (the gap after the last
    row included): the largest size * stride, for layouts whose elements do not overlap."""
    if any(s == 0 for s in shape):
        return 0
    return max([size * st for size, st in zip(shape, stride)] + [1])


def has_gap(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a buffer of this layout spans more than empty_strided allocates."""
    return whole_extent(shape, stride) > strided_extent(shape, stride)


def empty_whole(
    shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """empty_strided(shape, stride) whose storage spans whole rows (whole_extent); the
    same as empty_strided where the layout has no gap. Not a view: its own storage, set
    to the layout (a custom op may return it)."""
    extent = whole_extent(shape, stride)
    if extent <= strided_extent(shape, stride):
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    storage = torch.empty(extent, dtype=dtype, device=device).untyped_storage()
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape, stride)


def restride(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """`t` with these strides: itself when it has them, else a copy (whole rows where the
    layout has gaps). Called per call by call programs and fused regions: no conversions."""
    if t.stride() == stride:
        return t
    return empty_whole(t.shape, stride, t.dtype, t.device).copy_(t)

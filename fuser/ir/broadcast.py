"""Broadcasts over part of the row dims: which operand dim each of a kernel's row dims
reads (the segmenter maps them onto a kernel input's per-dim row strides; a pass moves
casts after them so that their operand stays a kernel input)."""

from __future__ import annotations

from fuser.ir.graph import Node

__all__ = ["row_map"]


def row_map(node: Node, domain: tuple[int, ...]) -> tuple[int, ...] | None:
    """For a broadcast to the whole domain whose operand varies along some of the row
    dims but not all (rotary cos [B, T, D] for q [B, H, T, D]): per row dim of the
    domain, the operand dim it reads (-1 where it is broadcast). None for any other
    broadcast (those map onto FULL, ROW, COL or SCALAR as they are)."""
    x, bdims = node.inputs[0], node.attr("broadcast_dims")
    lead = len(domain) - 1
    if lead < 1 or tuple(node.out.shape) != domain:
        return None
    real = {d: i for i, d in enumerate(bdims) if d < lead and x.shape[i] != 1}
    wanted = {d for d in range(lead) if domain[d] != 1}
    if not real or set(real) == wanted:
        return None
    return tuple(real.get(d, -1) for d in range(lead))

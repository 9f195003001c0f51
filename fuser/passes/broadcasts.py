"""Move a cast after a broadcast over part of the row dims.

A kernel reads such a broadcast (rotary cos/sin [B, T, D] for q [B, H, T, D]) straight
from its operand in memory, through per-dim row strides (ir/broadcast.row_map), so the
operand must be a kernel input. A bf16 model casts cos to float32 first, which would make
the operand a value the kernel computes and the broadcast a separate kernel writing
[B, H, T, D]: broadcast_in_dim(cast(x)) becomes cast(broadcast_in_dim(x)), the same values
(a cast is elementwise), cast per element of the domain inside the kernel.
"""

from __future__ import annotations

from fuser.ir.broadcast import row_map
from fuser.ir.graph import Graph, Node
from fuser.ir.ops import Op
from fuser.passes.rewriter import Rewriter


def _cast_under(node: Node, producer: dict[int, Node]) -> Node | None:
    """The cast feeding `node` when `node` is a broadcast over part of its row dims."""
    if node.op != Op.BROADCAST_IN_DIM or row_map(node, tuple(node.out.shape)) is None:
        return None
    src = producer.get(node.inputs[0].id)
    return src if src is not None and src.op == Op.CAST else None


def has_cast_row_broadcasts(graph: Graph) -> bool:
    producer = {v.id: n for n in graph.nodes for v in n.outputs}
    return any(_cast_under(n, producer) for n in graph.nodes)


def casts_after_row_broadcasts(graph: Graph) -> Graph:
    """broadcast_in_dim(cast(x)) -> cast(broadcast_in_dim(x)) for the broadcasts over part
    of the row dims (the cast itself stays for its other users; DCE drops it otherwise)."""
    producer = {v.id: n for n in graph.nodes for v in n.outputs}
    rw = Rewriter(graph, "casts_after_row_broadcasts")
    for node in graph.nodes:
        cast = _cast_under(node, producer)
        if cast is None:
            rw.keep(node)
            continue
        (x,) = rw.args(cast)
        b = rw.ops.broadcast_in_dim(
            x, shape=node.attr("shape"), broadcast_dims=node.attr("broadcast_dims")
        )
        rw.replace(node, [rw.ops.cast(b, cast.attr("dtype"))])
    return rw.finish()

"""What the backward keeps from the forward: the partition functions fuser hands AOTAutograd.

AOTAutograd traces forward and backward as one joint graph, and a partitioner decides
which forward values are saved for the backward. The min-cut partitioner recomputes cheap
elementwise ops in the backward when that saves memory, but it must save any value that
an op it does not know (nll_loss_backward, say) takes as an operand.

nll_loss_backward takes the log-probabilities only for their shape: it never reads them.
Left as is, the partitioner saves them: for GPT-2's loss that is a [B*T, vocab] fp32
tensor, 3.3 GB at B=16, T=1024, and the largest thing alive when the backward starts.
`shape_only_operands` hands nll_loss_backward a zero-stride view of a scalar of the same
shape and dtype instead, so the log-probabilities are recomputed in the backward from the
bf16 logits and two per-row values (with _log_softmax decomposed, see backend.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

aten = torch.ops.aten

# op -> positions of the operands it uses for their shape, dtype and device only
_SHAPE_ONLY = {
    aten.nll_loss_backward.default: (1,),
    aten.nll_loss2d_backward.default: (1,),
}


def shape_only_operands(gm: fx.GraphModule) -> int:
    """Replace operands used only for their shape by an expanded scalar; returns how many."""
    graph = gm.graph
    replaced = 0
    for node in list(graph.nodes):
        for pos in _SHAPE_ONLY.get(node.target, ()):
            arg = node.args[pos] if pos < len(node.args) else None
            val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
            if not isinstance(val, torch.Tensor) or val.dim() == 0:
                continue
            shape = list(val.shape)
            with graph.inserting_before(node):
                scalar = graph.call_function(
                    aten.full.default,
                    ([], 0),
                    {"dtype": val.dtype, "device": val.device, "pin_memory": False},
                )
                scalar.meta["val"] = val.new_zeros(())
                stand_in = graph.call_function(aten.expand.default, (scalar, shape))
                stand_in.meta["val"] = scalar.meta["val"].expand(shape)
            node.update_arg(pos, stand_in)
            replaced += 1
    if replaced:
        graph.eliminate_dead_code()
        gm.recompile()
    return replaced


def partition_fn(kind: str) -> Any:
    """AOTAutograd's partitioner of that kind ("min_cut" or "default"), after the rewrite."""
    from torch._functorch import partitioners

    inner = (
        partitioners.min_cut_rematerialization_partition
        if kind == "min_cut"
        else partitioners.default_partition
    )

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        shape_only_operands(joint)
        return inner(joint, joint_inputs, **kwargs)

    return partition

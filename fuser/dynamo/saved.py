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

`saved_for_backward` lists what a partitioned forward graph keeps (its outputs that
AOTAutograd labels saved for the backward); `fuser.explain` prints its summary under each
forward graph, and tests/test_saved_bytes.py holds GPT-2's and Llama's to their sizes.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fuser.dynamo.causal_mask import causal_masks
from fuser.dynamo.ce_pad import mark_saved_gradients
from fuser.dynamo.tidy import is_view

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
            with graph.inserting_before(node):
                shape = _size_args(graph, arg, val)
                scalar = graph.call_function(
                    aten.full.default,
                    ([], 0),
                    {"dtype": val.dtype, "device": val.device, "pin_memory": False},
                )
                scalar.meta["val"] = val.new_zeros(())
                stand_in = graph.call_function(aten.expand.default, (scalar, shape))
                stand_in.meta["val"] = scalar.meta["val"].expand(val.shape)
            node.update_arg(pos, stand_in)
            replaced += 1
    if replaced:
        graph.eliminate_dead_code()
        gm.recompile()
    return replaced


def _size_args(graph: fx.Graph, arg: fx.Node, val: torch.Tensor) -> list[Any]:
    """The sizes of `arg` as an expand's arguments: ints, and for a symbolic size the node
    that holds it (a SymInt graph input of that symbol, else a sym_size of arg). A raw
    SymInt in a node's arguments is printed as the value it had when traced: the stand-in
    kept the first call's sizes and the backward of the next shape failed."""
    symbols = {
        n.meta["val"].node.expr: n
        for n in graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)
    }
    sizes: list[Any] = []
    for i, d in enumerate(val.shape):
        if not isinstance(d, torch.SymInt):
            sizes.append(int(d))
            continue
        known = symbols.get(d.node.expr)
        if known is None:
            known = graph.call_function(aten.sym_size.int, (arg, i))
            known.meta["val"] = d
        sizes.append(known)
    return sizes


def partition_fn(kind: str) -> Any:
    """AOTAutograd's partitioner of that kind ("min_cut" or "default"), after the rewrite."""
    from torch._functorch import partitioners

    inner = (
        partitioners.min_cut_rematerialization_partition
        if kind == "min_cut"
        else partitioners.default_partition
    )

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        causal_masks(joint)  # forward and backward attentions together; the mask unsaved
        shape_only_operands(joint)
        mark_saved_gradients(joint)  # the backward may read them as padded rows
        fw, bw = inner(joint, joint_inputs, **kwargs)
        save_before_mutation(fw)
        return fw, bw

    return partition


def save_before_mutation(fw: fx.GraphModule) -> int:
    """Save a copy of each saved tensor that is (a view of) a forward input the forward
    writes in place; returns how many.

    A program that changes an input which needs no grad after using it (`w / (x * x + 1)`,
    then `x.mul_(0.5)`) keeps that write in the forward graph as `copy_(x, new)` at its end,
    while the partitioner may save x itself for the backward (to recompute x * x + 1 there,
    or because an op's backward reads it): the backward then reads the new values, and the
    gradient is silently wrong. torch 2.13's aot_eager and Inductor give the wrong gradient
    (found by fuser.fuzz.programs). A copy made where the value is defined, before the
    write, keeps what the backward needs."""
    graph = fw.graph
    written = {
        n.args[0]
        for n in graph.nodes
        if n.op == "call_function"
        and n.target is aten.copy_.default
        and n.args[0].op == "placeholder"
    }
    output = next((n for n in graph.nodes if n.op == "output"), None)
    descs = (output.meta.get("desc") or []) if output is not None else []
    if not written or not descs:
        return 0
    values = list(output.args[0])
    copied = 0
    for i, (desc, v) in enumerate(zip(descs, values)):
        if not type(desc).__name__.startswith("SavedForBackwards") or not isinstance(v, fx.Node):
            continue
        base = v  # what v's memory is: through views (a split's pieces too) to their source
        while base.op == "call_function" and (
            is_view(base.target)
            or (base.target is operator.getitem and is_view(base.args[0].target))
        ):
            base = base.args[0]
        if base not in written:
            continue
        # after v, or after the last input where v is one (inputs stay first)
        at = v if v.op != "placeholder" else list(graph.find_nodes(op="placeholder"))[-1]
        with graph.inserting_after(at):
            clone = graph.call_function(aten.clone.default, (v,))
            clone.meta["val"] = v.meta["val"].clone()
        values[i] = clone
        copied += 1
    if copied:
        output.args = (tuple(values),) + tuple(output.args[1:])
        fw.recompile()
    return copied


@dataclass(frozen=True)
class SavedTensor:
    """One value a forward graph keeps for the backward."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int | None  # its elements' bytes (a view: its own); None for symbolic sizes
    is_input: bool  # a graph input (a parameter, say) kept as is: no memory of its own


def saved_for_backward(gm: fx.GraphModule) -> list[SavedTensor]:
    """The tensors a partitioned forward graph returns for the backward, in output order
    (AOTAutograd's descriptors on the output node say which; none there: an empty list).
    Saved sizes (SymInts) are left out: they are not tensors."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None:
        return []
    descs = output.meta.get("desc") or []
    values = output.args[0] if output.args else ()
    if not descs or not isinstance(values, (list, tuple)):
        return []
    out = []
    for desc, value in zip(descs, values):
        if not type(desc).__name__.startswith("SavedForBackwards"):
            continue
        val = value.meta.get("val") if isinstance(value, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        shape = tuple(val.shape)
        concrete = all(isinstance(d, int) for d in shape)
        size = val.element_size() * val.numel() if concrete else None
        is_input = value.op == "placeholder"
        out.append(SavedTensor(value.name, shape, val.dtype, size, is_input))
    return out


def saved_summary(saved: list[SavedTensor]) -> str:
    """One line: how many tensors the backward keeps, and the bytes by dtype of those
    the forward computed (the inputs kept, parameters say, take no memory of their own)."""
    inputs = sum(s.is_input for s in saved)
    head = f"saved for the backward: {len(saved)} tensors ({inputs} of them graph inputs)"
    made = [s for s in saved if not s.is_input]
    if not made:
        return head
    if any(s.nbytes is None for s in made):
        return f"{head}; symbolic sizes"
    by_dtype: Counter[torch.dtype] = Counter()
    count: Counter[torch.dtype] = Counter()
    for s in made:
        by_dtype[s.dtype] += s.nbytes or 0
        count[s.dtype] += 1
    parts = [
        f"{str(d).removeprefix('torch.')} {_mb(b)} in {count[d]}"
        for d, b in sorted(by_dtype.items(), key=lambda kv: (-kv[1], str(kv[0])))
    ]
    return f"{head}; computed: {_mb(sum(by_dtype.values()))} ({', '.join(parts)})"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 10_000 else f"{nbytes} B"

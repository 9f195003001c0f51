"""Which FX nodes fuser can take, and why the others stay ATen calls.

A node is fusible when its lowering succeeds on its own: it is lowered into a scratch
FusionDefinition whose inputs are the node's operands. The lowering is the single source
of truth, so `explain` reports exactly the message that stopped it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

import fuser.dynamo.ce_lower  # noqa: F401  (registers the lowerings)
import fuser.dynamo.composites  # noqa: F401
import fuser.dynamo.indexing  # noqa: F401
import fuser.dynamo.layout  # noqa: F401
import fuser.dynamo.pointwise  # noqa: F401
import fuser.dynamo.reductions  # noqa: F401
from fuser.dynamo.context import EXPLAINED, FREE, LOWERINGS, LowerCtx, NotLowerable
from fuser.errors import FuserError
from fuser.frontend.fusion_definition import FusionDefinition

aten = torch.ops.aten

# pure Python calls FX graphs contain besides ATen ops (size arithmetic on SymInts)
_PURE_PY = {
    operator.getitem,
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.truediv,
    operator.mod,
    operator.neg,
    operator.pow,
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
}

# why an op with no lowering stays in ATen: (test on the op's base name, reason)
_CATEGORIES = [
    (
        lambda b: (
            b in {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_int_mm"}
            or b.startswith("convolution")
        ),
        "matmul/convolution: stays with cuBLAS/cuDNN through ATen",
    ),
    (
        lambda b: "attention" in b or "scaled_dot_product" in b,
        "attention: stays with ATen's SDPA kernels",
    ),
    (
        lambda b: b.startswith("embedding_dense_backward"),
        "embedding backward: a scatter-add; fuser's sorted kernel takes it in the graphs "
        "torch.compile hands fuser (indexing.lower_scatters), this one stays ATen",
    ),
    (
        lambda b: (
            b.startswith(("embedding", "index", "gather", "scatter", "_unsafe_index"))
            or b in {"take", "nonzero", "masked_select"}
        ),
        "indexing/gather/scatter: fuser IR reads rows at an index (gather_rows: embedding, "
        "index_select along dim 0 of a 2-D table); row scatter-adds (embedding backward, "
        "index_add, index_put with accumulate) run in fuser's scatter kernel; other "
        "indexed stores stay ATen",
    ),
    (
        lambda b: (
            b
            in {
                "t",
                "transpose",
                "permute",
                "split",
                "split_with_sizes",
                "slice",
                "select",
                "cat",
                "stack",
                "squeeze",
                "as_strided",
                "unbind",
                "narrow",
                "chunk",
                "constant_pad_nd",
                "slice_backward",
                "select_backward",
                "detach",
                "lift_fresh_copy",
                "_reshape_alias",
                "unfold",
                "flip",
                "roll",
            }
        ),
        "layout op: an ATen view (free) or a copy that fuser IR cannot express (no "
        "transpose or reshape; slices and cats along the last dim only)",
    ),
    (
        lambda b: (
            b
            in {
                "arange",
                "empty",
                "empty_strided",
                "zeros",
                "ones",
                "new_empty",
                "new_zeros",
                "full_like",
                "zeros_like",
                "ones_like",
                "empty_like",
            }
        ),
        "allocation/constant factory: stays an ATen call",
    ),
]


def op_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}" + (
            f".{t._overloadname}" if t._overloadname != "default" else ""
        )
    return getattr(t, "__name__", str(t))


def is_side_effect(node: fx.Node) -> bool:
    """Mutation, RNG, asserts, and anything unknown: never moved past one another."""
    if node.op in ("call_module", "call_method"):
        return True
    if node.op != "call_function":
        return False
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        schema = t._schema
        return (
            schema.is_mutable
            or torch.Tag.nondeterministic_seeded in t.tags
            or len(schema.returns) == 0
        )
    if t in _PURE_PY or getattr(t, "__module__", "") in ("_operator", "math"):
        return False
    return not str(getattr(t, "__module__", "")).startswith("torch.fx.experimental.sym_node")


def fallback_reason(node: fx.Node) -> str:
    """Why a node without a lowering stays an ATen call."""
    t = node.target
    if node.op != "call_function":
        return f"{node.op} nodes stay as they are"
    if "fuser_attention" in node.meta:  # an attention: template or SDPA (dynamo/attention.py)
        return node.meta["fuser_attention"]
    if "fuser_scatter" in node.meta:  # a scatter-add: fuser's kernel or ATen (indexing.py)
        return node.meta["fuser_scatter"]
    if "fuser_gemm" in node.meta:  # a matmul: GEMM template or cuBLAS (dynamo/gemm.py)
        return node.meta["fuser_gemm"]
    if t in EXPLAINED:  # fuser's own composite call (dynamo/linear_ce.py)
        return EXPLAINED[t](node)
    if not isinstance(t, torch._ops.OpOverload):
        return f"Python call {op_name(node)} (size arithmetic or a higher-order op)"
    base = t._schema.name.split("::")[-1]
    for test, why in _CATEGORIES:
        if test(base):
            return why
    if t._schema.is_mutable:
        return "in-place/mutating op: stays in ATen, in program order"
    if torch.Tag.nondeterministic_seeded in t.tags:
        return "random op: stays in ATen so the random stream matches eager"
    return f"no fuser lowering for {op_name(node)}"


def try_lower(node: fx.Node) -> str | None:
    """None if the node lowers on its own; otherwise the reason it does not."""
    fn = LOWERINGS.get(node.target)
    if fn is None:
        return fallback_reason(node)
    if unsized := _data_dependent(node):
        return f"{unsized} has sizes that depend on the data (a nonzero's, say): stays ATen"
    if empty := _empty(node):
        return f"{empty} is empty: no work for a kernel, stays ATen"
    fd = FusionDefinition("probe")
    ctx = LowerCtx(fd)
    try:
        for p in node.all_input_nodes:
            ctx.define_input(p)
        fn(ctx, node)
    except (NotLowerable, FuserError) as e:
        return str(e)
    except Exception as e:  # a lowering bug must not break compilation: ATen runs it
        return f"lowering failed ({type(e).__name__}: {e})"
    return None


def _values(node: fx.Node) -> list[tuple[fx.Node, torch.Tensor]]:
    """The tensors of `node`'s operands and result, each with the node that makes it."""
    out = []
    for n in (*node.all_input_nodes, node):
        vals = n.meta.get("val")
        for v in vals if isinstance(vals, (tuple, list)) else [vals]:
            if isinstance(v, torch.Tensor):
                out.append((n, v))
    return out


def _data_dependent(node: fx.Node) -> str | None:
    """The first operand or result of `node` whose sizes are symbols no input size fixes
    (unbacked: asking whether such a size is 0 raises, and a kernel is planned for
    concrete sizes)."""
    for n, v in _values(node):
        if not all(isinstance(d, int) for d in v.shape):
            return "the result" if n is node else f"operand {n.name}"
    return None


def _empty(node: fx.Node) -> str | None:
    """The first operand or result of `node` with no elements (ATen's empty-tensor rules,
    such as var of nothing being NaN, are not worth a kernel). A cat skips its empty
    pieces (layout.py): only its result counts."""
    for n, v in _values(node):
        if node.target is aten.cat.default and n is not node:
            continue
        if v.numel() == 0:
            return "the result" if n is node else f"operand {n.name}"
    return None


def is_free(node: fx.Node) -> bool:
    """A view, constant or identity: no work of its own, so a region of nothing else stays
    ATen. A clone that gathers a non-contiguous tensor (the padded lm head's logits sliced
    back, say) into a contiguous one is a copy: a fused kernel does it at the bandwidth,
    where ATen's strided copy runs at about half of it."""
    return node.target in FREE and not _gathers(node)


def _gathers(node: fx.Node) -> bool:
    if node.target is not torch.ops.aten.clone.default or not node.args:
        return False
    src = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    try:
        return not src.is_contiguous() and out.is_contiguous() and src.numel() >= 1 << 20
    except Exception:  # symbolic sizes: leave it as it was
        return False


def describe(node: fx.Node) -> str:
    """`name = op(args)` with shapes, for explain."""
    val: Any = node.meta.get("val")
    shape = ""
    if isinstance(val, torch.Tensor):
        shape = f" -> {str(val.dtype).replace('torch.', '')}{list(val.shape)}"
    return f"{node.name} = {op_name(node)}{shape}"


def _graph_copy(gm: fx.GraphModule) -> fx.Graph:
    """gm's graph copied; the output node keeps its meta (AOTAutograd's labels of which
    outputs are saved for the backward)."""
    graph = fx.Graph()
    out = graph.output(graph.graph_copy(gm.graph, {}))
    out.meta.update(next(n for n in gm.graph.nodes if n.op == "output").meta)
    return graph


def copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of gm whose graph passes may edit."""
    return fx.GraphModule(gm, _graph_copy(gm), gm.__class__.__name__)


class DraftModule(fx.GraphModule):
    """A GraphModule that is only edited and read as a graph (lowering's passes, shape
    propagation through fx's Interpreter), never called: it generates no Python source,
    which for a whole training graph costs ~0.1 s each time a pass recompiles it."""

    def recompile(self) -> Any:  # type: ignore[override]
        return None


def draft_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of gm for passes to edit, without Python source (DraftModule)."""
    return DraftModule(gm, _graph_copy(gm), gm.__class__.__name__)

"""Pad large matmuls whose sizes are not multiples of 16 bytes, so cuBLAS can use its fast
kernels.

GPT-2's vocabulary, 50257, is odd. A matmul with a 50257 dimension, or with 50257-element
rows, leaves cuBLAS only its 2-byte-aligned kernels: on an H100 the three lm-head matmuls
of a GPT-2 124M step (B=16, T=1024, bf16) took 30 ms that way, against about 6 ms aligned.
So, on the FX graph before fusion, each such matmul is rewritten as one on zero-padded
operands, its result sliced back:

    mm(a [M, K], b [K, N])  ->  mm(pad(a) [M', K'], pad(b) [K', N'])[:M, :N]

with M', K', N' rounded up to 16 bytes of the dtype. Zeros added along K add nothing to
any dot product; rows and columns added along M and N are sliced away. The slice is a
view whose rows are 16-byte aligned, which the fused kernels after it (the cross-entropy
over the logits) read with wide accesses too. An operand that is a transpose of a tensor
is padded before the transpose, and each tensor is padded once however many matmuls use it
(the logits' gradient feeds two in the backward). Inductor's pad_mm does the same.

Shapes decide, not strides: an odd K costs cuBLAS its fast kernels even where the operand
is a view of aligned rows (H100, bf16, dX of GPT-2's lm head, [16384, 50257] @ [50257,
768] with the gradient's rows 50264 wide: 9.35 ms as it is, 4.15 ms padded, the pad
included; benchmarks/results/h100-2026-11-27-session9). An odd M of such a view's
transpose (dW) is cheap as it is (2.81 ms against 4.07), but the pad made for dX serves
dW too, so padding it as well costs nothing more.

That pad is no copy where the gradient is fuser::cross_entropy's aligned one (ce_op.py):
its rows are K' elements apart already and its buffer spans whole rows, so
ce_pad.padded_rows zeroes the gap columns (N x (K' - K) elements) and hands both
matmuls the [N, K'] rows as a view. As a copy it was 1.28 ms of a GPT-2 124M B=16 step
on an H100 (a 1.6 GB read and write). Any other tensor is padded by a copy: its gap, if
it has one, may hold data (a slice of wider rows).

A graph output that is a padded result (or a view of one) is returned in the padded
rows (a tensor of its own on their storage, returned_alias): eager's stride order, not
eager's strides, as Inductor returns its own
padded matmuls (GPT-2 124M B=16 at V=50257: the returned logits' copy was 1.32 ms a step
on an H100). A caller's `.view(-1, V)`, `.float()`, slicing and eager autograd through it
work; a `.view(-1)` of the whole tensor does not (it needs contiguous rows), and
config.eager_output_strides (FUSER_EAGER_OUTPUT_STRIDES=1) returns a contiguous copy
instead, except of what AOTAutograd marks as saved for the backward.

The rewritten graph's shapes are propagated again; if any node no longer accepts its
inputs (a view that needs contiguity, say), or an as_strided reads storage whose layout
the pad changed (it would read the padded rows as eager's), the graph is left as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.config import config
from fuser.dynamo.ce_pad import padded_rows, padded_width
from fuser.dynamo.support import draft_module

aten = torch.ops.aten

MIN_MACS = 2**30  # smaller matmuls are not worth a copy of their operands
MIN_PADDED_DIM = 512  # pad only large dims: a small odd one costs little as it is
_TRANSPOSES = {aten.t.default, aten.transpose.int, aten.permute.default}


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _elements(dtype: torch.dtype) -> int | None:
    """Elements in 16 bytes, for the float dtypes cuBLAS's tensor-core kernels take."""
    if dtype in (torch.float16, torch.bfloat16):
        return 8
    if dtype == torch.float32:
        return 4
    return None


def _is_2d_transpose(n: Any) -> bool:
    if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target in _TRANSPOSES):
        return False
    v = _val(n)
    if v is None or v.dim() != 2:
        return False
    if n.target == aten.permute.default:
        return [d % 2 for d in n.args[1]] == [1, 0]
    if n.target == aten.transpose.int:  # transpose(1, -1) or (0, 0) swaps nothing
        return {d % 2 for d in n.args[1:3]} == {0, 1}
    return True


class _Padder:
    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.done: dict[tuple[fx.Node, int, int], fx.Node] = {}

    def pad(self, x: fx.Node, before: fx.Node, rows: int, cols: int) -> fx.Node:
        """x ([r, c]) with `rows` zero rows and `cols` zero columns added."""
        if not rows and not cols:
            return x
        if _is_2d_transpose(x):  # pad the source, then transpose: no transposing copy
            src = self.pad(x.args[0], before, cols, rows)
            with self.graph.inserting_before(before):
                return self.graph.call_function(aten.t.default, (src,))
        key = (x, rows, cols)
        if key not in self.done:  # placed before its first use; later uses come after
            # fuser::cross_entropy's aligned gradient: its own rows, gap zeroed (ce_pad.py)
            width = None if rows else padded_width(x, cols)
            with self.graph.inserting_before(before):
                if width is not None:
                    self.done[key] = self.graph.call_function(padded_rows, (x, width))
                else:
                    self.done[key] = self.graph.call_function(
                        aten.constant_pad_nd.default, (x, [0, cols, 0, rows], 0.0)
                    )
        return self.done[key]


def _plan(n: fx.Node) -> tuple[int, int, int, int, int, int] | None:
    """(M, K, N, pad M, pad K, pad N) for a matmul worth padding, else None."""
    if n.target == aten.mm.default:
        a, b = n.args[:2]
    elif n.target == aten.addmm.default:
        if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
            return None
        a, b = n.args[1:3]
    else:
        return None
    va, vb = _val(a), _val(b)
    if va is None or vb is None or va.dim() != 2 or vb.dim() != 2 or va.dtype != vb.dtype:
        return None
    e = _elements(va.dtype)
    dims = [*va.shape, vb.shape[1]]
    if e is None or not all(isinstance(d, int) for d in dims):
        return None  # symbolic sizes: not padded
    m, k, n_ = dims
    if m * k * n_ < MIN_MACS:
        return None
    pads = [(-d) % e if d >= MIN_PADDED_DIM else 0 for d in (m, k, n_)]
    if not any(pads):
        return None
    return m, k, n_, *pads


def _pad_bias(graph: fx.Graph, bias: Any, m: int, n: int, pm: int, pn: int) -> Any:
    """addmm's bias grown with the result: a [N] or [1, N] row gets pn zero columns, a
    full [M, N] bias pm zero rows too; a scalar or a broadcast size-1 dim stays."""
    v = _val(bias)
    if v is None or v.dim() == 0:
        return bias
    cols = pn if v.shape[-1] == n and n != 1 else 0
    rows = pm if v.dim() == 2 and v.shape[0] == m and m != 1 else 0
    if not cols and not rows:
        return bias
    pads = [0, cols] if v.dim() == 1 else [0, cols, 0, rows]
    return graph.call_function(aten.constant_pad_nd.default, (bias, pads, 0.0))


_VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.slice.Tensor,
    aten.t.default, aten.transpose.int, aten.permute.default, aten.expand.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.select.int,
    aten.alias.default, aten.as_strided.default,
}  # fmt: skip


def returned_alias(t: torch.Tensor) -> torch.Tensor:
    """t's elements as a tensor of its own on t's storage, not a view: a graph's output
    that autograd sees as a view made inside the compiled function cannot be modified in
    place by the caller ("Output 0 of ... is a view and is being modified inplace"),
    where eager's result, a tensor of its own, can (`logits[:, banned] = -inf`). The call
    program's memory plan sees the shared storage (the fake values share it) and keeps
    the padded buffer alive."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def _own_output_views(graph: fx.Graph, sliced: list[fx.Node], copy: bool) -> list[int]:
    """A graph output that is a padded result, or a view of one, is returned through
    views of its own, replayed from the padded result: shared with the fused region that
    reads the logits (the cross-entropy), the view would be one of that region's outputs,
    which the region then writes out (on an H100 GPT-2's cross-entropy kernel went from
    2.5 ms to 10 ms that way); the last of them is returned_alias's tensor. With `copy`
    (config.eager_output_strides) they are replayed from a contiguous copy of the padded
    result instead: eager's strides, so a caller's `.view(-1)` works; returned through
    returned_alias too (a view of the copy made inside the compiled function could not
    be modified in place by the caller). A saved output that is also a returned one is
    the returned tensor."""
    output = next(n for n in graph.nodes if n.op == "output")
    seen, stack, reach = set(), list(sliced), set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        reach.add(x)
        stack += [u for u in x.users if u.op == "call_function" and u.target in _VIEWS]
    if not any(x in reach for x in output.all_input_nodes):
        return []

    # AOTAutograd labels a forward graph's outputs: those saved for the backward reach
    # only fuser's own backward graph, which takes any strides, so they keep the padded
    # rows (GPT-2's bf16 logits: a 1.6 GB copy saved per step)
    descs = output.meta.get("desc") or []
    saved = {i for i, d in enumerate(descs) if type(d).__name__ == "SavedForBackwardsAOTOutput"}

    copies: dict[fx.Node, fx.Node] = {}

    def own_views(x: fx.Node) -> fx.Node:
        """x's views replayed from the padded result for the returned tensor alone:
        sharing them, the return would join the fused region that reads the logits
        (the cross-entropy), which would write the view out (fuser/segmenter). With
        `copy` the padded result is copied once, contiguous as eager's, and the views
        are replayed on the copy: eager's strides, and outputs that are views of one
        another share storage as eager's do (a copy per output did not, where
        AOTAutograd does not regenerate the views: under no_grad)."""
        if x not in copies:
            if x in sliced or not isinstance(x.args[0], fx.Node) or x.args[0] not in reach:
                src = x.args[0]
            else:
                src = own_views(x.args[0])
            with graph.inserting_before(output):
                copies[x] = graph.node_copy(x, lambda n: src if n is x.args[0] else n)
                if copy and x in sliced:
                    copies[x] = graph.call_function(
                        aten.clone.default, (copies[x],), {"memory_format": torch.contiguous_format}
                    )
        return copies[x]

    returned: dict[fx.Node, fx.Node] = {}

    def returned_tensor(arg: fx.Node) -> fx.Node:
        with graph.inserting_before(output):
            return graph.call_function(returned_alias, (own_views(arg),))

    outs = output.args[0]
    items = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for i, arg in enumerate(items):
        if isinstance(arg, fx.Node) and arg in reach and i not in saved:
            if arg not in returned:  # `return l, l`: one tensor twice, as eager's
                returned[arg] = returned_tensor(arg)
            items[i] = returned[arg]
    # a saved output that is a returned one is that same tensor, as in AOTAutograd's
    # graph: one version counter, so the caller's in-place change of the returned logits
    # makes the backward raise autograd's error, as eager's does, instead of reading the
    # changed values through a tensor of its own on the same storage
    items = [
        returned.get(a, a) if i in saved and isinstance(a, fx.Node) else a
        for i, a in enumerate(items)
    ]
    output.args = (type(outs)(items) if isinstance(outs, (list, tuple)) else items[0],)
    return [i for i, a in enumerate(items) if i not in saved and a in returned.values()]


def _rewrite(graph: fx.Graph) -> list[str]:
    padder = _Padder(graph)
    notes: list[str] = []
    sliced: list[fx.Node] = []
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        plan = _plan(n)
        if plan is None:
            continue
        m, k, n_, pm, pk, pn = plan
        a, b = (n.args[0], n.args[1]) if n.target == aten.mm.default else n.args[1:3]
        a2, b2 = padder.pad(a, n, pm, pk), padder.pad(b, n, pk, pn)
        with graph.inserting_before(n):
            if n.target == aten.mm.default:
                out = graph.call_function(aten.mm.default, (a2, b2))
            else:
                bias = _pad_bias(graph, n.args[0], m, n_, pm, pn)
                out = graph.call_function(aten.addmm.default, (bias, a2, b2))
            if pm:
                out = graph.call_function(aten.slice.Tensor, (out, 0, 0, m))
            if pn:
                out = graph.call_function(aten.slice.Tensor, (out, 1, 0, n_))
            if pm or pn:
                sliced.append(out)
        n.replace_all_uses_with(out)
        graph.erase_node(n)
        grown = ", ".join(
            f"{name} {d} -> {d + p}"
            for name, d, p in (("M", m, pm), ("K", k, pk), ("N", n_, pn))
            if p
        )
        notes.append(f"{n.name}: {m}x{k}x{n_} padded ({grown}) for cuBLAS's aligned kernels")
    if sliced:
        copy = config.eager_output_strides
        returned = _own_output_views(graph, sliced, copy=copy)
        if returned:
            where = ", ".join(str(i) for i in returned)
            notes.append(
                f"graph output(s) {where}: a padded result, returned as a contiguous copy "
                "(FUSER_EAGER_OUTPUT_STRIDES=1)"
                if copy
                else f"graph output(s) {where}: a padded result, returned in its padded rows "
                "(eager's stride order, no copy; `.view(-1)` needs FUSER_EAGER_OUTPUT_STRIDES=1)"
            )
    return notes


# ops that read their operand's storage by strides they are given, not the operand's
_EXPLICIT_STRIDES = {aten.as_strided.default, aten.as_strided_scatter.default}


def _layout(v: Any) -> tuple | None:
    if not isinstance(v, torch.Tensor):
        return None
    return tuple(v.shape), v.stride(), v.storage_offset()


def _reads_moved_storage(n: fx.Node, before: dict[fx.Node, tuple | None]) -> bool:
    """Whether n reads its operand by explicit strides where the operand's layout is
    new (a padded result, or a view of one): `logits.as_strided((T, 5), (V, 1))` would
    read the padded rows as if they were V wide, shapes propagating all the same."""
    if n.op != "call_function" or n.target not in _EXPLICIT_STRIDES:
        return False
    x = n.args[0]
    return not isinstance(x, fx.Node) or before.get(x) is None or before[x] != _layout(_val(x))


def pad_matmuls(gm: fx.GraphModule) -> list[str]:
    """Pad gm's large unaligned matmuls in place (see the module docstring); returns a
    note per padded matmul. gm is left unchanged when shapes no longer propagate."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    if not any(_plan(n) for n in gm.graph.nodes if n.op == "call_function"):
        return []
    inputs = [_val(n) for n in gm.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode(inputs)
    if mode is None or any(v is None for v in inputs):
        return []
    trial = draft_module(gm)  # shapes propagate through the graph: it needs no source
    notes = _rewrite(trial.graph)
    # the views that fed the old matmuls (grad.t() of the lm head's weight gradient) are
    # dead now; left in, they would make a fused region keep the unpadded tensor too
    trial.graph.eliminate_dead_code()
    before = {n: _layout(_val(n)) for n in trial.graph.nodes}
    try:
        FakeTensorProp(trial, mode).propagate_dont_convert_inputs(*inputs)
    except Exception:  # a node that does not take the padded (strided) result
        return []
    if any(_reads_moved_storage(n, before) for n in trial.graph.nodes):
        return []
    gm.graph = trial.graph  # the setter regenerates gm's source (none for a draft)
    return notes

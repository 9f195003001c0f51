"""Lower mm/addmm and the pointwise work around them to the GEMM template (FUSER_GEMM).

On the AOTAutograd graph, before partitioning, each mm/addmm is matched with the work the
template fuses (schedulers/gemm.Epilogue), looking through the row views AOTAutograd puts
between a [M, N] matmul and its [B, T, N] consumers:

    forward    addmm(b, x, wᵀ) -> gelu        (+ the pre-activation, when it is saved)
               addmm(b, x, wᵀ) -> + residual
    backward   mm(dy, w) -> gelu_backward(., pre)        dX with the GELU backward
               mm(dyᵀ, x) and sum(dy, [0])               dW with the bias gradient
    prologue   mm(cast(x) [* s], w)                      when the cast has no other use

A chosen match becomes one call_function node (a GemmCall) returning (C, [the
pre-activation], [the sums]) whose getitems (row views of them where the old nodes were
[B, T, N]) replace the matched nodes; the matched nodes are erased. Each match's choice
(schedulers/gemm_choice.choose: FUSER_GEMM, the backend, the estimate or measurement) is one
note explain shows. The CUDA backend has no template: it routes bias + tanh-GELU (with
no saved pre-activation) to cuBLASLt's GELU epilogue (aten._addmm_activation) on a GPU.
FUSER_GEMM=aten (the default) leaves the graph as it is.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from fuser.backends.registry import get_backend
from fuser.config import config
from fuser.dynamo.gemm_call import GemmCall
from fuser.dynamo.pad_mm import _is_2d_transpose
from fuser.runtime.gemm import shape_of
from fuser.runtime.gemm_tune import decide
from fuser.schedulers.gemm import DTYPES, Epilogue, GemmPlan, GemmShape

aten = torch.ops.aten
prims = torch.ops.prims
META = "fuser_gemm"
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
# a copy is the same values: the chain looks through it as through a view (a backward's
# clone(contiguous) between a matmul and its dropout or GELU backward)
_SAME = _VIEWS | {aten.clone.default}
_CASTS = {aten._to_copy.default, prims.convert_element_type.default}


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _call(n: Any, *targets: Any) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _erased(n: fx.Node) -> bool:
    return bool(getattr(n, "_erased", False))


def _cast_dtype(n: fx.Node) -> torch.dtype | None:
    """The dtype of a pure dtype cast (no device, layout or memory-format change)."""
    if n.target == prims.convert_element_type.default:
        return n.args[1]
    extra = set(n.kwargs) - {"dtype", "layout", "device"}
    v, src = _val(n), _val(n.args[0])
    if len(n.args) > 1 or extra or v is None or src is None or v.device != src.device:
        return None
    return n.kwargs.get("dtype")


def _row_aliases(n: fx.Node, cols: int) -> list[fx.Node]:
    """n and its views (transitively) that keep rows of `cols` elements: [M, N] <-> [B, T, N]."""
    out, stack = [], [n]
    while stack:
        u = stack.pop()
        out.append(u)
        for user in u.users:
            v = _val(user)
            if _call(user, aten.clone.default) and any(u.op == "output" for u in user.users):
                continue  # a returned copy stays a copy: the outputs must not alias
            if _call(user, *_SAME) and v is not None and v.dim() >= 1 and v.shape[-1] == cols:
                stack.append(user)
    return out


def _outside(aliases: list[fx.Node]) -> list[fx.Node]:
    """Users of any alias that are not aliases themselves."""
    inside = set(aliases)
    return [u for a in aliases for u in a.users if u not in inside]


@dataclass
class Match:
    """One matmul and the nodes the template takes over."""

    mm: fx.Node
    a: fx.Node  # A's source (before the prologue; [M, K] or a [..., K] view of it)
    b: fx.Node
    n: int
    bias: fx.Node | None = None
    residual: fx.Node | None = None
    pre: fx.Node | None = None
    mask: fx.Node | None = None
    scale: float | None = None
    mask_scale: float | None = None
    out_dtype: torch.dtype | None = None
    epilogue: Epilogue = Epilogue()
    outputs: dict[fx.Node, int] = field(default_factory=dict)  # replaced node -> result index
    taken: list[fx.Node] = field(default_factory=list)  # nodes erased once unused
    sum_node: fx.Node | None = None


def _prologue(a: fx.Node, found: Match, fields: dict) -> fx.Node:
    """A's source with a cast of A (and a scale by a Python number above it) peeled into
    the prologue: mm(cast(x) * s), mm(view(cast(x))); each peeled node used once. A is
    returned as it is when there is no cast or scale to take."""
    src, taken, seen = a, [], set()
    while _call(src, *_VIEWS, *_CASTS, aten.mul.Tensor, aten.mul.Scalar) and len(src.users) == 1:
        x = src.args[0]
        if not isinstance(x, fx.Node) or _val(x) is None or _val(x).dtype not in DTYPES:
            break
        if src.target in (aten.mul.Tensor, aten.mul.Scalar):
            s = src.args[1]
            if seen & {"cast", "scale"} or isinstance(s, (bool, fx.Node)):
                break
            if not isinstance(s, (int, float)) or _val(x).dtype != _val(src).dtype:
                break
            fields["a_scale"], found.scale = True, float(s)
            seen.add("scale")
        elif src.target in _CASTS:
            dtype = _cast_dtype(src)
            if "cast" in seen or dtype not in DTYPES:
                break
            fields["a_cast"] = DTYPES[dtype]
            seen.add("cast")
        else:
            if "view" in seen or _val(x).shape[-1] != _val(src).shape[-1]:
                break
            seen.add("view")
        taken.append(src)
        src = x
    if not seen & {"cast", "scale"}:
        fields.pop("a_scale", None), fields.pop("a_cast", None)
        return a
    found.taken += taken
    return src


def _approximate(n: fx.Node, position: int) -> str:
    """gelu / gelu_backward's `approximate`, as the Epilogue names it."""
    approx = n.args[position] if len(n.args) > position else n.kwargs.get("approximate")
    return "gelu_tanh" if approx == "tanh" else "gelu"


# the consumers the epilogue takes, in its order: a stage number each
_STAGES = {"gelu": 1, "mask": 2, "gelu_backward": 3, "residual": 4, "cast": 5}


def _step(aliases: list[fx.Node], stage: int) -> tuple[str, fx.Node] | None:
    """The next consumer of a value (given as its row aliases) that the epilogue takes
    past `stage`: (kind, node)."""
    inside = set(aliases)
    v0 = _val(aliases[0])
    for u in _outside(aliases):
        v = _val(u)
        if v is None or u.op != "call_function":
            continue
        if u.target == aten.gelu.default and stage < 1 and u.args[0] in inside:
            return "gelu", u
        if u.target == aten.mul.Tensor and stage < 2 and _mask_operand(u, inside) is not None:
            return "mask", u
        if u.target == aten.gelu_backward.default and stage < 3 and u.args[0] in inside:
            p = u.args[1]
            vp = _val(p)
            if (
                isinstance(p, fx.Node)
                and p not in inside
                and vp is not None
                and vp.shape == v.shape
            ):
                return "gelu_backward", u
        if u.target == aten.add.Tensor and stage < 4 and not u.kwargs and len(u.args) == 2:
            x, y = u.args
            other = y if x in inside else x
            if (x in inside) != (y in inside) and isinstance(other, fx.Node):
                ov = _val(other)
                if ov is not None and ov.shape == v.shape and ov.dtype == v.dtype == v0.dtype:
                    return "residual", u
        if u.target in _CASTS and stage < 5 and _cast_dtype(u) in DTYPES:
            return "cast", u
    return None


def _mask_operand(u: fx.Node, inside: set) -> fx.Node | None:
    """For mul(x, m) with x in `inside`: m, when it is an [M, N] tensor of x's shape that
    keeps x's dtype (dropout's backward: x * (mask.to(x.dtype) * scale)); else None."""
    if u.kwargs or len(u.args) != 2:
        return None
    x, m = u.args if u.args[0] in inside else u.args[::-1]
    if x not in inside or m in inside or not isinstance(m, fx.Node):
        return None
    v, vm, vx = _val(u), _val(m), _val(x)
    if v is None or vm is None or vx is None or tuple(vm.shape) != tuple(vx.shape):
        return None
    return m if v.dtype == vx.dtype else None


def _peel_mask(m: fx.Node) -> tuple[fx.Node, float, list[fx.Node]]:
    """The tensor the template reads for `m`, the scale and the nodes it takes over:
    mul(cast(mask), s) -> (mask, s) when each is used once (the saved bool mask is read
    as it is saved: a byte an element)."""
    scale, taken = 1.0, []
    if _call(m, aten.mul.Tensor, aten.mul.Scalar) and len(m.users) == 1 and not m.kwargs:
        t, s = m.args
        if isinstance(s, (int, float)) and not isinstance(s, bool) and isinstance(t, fx.Node):
            scale, taken, m = float(s), [m], t
    if _call(m, *_CASTS) and len(m.users) == 1 and _cast_dtype(m) is not None:
        src = m.args[0]
        if isinstance(src, fx.Node) and _val(src) is not None:
            taken, m = [*taken, m], src
    return m, scale, taken


def _epilogue(found: Match, fields: dict, stage: int) -> None:
    """Follow the chain of consumers the epilogue takes, from the matmul on."""
    cur = found.mm
    while True:
        aliases = _row_aliases(cur, found.n)
        step = _step(aliases, stage)
        if step is None:
            break
        kind, node = step
        others = [u for u in _outside(aliases) if u is not node]
        if others and kind != "gelu":
            break  # the value is needed elsewhere: only a pre-activation is also stored
        if kind == "gelu":
            fields["activation"] = _approximate(node, 1)
            if others:
                fields["aux"] = True
                found.outputs.update((a, 1) for a in aliases)
        elif kind == "mask":
            fields["mask"] = True
            found.mask, found.mask_scale, peeled = _peel_mask(_mask_operand(node, set(aliases)))
            found.taken += peeled
        elif kind == "gelu_backward":
            fields["gelu_grad"] = _approximate(node, 2)
            found.pre = node.args[1]
        elif kind == "residual":
            fields["residual"] = True
            x, y = node.args
            found.residual = y if x in set(aliases) else x
        else:
            found.out_dtype = _cast_dtype(node)
        found.taken += aliases
        cur, stage = node, _STAGES[kind]
    finals = _row_aliases(cur, found.n)
    found.outputs.update((a, 0) for a in finals)
    found.taken += finals


def _bias_sum(found: Match, fields: dict) -> None:
    """mm(xᵀ, B) beside sum(x, [0]), or mm(A, x) beside it: the sum over K is taken
    from the tiles the template loads anyway (dW and db of a linear layer)."""
    a, b = found.mm.args[-2:]  # addmm's bias comes first
    for kind, src in (("a_rows", a.args[0] if _is_2d_transpose(a) else None), ("b_cols", b)):
        if not isinstance(src, fx.Node):
            continue
        for u in src.users:
            if not _call(u, aten.sum.dim_IntList) or len(u.args) < 2 or u.kwargs.get("dtype"):
                continue
            if list(u.args[1]) in ([0], [-2]):
                fields["reduce"] = kind
                found.sum_node = u
                found.outputs[u] = 2
                found.taken.append(u)
                return


def match(mm: fx.Node) -> Match | None:
    """The template's view of one mm/addmm node (None: not a plain 2-D matmul)."""
    if mm.target == aten.addmm.default:
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1 or len(mm.args) > 3:
            return None
        bias, a, b = mm.args
    elif mm.target == aten.mm.default:
        (a, b), bias = mm.args, None
    else:
        return None
    va, vb, v = _val(a), _val(b), _val(mm)
    if va is None or vb is None or v is None or va.dim() != 2 or vb.dim() != 2:
        return None
    m, n = v.shape
    found = Match(mm, a, b, n)
    fields: dict[str, Any] = {}
    stage = 0
    if bias is not None:
        vbias = _val(bias)
        if not isinstance(bias, fx.Node) or vbias is None or vbias.dtype != v.dtype:
            return None
        if vbias.numel() == n and vbias.shape[-1] == n:
            fields["bias"], found.bias = True, bias
        elif tuple(vbias.shape) == (m, n):
            # a full [M, N] bias is a residual before anything else: only a cast may follow
            fields["residual"], found.residual, stage = True, bias, _STAGES["residual"]
        else:
            return None
    found.a = _prologue(a, found, fields)
    _epilogue(found, fields, stage)
    if found.a is a:
        _bias_sum(found, fields)
    found.epilogue = Epilogue(**fields)
    return found


# ---- rewriting ----------------------------------------------------------------------


def _insertion_point(gm: fx.GraphModule, found: Match, inputs: list) -> fx.Node | None:
    """Where the new call goes: before the first user of a replaced node, when every
    input comes before that user (None otherwise: an input depends on what the template
    replaces, or a replaced value is read before an input exists)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    replaced = set(found.outputs) | set(found.taken) | {found.mm}
    users = [u for r in replaced for u in r.users if u not in replaced]
    if not users:
        return None
    first = min(users, key=order.__getitem__)
    last_in = max((order[x] for x in inputs if isinstance(x, fx.Node)), default=-1)
    return first if last_in < order[first] else None


def _replace(
    gm: fx.GraphModule, found: Match, at: fx.Node, target: Any, args: tuple, vals: list, note: str
) -> None:
    """Insert `target(*args)` before `at`, its results (`vals`: fake tensors, [M, N] or
    the sums' shape) standing for the replaced nodes; erase what is left unused."""
    g = gm.graph
    replaced = set(found.outputs) | set(found.taken) | {found.mm}
    single = len(vals) == 1 and not isinstance(target, GemmCall)
    with g.inserting_before(at):
        call = g.call_function(target, args)
        call.meta["val"] = vals[0] if single else tuple(vals)
        call.meta[META] = note
        items: dict[int, fx.Node] = {}
        for r, i in found.outputs.items():
            if not any(u not in replaced for u in r.users):
                continue  # read only by nodes the template replaces
            i = min(i, len(vals) - 1)
            if i not in items:
                items[i] = call if single else g.call_function(operator.getitem, (call, i))
                items[i].meta["val"] = vals[i]
            new, shape = items[i], tuple(_val(r).shape)
            if shape != tuple(vals[i].shape):
                new = g.call_function(aten.view.default, (new, list(shape)))
                new.meta["val"] = vals[i].view(shape)
            r.replace_all_uses_with(new)
    order = {x: j for j, x in enumerate(g.nodes)}
    for r in sorted(replaced, key=order.__getitem__, reverse=True):
        if not r.users:
            g.erase_node(r)


def _layouts_ok(found: Match) -> bool:
    """Every replaced value read outside the chain is contiguous, as the template's
    results are (a consumer traced against other strides would read them wrongly)."""
    replaced = set(found.outputs) | set(found.taken) | {found.mm}
    return all(
        _val(r).is_contiguous() for r in found.outputs if any(u not in replaced for u in r.users)
    )


def _shape(found: Match) -> GemmShape:
    a2d = _val(found.mm.args[-2])
    extra = [_val(x) for x in (found.a, found.bias, found.pre, found.residual, found.mask)]
    shape = shape_of(a2d, _val(found.b), found.epilogue, found.out_dtype, *extra)
    return dataclasses.replace(shape, a_dtype=DTYPES.get(_val(found.a).dtype, shape.a_dtype))


def _template(gm: fx.GraphModule, found: Match, plan: GemmPlan, why: str) -> str | None:
    """Put the template call in place of the match; None, or why it could not be."""
    e = found.epilogue
    args = (found.a, found.b, found.bias, found.pre, found.residual, found.mask)
    at = _insertion_point(gm, found, list(args))
    if at is None:
        return "an input of the fused work comes after a use of a value it replaces"
    if not _layouts_ok(found):
        return "a replaced value read elsewhere is not contiguous, as the template's results are"
    m, n = _val(found.mm).shape
    k = _val(found.mm.args[-2]).shape[1]
    sums = tuple(_val(found.sum_node).shape) if found.sum_node is not None else None
    out_val = _val(next(r for r, i in found.outputs.items() if i == 0))
    vals = [out_val.new_empty((m, n))]
    vals += [_val(found.mm).new_empty((m, n))] if e.aux else []
    vals += [_val(found.sum_node).new_empty(sums)] if sums is not None else []
    scales = (found.scale, found.mask_scale)
    target = GemmCall(e, plan, (m, n, k), scales, (found.out_dtype, sums), why)
    _replace(gm, found, at, target, args, vals, f"GEMM template {plan.name} ({found.mm.name})")
    return None


# cuBLASLt's GELU epilogue is the tanh form; torch exposes it as _addmm_activation (on a
# GPU: its CPU kernel applies the erf form, so the route is taken for CUDA tensors only)
_CUBLAS_EPILOGUE = Epilogue(bias=True, activation="gelu_tanh")


def _cublas_route(gm: fx.GraphModule, found: Match) -> str:
    """The CUDA backend's choice: addmm + tanh-GELU as one cuBLASLt call where it
    applies; a note saying what runs."""
    if found.epilogue != _CUBLAS_EPILOGUE or _val(found.mm).device.type != "cuda":
        return "cuBLAS, and the fused work (if any) in fuser's pointwise kernel"
    args = (found.bias, found.mm.args[1], found.b)
    at = _insertion_point(gm, found, list(args))
    if at is None or not _layouts_ok(found):
        return "cuBLAS (the cuBLASLt GELU epilogue could not be placed)"
    out = _val(next(r for r, i in found.outputs.items() if i == 0))
    m, n = _val(found.mm).shape
    call_args = (*args, 1, 1, True)  # beta, alpha, use_gelu
    vals = [out.new_empty((m, n))]
    why = f"cuBLASLt bias + GELU(tanh) epilogue ({found.mm.name})"
    _replace(gm, found, at, aten._addmm_activation.default, call_args, vals, why)
    return "cuBLASLt's bias + GELU(tanh) epilogue (aten._addmm_activation)"


def lower_gemm(gm: fx.GraphModule, mode: str | None = None) -> list[str]:
    """Rewrite the graph's chosen matmul chains into template calls (FUSER_GEMM); one
    note per matmul (chosen or not, with the reasons). FUSER_GEMM=aten: no change."""
    mode = config.gemm if mode is None else mode
    if mode == "aten":
        return []
    template_backend = get_backend(config.backend).gemm_template
    notes, changed = [], False
    for node in list(gm.graph.nodes):
        if not _call(node, aten.mm.default, aten.addmm.default) or _erased(node):
            continue
        found = match(node)
        if found is None:
            note = f"matmul {node.name}: cuBLAS (not a plain 2-D matmul the template takes)"
            node.meta[META] = note
            notes.append(note)
            continue
        shape = _shape(found)
        choice = decide(shape, found.epilogue, mode, template_backend)
        fused = ", ".join(found.epilogue.ops()) or "nothing"
        head = f"matmul {node.name} ({shape.line()}; fuses: {fused})"
        if choice.template and choice.plan is not None:
            why_not = _template(gm, found, choice.plan, f"{head}: {choice.line()}")
            if why_not is None:
                plan = choice.plan
                why = "".join(f"\n    why: {r}" for r in plan.reasons)
                notes.append(f"{head}: {choice.line()}\n    {plan.tiles.line()}{why}")
                changed = True
                continue
            note = f"{head}: cuBLAS, the template call could not be placed: {why_not}"
        elif not template_backend:
            note = f"{head}: {choice.line()}; {_cublas_route(gm, found)}"
            changed = changed or _erased(node)
        else:
            note = f"{head}: {choice.line()}"
        if not _erased(node):
            node.meta[META] = note
        notes.append(note)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return notes

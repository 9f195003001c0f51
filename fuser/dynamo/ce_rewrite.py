"""Rewrites around fuser::cross_entropy (ce_op.py): the Dynamo graph's cross_entropy
calls become the one-pass op, an lm head feeding one becomes the chunked
fuser::linear_cross_entropy (linear_ce.py), and the backward's scaling of a saved
gradient runs in place.

`chunk_linear_cross_entropy` runs first, on the same Dynamo graph: `F.linear(x, W[, b])`,
then views to [N, V] and an upcast at most, then F.cross_entropy, where nothing else reads
the logits, becomes one call whose logits never exist whole. config.linear_cross_entropy
(FUSER_LINEAR_CE) says when: "auto" takes CUDA logits of AUTO_MIN_LOGITS_BYTES or more,
"1" any, "0" none; each lm head found gets a note saying what was done and why (explain
shows them), a model that returns its logits too among them.

`one_pass_cross_entropy` runs on the graph Dynamo captured, before AOTAutograd, and only
when a backward will run (grad mode on, logits requiring grad): there AOTAutograd still
sees `F.cross_entropy` with its arguments, and the upcast `.float()` before it, which it
would otherwise trace into _to_copy, _log_softmax and nll_loss. A call it does not take
(class weights, probabilities as targets, a class dim that is not the last of 2) stays
as it was and takes the old path (log_softmax + nll_loss). Logits made inside the graph
(the lm head's, a slice of its padded rows) get a gradient whose rows are 16-byte aligned
(ce_op.py `aligned`): the one-pass kernel and the backward's readers of the gradient then
move 16-byte vectors where GPT-2's odd vocabulary allowed 2-byte ones.

`scale_saved_gradient_in_place` runs on a backward graph: the saved gradient is read by
nothing else, so fuser::cross_entropy_grad becomes `ce_scale.scale_in_place`, which
leaves it as it is when the upstream gradient is 1 (checked on the device).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import fuser.dynamo.ce_op as ce_op
from fuser.config import config
from fuser.dynamo.ce_scale import scale_in_place
from fuser.dynamo.linear_ce import AUTO_MIN_LOGITS_BYTES, plan_chunks

_CE = (F.cross_entropy, torch.nn.functional.cross_entropy)
_HALF = (torch.float16, torch.bfloat16)
_VIEW_METHODS = ("view", "reshape", "flatten")


def _val(n: Any) -> Any:
    return n.meta.get("example_value", n.meta.get("val")) if isinstance(n, fx.Node) else None


def _is_upcast(n: fx.Node) -> bool:
    """x.float(), x.to(torch.float32), x.to(dtype=torch.float32), x.type(torch.float32)."""
    if n.op != "call_method" or not n.args:
        return False
    if n.target == "float" and len(n.args) == 1 and not n.kwargs:
        return True
    if n.target in ("to", "type"):
        want = n.args[1] if len(n.args) == 2 else n.kwargs.get("dtype")
        extra = set(n.kwargs) - {"dtype"}
        return want is torch.float32 and not extra and len(n.args) <= 2
    return False


def _is_view(n: fx.Node) -> bool:
    return n.op == "call_method" and n.target in _VIEW_METHODS


def _strip(logits: fx.Node) -> tuple[fx.Node, list[fx.Node], bool]:
    """(the tensor before an upcast, the views between it and the call, upcast?): the
    upcast is dropped only when nothing else reads it; views are replayed on the source."""
    views: list[fx.Node] = []
    n = logits
    while isinstance(n, fx.Node) and _is_view(n) and len(n.users) == 1:
        views.append(n)
        n = n.args[0]
    if isinstance(n, fx.Node) and _is_upcast(n) and len(n.users) == 1:
        src = n.args[0]
        sv = _val(src)
        if isinstance(src, fx.Node) and sv is not None and sv.dtype in _HALF:
            while isinstance(src, fx.Node) and _is_view(src) and len(src.users) == 1:
                views.append(src)  # views before the upcast, replayed in order
                src = src.args[0]
            return src, views, True
    return logits, [], False


def _argument(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def _options(node: fx.Node) -> tuple[int, int, float] | None:
    """(reduction code, ignore_index, label_smoothing), or None for a call not taken."""
    if _argument(node, 2, "weight", None) is not None:
        return None
    if _argument(node, 3, "size_average", None) is not None:
        return None
    if _argument(node, 5, "reduce", None) is not None:
        return None
    reduction = _argument(node, 6, "reduction", "mean")
    ignore = _argument(node, 4, "ignore_index", -100)
    smoothing = _argument(node, 7, "label_smoothing", 0.0)
    if reduction not in ce_op.REDUCTION_CODE or not isinstance(ignore, int):
        return None
    if not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing <= 1.0:
        return None
    return ce_op.REDUCTION_CODE[reduction], ignore, float(smoothing)


def _takes(node: fx.Node) -> bool:
    x, t = _val(node.args[0]), _val(node.args[1]) if len(node.args) > 1 else None
    if not isinstance(x, torch.Tensor) or not isinstance(t, torch.Tensor):
        return False
    return (
        x.dim() == 2
        and x.dtype.is_floating_point
        and x.requires_grad
        and t.dim() == 1
        and t.dtype in (torch.int64, torch.int32)
        and not any(isinstance(s, torch.SymInt) for s in x.shape)
    )


def _under_views(n: Any) -> Any:
    """What `n` views or upcasts, through any number of views and upcasts."""
    while isinstance(n, fx.Node) and (_is_view(n) or _is_upcast(n)):
        n = n.args[0]
    return n


def _returned(logits: fx.Node) -> bool:
    """Whether the logits (or what they view or upcast) are also an output of the graph: a
    model that returns them. See `_two_pass_for_returned` for what that decides."""
    base = _under_views(logits)
    if not isinstance(base, fx.Node):
        return False
    seen, todo = {base}, [base]
    while todo:
        for u in todo.pop().users:
            if u.op == "output":
                return True
            if u not in seen and (_is_view(u) or _is_upcast(u)):
                seen.add(u)
                todo.append(u)
    return False


def _two_pass_for_returned(logits: fx.Node) -> bool:
    """Whether a cross-entropy whose logits the graph also returns takes the two-pass form
    (the logits saved for the backward, which makes the gradient beside them) instead of
    the one-pass form (the gradient made in the forward and saved; the logits are the
    caller's, freed when it drops them).

    With absent gradients not filled (config.absent_grads, tangents.py) the one-pass form
    costs no more memory: a caller that drops the logits (`_, loss = model(x, y)`) holds
    one [N, V] buffer at the backward where the two-pass form holds two, and it reads the
    logits once. H100, GPT-2 124M B=16 V=50304: 37.7 -> 35.9 ms/step, 12.98 -> 9.98 GiB
    (benchmarks/results/h100-2026-11-27-session9/2-ce-returned). It is not the default yet
    (config.ce_returned_logits, FUSER_CE_RETURNED=one-pass takes it): as a default it made
    transformers' tiny Mamba fail in AOTAutograd, through the rewrite's dead-code pass
    (drop_orphans fixes that), and the default has not been measured again since. Unaligned rows
    (V=50257) always take the one-pass form: pad_mm returns a copy of the padded logits
    there, and the one-pass gradient's rows are aligned."""
    rule = config.ce_returned_logits
    if rule not in ("one-pass", "two-pass"):
        raise ValueError(f"FUSER_CE_RETURNED={rule!r}; expected one-pass or two-pass")
    if not (_returned(logits) and _aligned_rows(logits)):
        return False
    return rule == "two-pass" or not config.absent_grads


def _aligned_rows(logits: fx.Node) -> bool:
    """Whether a row of the logits is a whole number of 16-byte vectors."""
    v = _val(logits)
    return isinstance(v, torch.Tensor) and v.shape[-1] * v.dtype.itemsize % 16 == 0


def _graph_input(n: Any) -> bool:
    """Whether `n` is a graph input, or views or upcasts of one: the gradient then leaves
    the graph as that input's, for the caller's autograd (a leaf's AccumulateGrad copies
    one whose strides are not its own: eager's contiguous rows are kept for it). Logits
    made in the graph (the lm head, a slice of its padded rows) get aligned rows."""
    n = _under_views(n)
    return isinstance(n, fx.Node) and n.op == "placeholder"


def one_pass_cross_entropy(gm: fx.GraphModule, notes: list[str] | None = None) -> int:
    """Replace gm's F.cross_entropy calls by fuser::cross_entropy; returns how many.
    `notes` (explain's) gets a line for each call taken or left two-pass, and why."""
    if not torch.is_grad_enabled():
        return 0
    graph = gm.graph
    done = 0
    orphans: list[fx.Node] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _CE or len(node.args) < 2:
            continue
        opts = _options(node)
        if opts is None or not _takes(node):
            continue
        if _two_pass_for_returned(node.args[0]):
            if notes is not None:
                notes.append(
                    f"cross-entropy {node.name}: two-pass (loss in the forward, gradient in "
                    "the backward): the graph returns its logits, whose rows are 16-byte "
                    "aligned, and they are saved instead of an [N, V] gradient "
                    "(FUSER_CE_RETURNED=one-pass makes the gradient in the forward; "
                    "fuser/dynamo/ce_rewrite.py)"
                )
            continue
        src, views, upcast = _strip(node.args[0])
        # the loss in the dtype eager gives: float32 under autocast (cross-entropy is on
        # its float32 list) even where the user wrote no .float()
        want, got = _val(node), _val(src)
        if want is not None and got is not None and want.dtype == torch.float32:
            upcast = upcast or got.dtype != torch.float32
        aligned = not _graph_input(src)
        with graph.inserting_before(node):
            x = src
            for v in reversed(views):
                x = graph.call_method(v.target, (x, *v.args[1:]), dict(v.kwargs))
            pair = graph.call_function(
                torch.ops.fuser.cross_entropy.default,
                (x, node.args[1], *opts, upcast, aligned),
            )
            loss = graph.call_function(operator.getitem, (pair, 0))
        node.replace_all_uses_with(loss)
        orphans += node.all_input_nodes
        graph.erase_node(node)
        done += 1
        if notes is not None:
            notes.append(
                f"cross-entropy {node.name}: one pass (loss and gradient in the forward, the "
                f"gradient's rows {'16-byte aligned' if aligned else 'as the input logits'}"
                "; fuser/dynamo/ce_op.py)"
            )
    if done:
        drop_orphans(graph, orphans)
        gm.recompile()
    return done


def drop_orphans(graph: fx.Graph, seeds: list[fx.Node]) -> int:
    """Erase the nodes a rewrite left unread (the replaced call's views and upcasts), and
    then theirs, and nothing else: the graph's own dead code stays. A whole-graph
    eliminate_dead_code would also drop nodes whose effect is not their value, which fx
    does not know as impure: Dynamo's inlined vmap (transformers' Mamba scan) leaves
    `_vmap_decrement_nesting` calls nobody reads, and without them AOTAutograd's trace
    failed ("tensor escaped from inside a function being vmapped"). Returns how many."""
    todo, dropped = list(seeds), 0
    while todo:
        n = todo.pop()
        if n.graph is not graph or n.users or n.op not in ("call_function", "call_method"):
            continue
        if n.is_impure():
            continue
        todo += n.all_input_nodes
        graph.erase_node(n)
        dropped += 1
    return dropped


_LINEAR = (F.linear, torch._C._nn.linear)


def _lm_head(ce: fx.Node) -> tuple[fx.Node | None, list[fx.Node], bool]:
    """(the linear feeding this cross-entropy through views and upcasts, the nodes in
    between, upcast?), whatever else reads them; (None, ...) when it is not a linear."""
    chain: list[fx.Node] = []
    n, upcast = ce.args[0], False
    while isinstance(n, fx.Node) and (_is_view(n) or _is_upcast(n)):
        upcast = upcast or _is_upcast(n)
        chain.append(n)
        n = n.args[0]
    if isinstance(n, fx.Node) and n.op == "call_function" and n.target in _LINEAR:
        return n, chain, upcast
    return None, chain, upcast


def _head_problem(ce: fx.Node, lin: fx.Node, chain: list[fx.Node]) -> str | None:
    """Why this lm head + cross-entropy is not chunked (None: it can be)."""
    others = [u.name for n in [lin, *chain] for u in n.users if u not in (*chain, ce)]
    if others:
        return (
            f"the logits are also read by {', '.join(others[:3])} (a model that returns "
            "its logits, say: they would have to exist whole anyway)"
        )
    x, w = (_val(a) for a in lin.args[:2])
    b = _val(_argument(lin, 2, "bias", None))
    logits, flat, t = _val(lin), _val(ce.args[0]), _val(ce.args[1])
    vals = (x, w, logits, flat, t)
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return "no shapes traced"
    if any(isinstance(s, torch.SymInt) for v in vals for s in v.shape):
        return "symbolic sizes"
    if w.dim() != 2 or flat.dim() != 2 or flat.shape[1] != w.shape[0] or t.dim() != 1:
        return f"logits {list(flat.shape)} of a weight {list(w.shape)}: not [N, V] rows"
    if flat.numel() != logits.numel() or logits.shape[-1] != w.shape[0]:
        return "the views do more than flatten the leading dims"
    if t.dtype not in (torch.int64, torch.int32) or not logits.dtype.is_floating_point:
        return f"{logits.dtype} logits, {t.dtype} targets"
    if not (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return "nothing requires a gradient (no training step)"
    return None


def _mode_problem(logits: torch.Tensor, mode: str) -> str | None:
    """Why "auto" leaves these logits alone (None: it takes them, or mode is "1")."""
    if mode == "1":
        return None
    if logits.device.type != "cuda":
        return f"auto: the logits are on {logits.device.type} (FUSER_LINEAR_CE=1 forces it)"
    size = logits.numel() * logits.element_size()
    if size < AUTO_MIN_LOGITS_BYTES:
        return (
            f"auto: the logits are {size / 2**20:.0f} MiB, under "
            f"{AUTO_MIN_LOGITS_BYTES >> 20} MiB (FUSER_LINEAR_CE=1 forces it)"
        )
    return None


def _chunk_one(
    graph: fx.Graph, ce: fx.Node, lin: fx.Node, upcast: bool, opts: tuple, orphans: list
) -> str:
    """Replace one lm head + cross-entropy by the op; returns what it became. The nodes
    the replaced call read join `orphans` (drop_orphans erases those left unread)."""
    x, logits = _val(lin.args[0]), _val(lin)
    n, v = logits.numel() // logits.shape[-1], logits.shape[-1]
    reduction, ignore, smoothing = opts
    # the loss in eager's dtype: float32 under autocast even without a .float()
    want = _val(ce)
    upcast = upcast or (want is not None and want.dtype == torch.float32)
    upcast = upcast and logits.dtype != torch.float32
    with graph.inserting_before(ce):
        xs = lin.args[0]
        if x.dim() != 2:
            xs = graph.call_method("reshape", (xs, (n, x.shape[-1])))
        bias = _argument(lin, 2, "bias", None)
        args = (xs, lin.args[1], bias, ce.args[1], reduction, ignore, smoothing)
        args += (logits.dtype, upcast, 0)  # chunk_rows 0: linear_ce.plan_chunks decides
        out = graph.call_function(torch.ops.fuser.linear_cross_entropy.default, args)
        loss = graph.call_function(operator.getitem, (out, 0))
    ce.replace_all_uses_with(loss)
    orphans += ce.all_input_nodes
    graph.erase_node(ce)
    plan = plan_chunks(n, v, logits.dtype, smoothing)
    size = f"{logits.numel() * logits.element_size() / 2**20:.0f} MiB"
    how = "forced: FUSER_LINEAR_CE=1" if config.linear_cross_entropy == "1" else "auto"
    return (
        f"chunked into fuser::linear_cross_entropy ({how}); logits [{n}, {v}] "
        f"{str(logits.dtype).replace('torch.', '')} ({size}) never whole: {plan.line()}"
    )


def chunk_linear_cross_entropy(gm: fx.GraphModule) -> list[str]:
    """Replace `cross_entropy(linear(x, W[, b]))` by fuser::linear_cross_entropy where
    config.linear_cross_entropy says so; one note per lm head found."""
    mode = config.linear_cross_entropy
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"FUSER_LINEAR_CE={mode!r}; expected 0, 1 or auto")
    if mode == "0" or not torch.is_grad_enabled():
        return []
    notes: list[str] = []
    orphans: list[fx.Node] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _CE or len(node.args) < 2:
            continue
        lin, chain, upcast = _lm_head(node)
        if lin is None:
            continue
        opts = _options(node)
        why = _head_problem(node, lin, chain)
        if why is None and (opts is None or opts[0] == 0):
            why = "reduction 'none' (per-row losses: nothing to accumulate), or an option "
            why += "the one-pass cross-entropy does not take (class weights, say)"
        why = why or _mode_problem(_val(lin), mode)
        head = f"lm head {lin.name} -> {node.name}"
        if why is not None:
            notes.append(f"{head}: not chunked: {why}")
            continue
        notes.append(f"{head}: {_chunk_one(gm.graph, node, lin, upcast, opts, orphans)}")
    if any("chunked into" in note for note in notes):
        drop_orphans(gm.graph, orphans)
        gm.recompile()
    return notes


def scale_saved_gradient_in_place(gm: fx.GraphModule) -> int:
    """In a backward graph: fuser::cross_entropy_grad of a saved gradient that nothing else
    reads becomes scale_in_place (no new buffer; no pass at all for an upstream 1)."""
    done = 0
    for node in gm.graph.nodes:
        if node.target != torch.ops.fuser.cross_entropy_grad.default:
            continue
        grad, upstream = node.args
        uv = upstream.meta.get("val") if isinstance(upstream, fx.Node) else None
        if not (isinstance(grad, fx.Node) and grad.op == "placeholder" and len(grad.users) == 1):
            continue
        if not isinstance(uv, torch.Tensor) or uv.dim() != 0:
            continue
        node.target = scale_in_place
        node.meta["val"] = grad.meta.get("val")  # the result is the saved buffer itself
        done += 1
    if done:
        gm.recompile()
    return done

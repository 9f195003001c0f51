"""Attention masks proven at compile time to be the causal mask become is_causal=True.

`transformers` builds a decoder's attention mask from positions (arange, comparisons,
where) and hands it to SDPA. Under torch.compile it never leaves the mask out: it cannot
look at the data while Dynamo traces, so it cannot know that no padding is masked. SDPA
then runs its masked kernel: every key block of every query block, the mask read, no
causal half skipped (or the template refuses the mask). AOTAutograd also keeps the mask
for the backward.

A mask computed from sizes alone (no graph input among its ancestors, no random op, only
ATen's and prims' ops, no dynamic size) is a constant. This pass evaluates it once, on
the CPU, and where it is the causal mask (key j seen by query i exactly when j <= i, in
every batch and head; a float mask 0 there and -inf, or at most -65504, elsewhere: see
BLOCKED) the attention's ATen kernel, forward and backward, gets is_causal=True and no
mask: the same op computing the same values (at a positive scale: _positive), now
skipping the masked half. It runs on AOTAutograd's joint graph (saved.py's partitioner),
so forward and backward change together and the mask is no longer saved, and again on
each graph lowered (inference graphs have no joint graph). Only Tq == Tk is rewritten:
there every backend's causal mask is the same one. FUSER_CAUSAL_MASK=0 turns the pass
off; `fuser.explain` shows each rewrite beside the attention's choice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fuser.config import config
from fuser.dynamo.attention import BACKWARD, CAUSAL_NOTE, FORWARD, named_args

aten = torch.ops.aten
MAX_ELEMENTS = 1 << 27  # larger masks are left alone: evaluating one costs ~0.5 GB
# A float mask entry this low blocks its key: fp16's lowest, which torch (a boolean mask
# handed to cuDNN becomes -65504, -65536 in bf16) and transformers write for minus
# infinity in half precision. exp of a score minus 65504 is 0 in fp32 for any score
# within 65400 of its row's largest.
BLOCKED = -65504.0


# every SDPA kernel of attention.py's tables; those that take no mask (flash on a GPU)
# are passed over where their mask is looked up
ATTENTION = set(FORWARD) | set(BACKWARD)
_MASK_ARGS = ("attn_mask", "attn_bias")


def _arg_index(node: fx.Node, name: str) -> int | None:
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name:
            return i
    return None


def _get(node: fx.Node, name: str) -> Any:
    return named_args(node).get(name)


def _set(node: fx.Node, name: str, value: Any) -> None:
    i = _arg_index(node, name)
    if i is not None and i < len(node.args):
        node.update_arg(i, value)
    elif i is not None:
        node.update_kwarg(name, value)


# ATen's and prims' ops are functions of their arguments (the random ones carry a tag);
# another library's op (torch.library.custom_op) may read state the graph does not see, so
# that one evaluation at compile time need not be what every call computes.
_PURE_NAMESPACES = ("aten", "prims")


def _ancestors(node: fx.Node) -> list[fx.Node] | None:
    """`node` and what it is computed from, inputs first; None when a graph input, a
    module attribute, a random op or another library's op is among them (the value is
    not a constant)."""
    seen: dict[fx.Node, None] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            return None
        if n.target.namespace not in _PURE_NAMESPACES:
            return None
        if torch.Tag.nondeterministic_seeded in n.target.tags:
            return None
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or not _static(val.shape):
            return None  # a symbolic size is an input's: comparing it would guard on it
        if val.numel() > MAX_ELEMENTS:
            return None
        seen[n] = None
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _on_cpu(x: Any) -> Any:
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def evaluate(node: fx.Node) -> torch.Tensor | None:
    """The value of `node` when it is a constant (computed from sizes alone), else None."""
    order = _ancestors(node)
    if order is None:
        return None
    with unset_fake_temporarily():  # AOTAutograd partitions under its fake mode
        return _run(order)


def _run(order: list[fx.Node]) -> torch.Tensor | None:
    env: dict[fx.Node, Any] = {}
    for n in order:
        args = fx.node.map_arg(n.args, env.__getitem__)
        kwargs = {k: _on_cpu(v) for k, v in fx.node.map_arg(n.kwargs, env.__getitem__).items()}
        if "device" in kwargs or n.target in (aten.arange.default, aten.arange.start):
            kwargs["device"] = torch.device("cpu")
        try:
            env[n] = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that will not run on the CPU: not proven
            return None
    return env[order[-1]]


def is_causal_mask(mask: torch.Tensor, t_q: int, t_k: int) -> bool:
    """Whether `mask` (bool: True = seen; float: added to the scores) broadcast over
    batch and heads is the causal mask of a t_q x t_k attention (j <= i)."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (t_q, t_k):
        return False
    want = torch.ones(t_q, t_k, dtype=torch.bool).tril()
    if mask.dtype == torch.bool:
        return bool((mask == want).all())
    if not mask.is_floating_point():
        return False
    seen = mask == 0
    blocked = mask <= BLOCKED
    return bool((seen | blocked).all()) and bool((seen == want).all())


def _seq_lens(node: fx.Node) -> tuple[int, int] | None:
    q, k = (_get(node, n) for n in ("query", "key"))
    qv = q.meta.get("val") if isinstance(q, fx.Node) else None
    kv = k.meta.get("val") if isinstance(k, fx.Node) else None
    if not isinstance(qv, torch.Tensor) or not isinstance(kv, torch.Tensor) or qv.dim() != 4:
        return None
    if not _static(qv.shape[2:3] + kv.shape[2:3]):
        return None  # int() of a dynamic length would specialize the graph on it
    return int(qv.shape[2]), int(kv.shape[2])


def _positive(scale: Any) -> bool:
    """Whether is_causal=True computes what the mask did at this scale (None: 1/sqrt(d)).
    ATen's CPU flash kernel fills the causal half with -inf before it scales the scores:
    times a scale <= 0 that is +inf or NaN, and its rows come out NaN (torch 2.13) where
    the mask's finite scores gave values; the template refuses such scales too."""
    return scale is None or (isinstance(scale, (int, float)) and 0.0 < scale < float("inf"))


def _static(sizes: Any) -> bool:
    """Whether every size is a plain int (not a SymInt of a dynamic shape)."""
    return all(type(s) is int for s in sizes)


def causal_masks(gm: fx.GraphModule) -> list[str]:
    """Rewrite the graph's attentions whose mask is the causal mask to is_causal=True
    without it; one note per rewrite (also kept in the node's meta for explain)."""
    if not config.causal_masks:
        return []
    notes, proven = [], {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ATTENTION:
            continue
        name = next((m for m in _MASK_ARGS if _arg_index(node, m) is not None), None)
        mask = _get(node, name) if name else None
        if not isinstance(mask, fx.Node) or _get(node, "is_causal"):
            continue
        if not _positive(_get(node, "scale")):
            continue
        lens = _seq_lens(node)
        if lens is None or lens[0] != lens[1]:
            continue
        # keyed by the lengths too: a mask of size-1 dims broadcasts to attentions of any
        # length, causal for T=1 only
        if (mask, lens) not in proven:
            value = evaluate(mask)
            with unset_fake_temporarily():
                proven[mask, lens] = value is not None and is_causal_mask(value, *lens)
        if not proven[mask, lens]:
            continue
        _set(node, name, None)
        _set(node, "is_causal", True)
        gim = _get(node, "grad_input_mask")
        if isinstance(gim, (list, tuple)) and len(gim) == 4:
            _set(node, "grad_input_mask", [*gim[:3], False])  # a constant has no gradient
        note = (
            f"{node.name}: its {name} ({mask.name}, computed from sizes alone) is the causal "
            f"mask of T={lens[0]}: is_causal=True, no mask (FUSER_CAUSAL_MASK=0 keeps it)"
        )
        node.meta[CAUSAL_NOTE] = note
        notes.append(note)
    if notes:
        _erase_unused(gm, [m for m, _ in proven])
    return notes


def _erase_unused(gm: fx.GraphModule, masks: list[fx.Node]) -> None:
    """Drop the masks' computations nothing reads any more. One mask may be computed from
    another (m2 = m1 * 2, each an attention's): every node is gathered before any is
    erased, and the graph is walked backwards, users before what they read."""
    computed = {n for mask in masks for n in _ancestors(mask) or []}
    for n in reversed(gm.graph.nodes):
        if n in computed and not n.users:
            gm.graph.erase_node(n)

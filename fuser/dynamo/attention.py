"""Lower SDPA's ATen kernels to the attention template where the choice says so.

AOTAutograd hands fuser one of ATen's attention kernels per F.scaled_dot_product_attention
(flash, cuDNN or efficient on a GPU; the CPU flash kernel on CPU) and its backward op in
the backward graph, with the forward's out and logsumexp saved between them. A chosen
node keeps its place, its result tuple and its getitem users; only its target becomes a
TemplateForward / TemplateBackward, which computes the same values: out with the strides
ATen's kernel would give it, the natural-log LSE in ATen's layout (padded or with a
trailing 1 where the kernel has one), so a backward of either kind can read the
forward of either kind. Outputs the template has no use for (the RNG state of dropout,
cumulative sequence lengths) are made as the empty placeholders ATen returns without
dropout. Every attention node gets its choice in node.meta["fuser_attention"], which
explain shows.

The math fallback of SDPA (a float mask, say) reaches fuser already decomposed into
matmuls and a softmax; it is not matched here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fuser.runtime.attention import attention_backward, attention_forward
from fuser.runtime.attention_tune import decide
from fuser.schedulers.attention import AttentionPlan, AttentionShape

aten = torch.ops.aten
META = "fuser_attention"
CAUSAL_NOTE = "fuser_causal_mask"  # causal_mask.py's note on an attention it made causal


def _ops(*names: str) -> dict[Any, str]:
    return {getattr(aten, n).default: n for n in names if hasattr(aten, n)}


FORWARD = _ops(
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
BACKWARD = _ops(*(f"{n}_backward" for n in FORWARD.values()))


def named_args(n: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(n.target._schema.arguments):
        if i < len(n.args):
            out[a.name] = n.args[i]
        elif a.name in n.kwargs:
            out[a.name] = n.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


@dataclass(frozen=True)
class Out:
    """How to make one result: a tensor's layout, or a plain value (an int, None)."""

    shape: tuple[int, ...] | None
    stride: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    value: Any = None

    @staticmethod
    def of(val: Any) -> Out:
        if isinstance(val, torch.Tensor):
            return Out(tuple(val.shape), tuple(val.stride()), val.dtype)
        return Out(None, value=val)

    def make(self, device: torch.device) -> Any:
        if self.shape is None:
            return self.value
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)


class _TemplateCall:
    """What both FX targets keep: the attention's flags, how to make ATen's results, the
    choice's note, and the plan made at lowering for the traced shapes (Dynamo's guards
    fix them, so a call neither plans nor checks its inputs again)."""

    def __init__(
        self,
        causal: bool,
        scale: float | None,
        outs: tuple[Out, ...],
        why: str,
        plan: AttentionPlan | None = None,
    ):
        self.causal, self.scale, self.outs, self.why, self.plan = causal, scale, outs, why, plan

    def __repr__(self) -> str:
        return f"{type(self).__name__}(causal={self.causal}, scale={self.scale})"


class TemplateForward(_TemplateCall):
    """FX target replacing an SDPA forward kernel: (out, lse, placeholders...)."""

    __name__ = "fuser_attention_forward"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
        made = [o.make(q.device) for o in self.outs]
        out, lse = made[0], made[1]
        # a kernel asked for no LSE (inference) gets an empty one; the template still
        # computes it, into a scratch buffer
        scratch = not isinstance(lse, torch.Tensor) or lse.dim() < 3 or lse.shape[2] < q.shape[2]
        if scratch:
            lse = None
        out, lse_done = attention_forward(
            q, k, v, self.causal, self.scale, out, lse, self.plan, checked=self.plan is not None
        )
        if not scratch:
            made[1] = lse_done
        made[0] = out
        return tuple(made)


class TemplateBackward(_TemplateCall):
    """FX target replacing an SDPA backward kernel: (dq, dk, dv, placeholders...)."""

    __name__ = "fuser_attention_backward"

    def __call__(self, grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any) -> tuple:
        made = [o.make(q.device) for o in self.outs]
        grads = attention_backward(
            grad_out, q, k, v, out, lse, self.causal, self.scale, tuple(made[:3]), self.plan,
            checked=self.plan is not None,
        )  # fmt: skip
        return (*grads, *made[3:])


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def _rewrite(n: fx.Node, forward: bool) -> str:
    """Choose for one attention node, rewrite it if the template is chosen; the note."""
    a = named_args(n)
    q, k, v = (_val(a[x]) for x in ("query", "key", "value"))
    mask = a.get("attn_mask", a.get("attn_bias"))
    if not forward and a.get("grad_input_mask") is not None and a["grad_input_mask"][3]:
        mask = mask if mask is not None else "bias gradient"
    vals = _val(n)
    if q is None or k is None or v is None or not isinstance(vals, (tuple, list)):
        n.meta[META] = "attention: SDPA (no shapes traced for it)"
        return f"{n.name}: SDPA, no shapes traced"
    causal, dropout = bool(a["is_causal"]), float(a["dropout_p"] or 0.0)
    choice = decide(q, k, v, causal, dropout, mask, scale=a.get("scale"))
    kind = "forward" if forward else "backward"
    if n.meta.get(CAUSAL_NOTE):  # made causal on the joint graph (causal_mask.py)
        choice = dataclasses.replace(choice, reasons=(*choice.reasons, n.meta[CAUSAL_NOTE]))
    n.meta[META] = f"attention {kind}: {choice.line()}"
    shape = AttentionShape.of(q, k, bool(a["is_causal"])).line() if q.dim() == 4 else ""
    note = f"attention {kind} {n.name} ({shape}): {choice.line()}"
    if not choice.template:
        return note
    outs = tuple(Out.of(x) for x in vals)
    scale = a.get("scale")
    if forward:
        n.target = TemplateForward(bool(a["is_causal"]), scale, outs, note, choice.plan)
        n.args, n.kwargs = (a["query"], a["key"], a["value"]), {}
    else:
        grad = a.get("grad_out", a.get("grad_out_"))
        n.target = TemplateBackward(bool(a["is_causal"]), scale, outs, note, choice.plan)
        n.args = (grad, a["query"], a["key"], a["value"], a["out"], a["logsumexp"])
        n.kwargs = {}
    return note


def lower_attention(gm: fx.GraphModule) -> list[str]:
    """Rewrite the graph's chosen SDPA kernels into template calls; one note per
    attention node (chosen or not, with the reasons)."""
    notes = []
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target in FORWARD:
            notes.append(_rewrite(n, True))
        elif n.target in BACKWARD:
            notes.append(_rewrite(n, False))
    if any(isinstance(n.target, (TemplateForward, TemplateBackward)) for n in gm.graph.nodes):
        gm.recompile()
    return notes

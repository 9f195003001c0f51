"""Absent gradients: an output whose gradient nobody asks for is neither filled with zeros
nor read by the backward.

A model that returns its logits beside its loss (every `transformers` causal LM does), of
which the user calls `loss.backward()` only, leaves the logits' gradient undefined. What
torch does with it (read in torch 2.13):

- AOTAutograd wraps the compiled forward and backward in one autograd.Function
  (`CompiledFunction`, torch/_functorch/_aot_autograd/runtime_wrappers.py), and its
  backward graph takes one tangent per differentiable output (`tangents_*`), traced as a
  dense tensor. The Function never calls `ctx.set_materialize_grads(False)`: it only sets
  `ctx._materialize_non_diff_grads = False`, which covers outputs marked
  non-differentiable. So the autograd engine itself (python_function.cpp, PyNode::apply)
  fills every undefined gradient of a differentiable output with `zeros` of its shape
  before the backward runs: GPT-2's [B, T, V] (1.6 GB in bf16 at B=16, T=1024), which the
  backward graph then reads and adds.
- There is no AOTAutograd option against it (torch/_functorch/config.py has none) and
  Inductor does nothing about it either: its backward takes the zeros as an input like
  any other tangent. The only switch is the Function's `materialize_grads`, and the
  backward's prologue already passes a None tangent through untouched
  (`process_runtime_tangent` returns non-tensors as they are).
- A backend never sees the ctx: the compiled forward runs inside
  `CompiledFunction.forward(ctx, ...)` without it. But the ctx of a custom Function is
  the autograd node of its outputs: after the call, `out.grad_fn` is that ctx, and its
  `set_materialize_grads(False)` holds for the backward (the engine reads the flag when
  it runs the node).
- Whether a tangent is None is known on the host at the backward's call: no device
  synchronization is needed to pick a backward compiled for "this tangent is zero".

What fuser does with it (backend.py wires it in, config.absent_grads switches it):

1. `AbsentGrads.watch` wraps a capture's compiled forward: it notes the outputs the forward
   made (those without an autograd node yet, so never a tensor passed through from
   another graph), and `AbsentGrads.wrap`, around what Dynamo calls, sets
   `materialize_grads` off on the node those outputs got. Not done for graphs with
   tensor subclasses or symbolic sizes, nor under compiled autograd (which inlines
   AOTAutograd's own backward graph and would meet a None there): there autograd fills
   the zeros as before.
2. `TangentVariants` is the compiled backward: at each call it looks at which tangents
   are None (a host check) and runs the backward lowered for that set, lowering it on
   first use. With none absent it is the graph as traced; a user who passes a gradient
   for the logits (`torch.autograd.backward([loss, logits], [None, g])`, or
   `loss + logits.sum()`) gets that one.
3. `fold_absent` (zero_fold.py) makes a variant: each absent tangent is a structural
   zero, propagated through the ops known to give zero from a zero operand (views, casts,
   products, reductions, the backward ops linear in their incoming gradient);
   `add(x, zero)` becomes `x`; a gradient output that is all zero becomes None (no
   gradient, as eager leaves it). A structural zero is what eager computes: its autograd
   never multiplies an undefined gradient (0 * inf would be NaN; eager's skip is not).
   Where an op outside those rules reads a zero, the zero is materialized there (small
   and rare: a scalar upstream gradient, say), so every graph stays correct; a graph the
   fold cannot take at all gets the zeros at run time, as autograd would have made them
   (with a warning; strict backends raise).

Each variant is lowered once, at the first backward that needs it: a training step that
only ever calls `loss.backward()` lowers one backward graph, as before, just without the
tangent. Explain shows a variant's line ("absent tangents ... taken as zero").
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from fuser.dynamo.zero_fold import fold_absent, is_tangent


def _zeros_like_traced(val: torch.Tensor) -> torch.Tensor:
    """Real zeros with the layout a tangent was traced with, as autograd would give them."""
    out = torch.empty_strided(tuple(val.shape), val.stride(), dtype=val.dtype, device=val.device)
    return out.zero_()


class TangentVariants:
    """A backward graph's compiled callable: at each call, the graph lowered for the set
    of its tangents that are None (see the module's notes), each lowered on first use.

    lower(graph, inputs, suffix, note) compiles one variant (backend.py: lower_graph,
    precompile, CUDA graphs) and returns its boxed callable; the variant of an absent
    set takes the arguments without those tangents.
    """

    def __init__(
        self, gm: fx.GraphModule, inputs: list[Any], lower: Callable[..., Any], strict: bool
    ):
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__
        self.gm, self.inputs, self.lower, self.strict = gm, inputs, lower, strict
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        self.slots = [i for i, n in enumerate(placeholders) if is_tangent(n)]
        self.names = [n.name for n in placeholders]
        self.variants: dict[tuple[int, ...], Any] = {}

    def __call__(self, args: list) -> Any:
        absent = tuple(i for i in self.slots if args[i] is None)
        fn = self.variants.get(absent)
        if fn is None:
            fn = self.variants[absent] = self._compile(absent)
        return fn(args)

    def _compile(self, absent: tuple[int, ...]) -> Any:
        if not absent:
            return self.lower(self.gm, self.inputs, "", "")
        names = {self.names[i] for i in absent}
        tag = "_zero" + "_".join(self.names[i].rsplit("_", 1)[-1] for i in absent)
        try:
            graph, note = fold_absent(self.gm, names)
        except Exception as e:  # every graph stays correct: autograd's zeros, made here
            if self.strict:
                raise
            warnings.warn(
                f"fuser: absent tangents {', '.join(sorted(names))} of a backward graph are "
                f"filled with zeros (the fold failed: {type(e).__name__}: {str(e)[:200]})",
                stacklevel=2,
            )
            return _Filled(self.variants.get(()) or self._full(), absent, self.gm)
        kept = [x for i, x in enumerate(self.inputs) if i not in absent]
        fn = self.lower(graph, kept, tag, note)
        return _Dropped(fn, absent)

    def _full(self) -> Any:
        fn = self.variants[()] = self.lower(self.gm, self.inputs, "", "")
        return fn


class _Dropped:
    """Calls a variant without the absent tangents' slots (boxed: the list is handed on)."""

    def __init__(self, fn: Any, absent: tuple[int, ...]):
        self._boxed_call = True
        self.fn, self.drop = fn, tuple(reversed(absent))

    def __call__(self, args: list) -> Any:
        for i in self.drop:
            del args[i]
        return self.fn(args)


class _Filled:
    """Calls the graph as traced with the absent tangents filled with zeros (the fallback
    when the fold fails: what autograd would have done)."""

    def __init__(self, fn: Any, absent: tuple[int, ...], gm: fx.GraphModule):
        self._boxed_call = True
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        self.fn, self.vals = fn, {i: placeholders[i].meta.get("val") for i in absent}

    def __call__(self, args: list) -> Any:
        for i, val in self.vals.items():
            args[i] = _zeros_like_traced(val)
        return self.fn(args)


class AbsentGrads:
    """One capture's forward side: after each call, autograd is told not to fill the
    absent gradients of the outputs with zeros (TangentVariants takes them as zero)."""

    def __init__(self) -> None:
        self._local = threading.local()  # the outputs one call's forward made
        self.returns = 0  # how many of the forward's outputs the autograd node returns
        self.marked = 0  # calls whose node was told

    def watch(self, fw: Any, returns: int) -> Any:
        """The compiled forward `fw`, noting the first `returns` outputs it made."""
        self.returns = returns
        local = self._local

        def forward(args: list) -> Any:
            given = {id(a) for a in args}  # the program clears args
            outs = fw(args)
            # made by this call: not one of its inputs (a tensor passed through from
            # another graph has that graph's node). Not "no autograd node yet": CUDA
            # graph trees return the same tensor objects at every replay, which still
            # hold the previous step's node until the Function resets them
            local.made = [
                o for o in outs[:returns] if isinstance(o, torch.Tensor) and id(o) not in given
            ]
            return outs

        forward._boxed_call = True  # type: ignore[attr-defined]
        return forward

    def wrap(self, compiled: Any) -> Any:
        """What Dynamo calls: `compiled`, then the node of the outputs told."""
        local = self._local

        @functools.wraps(compiled)
        def call(*args: Any) -> Any:
            local.made = None
            out = compiled(*args)
            made, local.made = local.made, None
            if made and not _compiled_autograd():
                for o in made:
                    node = o.grad_fn  # the ctx of AOTAutograd's CompiledFunction
                    # (an output that aliases an input is a view made outside it)
                    if node is not None and hasattr(node, "set_materialize_grads"):
                        node.set_materialize_grads(False)
                        self.marked += 1
                        break
            return out

        return torch._dynamo.disable(call, reason="fuser: absent gradients, after the call")


def _compiled_autograd() -> bool:
    from torch._dynamo import compiled_autograd

    return bool(
        compiled_autograd.compiled_autograd_enabled
        or compiled_autograd.in_compiled_autograd_region
        or getattr(torch._dynamo.config, "compiled_autograd", False)
    )


def forward_returns() -> int | None:
    """How many outputs of the forward graph being compiled AOTAutograd's Function
    returns (None when this graph is not one whose absent gradients fuser can take:
    tensor subclasses, or no AOTAutograd metadata)."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is None:
        return None
    try:
        from torch._functorch._aot_autograd.schemas import PlainTensorMeta

        if not all(isinstance(m, PlainTensorMeta) for m in meta.subclass_tangent_meta):
            return None
        return int(meta.num_forward_returns)
    except (AttributeError, ImportError):
        return None

"""`fuser.trace`: capture a model or function with example inputs and see what fuser makes
of it (graphs, fused regions, kernels, ATen fallbacks), forward and backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from fuser.dynamo.backend import Capture, FuserBackend
from fuser.dynamo.explain import explain
from fuser.dynamo.lower import Fallback, GraphRecord
from fuser.dynamo.region import RegionRecord
from fuser.explanation import Explanation


@dataclass
class Trace:
    """What `fuser.trace` captured: Dynamo graphs, their ATen graphs, regions and kernels."""

    captures: list[Capture]
    outputs: Any
    compiled: Any

    @property
    def graphs(self) -> list[GraphRecord]:
        return [g for c in self.captures for g in c.graphs]

    @property
    def regions(self) -> list[RegionRecord]:
        return [r for g in self.graphs for r in g.regions]

    @property
    def kernels(self) -> list[Any]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def fallbacks(self) -> list[Fallback]:
        return [f for g in self.graphs for f in g.fallbacks]

    def explain(self, source: bool = False, brief: bool = False) -> Explanation:
        return explain(self, source=source, brief=brief)

    def __str__(self) -> str:
        return self.explain()


def trace(
    fn: Any,
    *example_inputs: Any,
    backward: bool | None = None,
    strict: bool = False,
    **kwargs: Any,
) -> Trace:
    """Compile `fn` (a module or function) with fuser, run it once on `example_inputs`,
    and, when an output requires grad (or `backward=True`), run one backward pass with
    random output gradients so the backward graph is compiled too. Gradients are
    returned by torch.autograd.grad, so no `.grad` of the model changes.
    """
    backend = FuserBackend(strict=strict)
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    outputs = compiled(*example_inputs, **kwargs)
    if backward is not False:
        _run_backward(fn, example_inputs, outputs, required=bool(backward))
    return Trace(backend.captures, outputs, compiled)


def _run_backward(fn: Any, inputs: tuple, outputs: Any, required: bool) -> None:
    leaves = [x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    if isinstance(fn, torch.nn.Module):
        leaves += [p for p in fn.parameters() if p.requires_grad]
    outs = [
        t
        for t in tree_leaves(outputs)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    if not (outs and leaves):
        if required:
            raise ValueError("trace(backward=True): no output requires grad")
        return
    # a private generator: tracing must not move the caller's random stream
    gen = torch.Generator(device=outs[0].device).manual_seed(0)
    grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype, device=t.device) for t in outs]
    torch.autograd.grad(outs, leaves, grads, allow_unused=True)

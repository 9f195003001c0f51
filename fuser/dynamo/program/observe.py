"""The first call of a lowered graph, watched: what the call program is built from.

The graph is run once the old way (an FX interpreter over the rewritten graph, whose
fused regions plan and compile their kernels for the real inputs on that call). What it
records is what every later call will see again, because Dynamo's guards fix the shapes,
strides and dtypes of the graph's inputs (dynamic=False) and every other value is made by
the graph from those:

- each tensor's layout (shape, strides, storage offset relative to its base's), so views
  are resolved once instead of traced again at every call;
- each fused region's plan (the CompiledFusion its FusionDefinition chose for the real
  inputs), so its kernels are launched directly;
- each graph input's pointer alignment, the one fact the guards do not fix and the
  kernels are specialized to: the program checks it on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from fuser.config import config
from fuser.runtime.executor import signature


@dataclass(frozen=True)
class Layout:
    """A tensor as the first call saw it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # storage offset, in elements
    dtype: torch.dtype
    device: torch.device
    align: int  # data_ptr() & 15

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        return Layout(
            tuple(t.shape),
            tuple(t.stride()),
            t.storage_offset(),
            t.dtype,
            t.device,
            t.data_ptr() & 15,
        )


@dataclass
class Observed:
    """What one call of the rewritten graph showed, per FX node."""

    layouts: dict[fx.Node, Layout] = field(default_factory=dict)
    # per call_module node: the region's CompiledFusion for this call, or None when the
    # region ran its ATen ops (it fell back)
    plans: dict[fx.Node, Any] = field(default_factory=dict)
    # per tensor node, its storage's address: whether a reshape returned a view of its
    # input (the same storage) or a copy, which its input's layout decides, so every
    # later call does the same
    storage: dict[fx.Node, int] = field(default_factory=dict)

    def shares_storage(self, n: fx.Node, base: Any) -> bool:
        """Whether n's tensor was seen in base's storage (neither of them empty)."""
        a, b = self.storage.get(n), self.storage.get(base)
        return a is not None and a == b

    def device(self) -> torch.device | None:
        """A CUDA device the call used if any (a graph may also hold CPU tensors: scalars,
        step counters), else the first tensor's."""
        devices = [lay.device for lay in self.layouts.values()]
        return next((d for d in devices if d.type == "cuda"), devices[0] if devices else None)


class _Watching(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, seen: Observed):
        super().__init__(gm)  # frees each value after its last use, as the old path does
        self.seen = seen

    def run_node(self, n: fx.Node) -> Any:
        self._args: tuple = ()
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.seen.layouts[n] = Layout.of(out)
            if out.numel():  # an empty tensor's address says nothing
                self.seen.storage[n] = out.untyped_storage().data_ptr()
        if n.op == "call_module":
            region = self.module.get_submodule(n.target)
            fused = getattr(region, "record", None) is not None and region.record.fused
            self.seen.plans[n] = _plan_for(region, self._args) if fused else None
        return out

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        self._args = args
        return super().call_module(target, args, kwargs)


def _plan_for(region: Any, args: tuple) -> Any:
    """The plan the region's FusionDefinition has for `args` (None if it has none): looked
    up by their signature, as fd.execute looks it up, not taken from the executor's last
    plan, which another thread running the same definition (regions of one definition are
    shared, fuser/dynamo/region.py) may have replaced in the meantime."""
    try:
        key = (signature(list(args)), config.backend, None)
    except Exception:
        return None
    return region.fd._runtime().cache.get(key)


def watch_first_call(gm: fx.GraphModule, args: list) -> tuple[Any, Observed]:
    """Run gm on `args` (boxed: the list is cleared) and return (its result, what it saw)."""
    seen = Observed()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, a in zip(placeholders, args):  # boxed_run does not run placeholder nodes
        if isinstance(a, torch.Tensor):
            seen.layouts[n] = Layout.of(a)
            if a.numel():
                seen.storage[n] = a.untyped_storage().data_ptr()
    result = _Watching(gm, seen).boxed_run(args)
    return result, seen

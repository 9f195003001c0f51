"""From a lowered FX graph and its first call to a list of steps: the call program's IR.

A step is one line of the program: an allocation, a kernel launch, an ATen call, a view
resolved at compile time, or a call of a region that cannot be inlined. Each says which
names it defines and reads and whose storage its result may share, which is all the
memory plan (memory.py) needs; emit.py prints them.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

from fuser.dynamo.program.observe import Layout, Observed
from fuser.dynamo.program.regions import inline_region, not_inlined
from fuser.dynamo.program.step import Step

aten = torch.ops.aten

# single-result view ops: the result's layout is the one the first call saw, at the same
# offset from its base's (Dynamo's guards fix every layout; storage offsets they do not
# fix, so an offset is kept relative). as_strided is not here: its offset is absolute.
VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor, aten.select.int,
    aten.alias.default, aten.diagonal.default,
}  # fmt: skip
# ops that return a view of their input or a copy, as its layout allows: the first
# call's layouts decide, and every later call has them
MAYBE_VIEWS = {aten.reshape.default}
# views with a tuple of results, each taken by a getitem
TUPLE_VIEWS = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int}


class Names:
    """Globals of the generated module: each object bound once, under a readable name
    that no FX node of the graph uses."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.globals: dict[str, Any] = {}
        self._ids: dict[int, str] = {}
        self._count = 0

    def bind(self, obj: Any, hint: str) -> str:
        known = self._ids.get(id(obj))
        if known is not None:
            return known
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in hint)
        base, i = name, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        self.globals[name] = obj
        self._ids[id(obj)] = name
        return name

    def fresh(self, hint: str) -> str:
        """A new local name (a buffer)."""
        while f"{hint}{self._count}" in self.taken:
            self._count += 1
        name = f"{hint}{self._count}"
        self.taken.add(name)
        return name


def render(arg: Any, names: Names, local: dict[fx.Node, str], uses: list[str]) -> str:
    """`arg` of an FX call as Python source; the names it reads are added to `uses`."""
    if isinstance(arg, fx.Node):
        uses.append(local[arg])
        return local[arg]
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(render(a, names, local, uses) for a in arg)
        if isinstance(arg, list):
            return f"[{inner}]"
        return f"({inner},)" if len(arg) == 1 else f"({inner})"
    if arg is None or isinstance(arg, (bool, int, str)):
        return repr(arg)
    if isinstance(arg, float) and math.isfinite(arg):
        return repr(arg)
    return names.bind(arg, f"c_{type(arg).__name__}")  # dtype, device, inf, ...


def _op_name(target: Any) -> str:
    return (
        str(target).replace(".", "_")
        if isinstance(target, torch._ops.OpOverload)
        else (getattr(target, "__name__", "fn"))
    )


def view_code(name: str, base: str, view: tuple) -> str:
    fn, shape, stride, offset = view
    return f"{name} = {fn}({base}, {shape}, {stride}, {offset})"


def _what(n: fx.Node) -> str:
    """The op a call step calls, as census.py counts it."""
    if n.op == "call_module":
        return "region"
    return str(n.target) if isinstance(n.target, torch._ops.OpOverload) else _op_name(n.target)


def _storages(val: Any) -> set:
    vals = val if isinstance(val, (list, tuple)) else [val]
    return {StorageWeakRef(v.untyped_storage()) for v in vals if isinstance(v, torch.Tensor)}


def _aliased_inputs(n: fx.Node, local: dict[fx.Node, str]) -> tuple[str, ...]:
    """Inputs of n whose storage n's result may share: those AOTAutograd's fake tensors
    say it shares (a view op, an in-place copy_), all of them when a value is missing."""
    inputs = [p for p in n.all_input_nodes if p in local]
    out = _storages(n.meta.get("val"))
    if not out and n.meta.get("val") is not None:
        return ()  # no tensor result
    if not out or any(p.meta.get("val") is None for p in inputs):
        return tuple(local[p] for p in inputs)
    return tuple(local[p] for p in inputs if _storages(p.meta["val"]) & out)


def _getitem_users(n: fx.Node) -> list[fx.Node] | None:
    users = list(n.users)
    if all(u.target is operator.getitem and isinstance(u.args[1], int) for u in users):
        return users
    return None


class StepBuilder:
    """Walks the rewritten graph in order and makes its steps."""

    def __init__(self, gm: fx.GraphModule, seen: Observed):
        self.gm, self.seen = gm, seen
        self.names = Names({n.name for n in gm.graph.nodes} | {"args", "stream", "dev"})
        self.local: dict[fx.Node, str] = {}
        self.steps: list[Step] = []
        self.inputs: list[str] = []
        self.result = "()"
        self.result_uses: list[str] = []
        self.inlined: list[Any] = []  # region records whose kernels the program launches
        self.skip: set[fx.Node] = set()  # getitems their producer already defined
        # clones seen in their source's layout (copies.py drops those nobody can tell)
        self.clones: dict[str, str] = {}
        # bytes per element of each view's tensor (pointers.py offsets a base's pointer)
        self.itemsize: dict[str, int] = {}

    def build(self) -> list[Step]:
        for n in self.gm.graph.nodes:
            if n in self.skip:
                continue
            getattr(self, f"_{n.op}")(n)
        return self.steps

    def _placeholder(self, n: fx.Node) -> None:
        self.local[n] = n.name
        self.inputs.append(n.name)

    def _get_attr(self, n: fx.Node) -> None:
        obj = self.gm
        for part in n.target.split("."):
            obj = getattr(obj, part)
        self.local[n] = self.names.bind(obj, n.name)

    def _output(self, n: fx.Node) -> None:
        uses: list[str] = []
        self.result = render(n.args[0], self.names, self.local, uses)
        self.result_uses = uses

    def _call_module(self, n: fx.Node) -> None:
        region = self.gm.get_submodule(n.target)
        plan = self.seen.plans.get(n)
        users = _getitem_users(n) or []
        outs = {u.args[1]: u for u in users}
        if plan is None:
            why = "no plan (the region runs as ATen ops)"
        else:
            why = not_inlined(n, region, plan, outs, self)
        if not why:
            self.steps += inline_region(n, region, plan, outs, self)
            self.inlined.append(region.record)
            self.skip.update(users)
            return
        fn = self.names.bind(region, n.target)
        self._call(n, fn, list(n.args), {}, kind="region", fresh=True, count=len(region.slots))
        self.steps[-1].op = why

    def _call_function(self, n: fx.Node) -> None:
        if n.target in VIEWS and self._view(n, n.args[0], n):
            return
        maybe = n.target in MAYBE_VIEWS and self.seen.shares_storage(n, n.args[0])
        if maybe and self._view(n, n.args[0], n):
            return
        if n.target in TUPLE_VIEWS and self._tuple_view(n):
            return
        fn = self.names.bind(n.target, _op_name(n.target))
        self._call(n, fn, list(n.args), dict(n.kwargs))
        if n.target is aten.clone.default and self._same_layout(n, n.args[0]):
            self.clones[self.local[n]] = self.local[n.args[0]]

    def _same_layout(self, n: fx.Node, base: Any) -> bool:
        """Whether the first call saw n's tensor as base's: shape, strides, dtype, device
        and pointer alignment (a kernel reading either is specialized to it)."""
        lay, blay = self.seen.layouts.get(n), self.seen.layouts.get(base)
        if lay is None or blay is None or base not in self.local:
            return False
        return lay == Layout(
            blay.shape, blay.stride, lay.offset, blay.dtype, blay.device, blay.align
        )

    def _view(self, n: fx.Node, base: Any, named: fx.Node) -> bool:
        """`named = reinterpret(base, ...)` with the layout the first call saw."""
        lay, blay = self.seen.layouts.get(n), self.seen.layouts.get(base)
        if lay is None or blay is None or base not in self.local:
            return False
        if lay.dtype != blay.dtype or lay.device != blay.device:
            return False
        b = self.local[base]
        self.local[named] = named.name
        fn = self.names.bind(torch._C._dynamo.guards._reinterpret_tensor, "reinterpret")
        view = (fn, lay.shape, lay.stride, lay.offset - blay.offset)
        self.itemsize[named.name] = lay.dtype.itemsize
        code = view_code(named.name, b, view)
        self.steps.append(Step("view", (named.name,), (b,), code, aliases=(b,), view=view))
        return True

    def _tuple_view(self, n: fx.Node) -> bool:
        users = _getitem_users(n)
        base = n.args[0]
        if not users or not all(u in self.seen.layouts for u in users):
            return False
        for u in users:
            lay, blay = self.seen.layouts[u], self.seen.layouts.get(base)
            if blay is None or lay.dtype != blay.dtype or base not in self.local:
                return False
        for u in users:
            self._view(u, base, u)
            self.skip.add(u)
        return True

    def _call(
        self,
        n: fx.Node,
        fn: str,
        args: list,
        kwargs: dict,
        kind: str = "call",
        fresh: bool = False,
        count: int | None = None,
    ) -> None:
        uses: list[str] = []
        text = ", ".join(
            [render(a, self.names, self.local, uses) for a in args]
            + [f"{k}={render(v, self.names, self.local, uses)}" for k, v in kwargs.items()]
        )
        aliases = () if fresh else _aliased_inputs(n, self.local)
        users = _getitem_users(n)
        val = n.meta.get("val")
        if count is None and isinstance(val, (list, tuple)):
            count = len(val)
        if n.target is operator.getitem or not users or count is None:
            if n.target is operator.getitem:  # of a tuple that was kept whole
                code = f"{n.name} = {uses[0]}[{args[1]!r}]"
                aliases = (uses[0],)
            else:
                code = f"{n.name} = {fn}({text})"
            self.local[n] = n.name
            self.steps.append(Step(kind, (n.name,), tuple(uses), code, aliases, op=_what(n)))
            return
        # a tuple taken apart at once: an element nobody reads is dropped right away
        by_index = {u.args[1]: u for u in users}
        targets = [by_index[i].name if i in by_index else "_" for i in range(count)]
        for u in users:
            self.local[u] = u.name
            self.skip.add(u)
        lhs = ", ".join(targets) + ("," if len(targets) == 1 else "")
        code = f"{lhs} = {fn}({text})" + ("\ndel _" if "_" in targets else "")
        defined = tuple(t for t in targets if t != "_")
        self.steps.append(Step(kind, defined, tuple(uses), code, aliases, op=_what(n)))

"""What every ATen lowering uses: the lowering table, the context, dtype and scalar helpers.

A lowering turns one FX node of an AOTAutograd graph into fuser IR inside the region's
FusionDefinition. It reads its operands through `LowerCtx`, computes in the dtype ATen
computes in (float32 for half/bf16 operands, as ATen's opmath), and returns one fuser
tensor per output; `finish` rounds each to the dtype ATen gives and checks the shape.
What a lowering cannot express raises `NotLowerable` with the reason `explain` shows.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from fuser.config import use_interpreter
from fuser.frontend.builder import Tensor
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.ir.dtypes import DType

Number = bool | int | float
Lowering = Callable[["LowerCtx", fx.Node], Any]

# ATen op overload -> lowering; filled by the lowering modules through `register`
LOWERINGS: dict[Any, Lowering] = {}
# ops that move no data (views, expand, identities, constants): a region made only of
# them is not worth a kernel, and as a region's outputs they would be materialized
FREE: set[Any] = set()

# ops that stay calls but are fuser's own (an FX node -> explain's text of what it does):
# fuser::linear_cross_entropy (linear_ce.py) runs its kernels inside the call
EXPLAINED: dict[Any, Callable[[fx.Node], str]] = {}

SUPPORTED_DTYPES = {d.torch for d in DType}


class NotLowerable(Exception):
    """This node cannot become fuser IR; the message says why (shown by explain)."""


class NothingToFuse(NotLowerable):
    """A region whose outputs are all its inputs (views of them): no kernel to make. Its
    ops stay ATen as free views, which is not a fallback."""


def register(*targets: Any, free: bool = False) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for t in targets:
            LOWERINGS[t] = fn
            if free:
                FREE.add(t)
        return fn

    return deco


def meta_of(node: fx.Node) -> Any:
    """The fake tensor (or tuple of them) AOTAutograd recorded for `node`."""
    val = node.meta.get("val")
    if val is None:
        raise NotLowerable(f"{node.name} has no recorded value (no node.meta['val'])")
    return val


def value_of(n: Any) -> Any:
    """`n`'s recorded fake tensor, or None (an argument that is not a node, or no record):
    for the graph rewrites, which look before they act."""
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def call_with_value(graph: fx.Graph, target: Any, args: tuple, kwargs: dict | None = None) -> Any:
    """A new call of `target` in `graph` at its insertion point, its fake value worked out
    from its arguments' (the graph rewrites' new nodes carry values as AOTAutograd's do)."""
    kwargs = kwargs or {}
    n = graph.call_function(target, args, kwargs)
    n.meta["val"] = target(*[value_of(a) if isinstance(a, fx.Node) else a for a in args], **kwargs)
    return n


def static_shape(t: torch.Tensor, what: str) -> list[int]:
    shape = list(t.shape)
    if not all(isinstance(s, int) for s in shape):
        raise NotLowerable(f"{what} has symbolic shape {shape}")
    return shape


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """ATen's opmath: half and bfloat16 compute in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class LowerCtx:
    """Lowers FX nodes into one FusionDefinition; `values` maps FX nodes to fuser values."""

    def __init__(self, fd: FusionDefinition):
        self.fd = fd
        self.ops = fd.ops
        self.values: dict[fx.Node, Any] = {}
        self.device: torch.device | None = None
        # value id -> (source, broadcast_dims) for every broadcast made here, so chains of
        # views compose into one broadcast from the source (fuser's segmenter maps values
        # of the kernel's rank, or its rows or columns, not lower-rank intermediates)
        self.broadcasts: dict[int, tuple[Tensor, tuple[int, ...]]] = {}
        # value id -> (table, index) of every gather_rows made here: a broadcast of
        # gathered rows is a gather at the broadcast index (broadcast)
        self.gathers: dict[int, tuple[Tensor, Tensor]] = {}

    # -- operands ------------------------------------------------------------------
    def define_input(self, node: fx.Node) -> Tensor:
        val = meta_of(node)
        if not isinstance(val, torch.Tensor):
            raise NotLowerable(f"input {node.name} is a {type(val).__name__}, not a tensor")
        if val.dtype not in SUPPORTED_DTYPES:
            raise NotLowerable(f"input {node.name} has dtype {val.dtype}, which fuser lacks")
        self._check_device(node, val.device, val.dim() == 0)
        t = self.fd.define_tensor(static_shape(val, f"input {node.name}"), val.dtype)
        self.values[node] = t
        return t

    def _check_device(self, node: fx.Node, device: torch.device, scalar: bool = False) -> None:
        if device.type == "cpu" and not use_interpreter():
            if scalar:  # a step counter, a scale kept on the host: common, and cheap to fix
                why = (
                    f"input {node.name} is a CPU scalar tensor in a process with a GPU, so the "
                    "ops that use it stay ATen (keep it on the GPU, or pass a Python number)"
                )
            else:
                why = (
                    "CPU tensors run through Triton's interpreter, which fuser uses in a "
                    "process without a GPU or with TRITON_INTERPRET=1; this one has a GPU "
                    "(move the model and inputs to cuda)"
                )
            # every region of the graph stays ATen: say so once, not only in explain
            warnings.warn(f"fuser: {why}", stacklevel=2)
            raise NotLowerable(why)
        if device.type not in ("cuda", "cpu", "meta"):
            raise NotLowerable(f"input {node.name} is on {device}; fuser runs on cuda")
        if self.device is not None and device != self.device:
            raise NotLowerable(f"operands on {self.device} and {device}")
        self.device = device

    def tensor(self, arg: Any) -> Tensor:
        v = self.operand(arg)
        if not isinstance(v, Tensor):
            raise NotLowerable(f"expected a tensor operand, got {arg!r}")
        return v

    def operand(self, arg: Any) -> Tensor | Number:
        """A fuser tensor for an FX node, or the Python number a scalar argument holds."""
        if isinstance(arg, fx.Node):
            if arg not in self.values:
                raise NotLowerable(f"operand {arg.name} is not available in this region")
            v = self.values[arg]
            if isinstance(v, tuple):
                raise NotLowerable(f"operand {arg.name} is a tuple; expected a tensor")
            return v
        if isinstance(arg, (bool, int, float)):
            return arg
        raise NotLowerable(f"operand {arg!r} of type {type(arg).__name__} is not a number")

    # -- broadcasts ----------------------------------------------------------------
    def broadcast(self, t: Tensor, shape: Sequence[int], dims: Sequence[int]) -> Tensor:
        """broadcast_in_dim, composed with the broadcast that made `t` if there is one."""
        shape, dims = [int(s) for s in shape], list(dims)
        if t.value.id in self.broadcasts:
            t, inner = self.broadcasts[t.value.id]
            dims = [dims[d] for d in inner]
        if [int(s) for s in t.shape] == shape and dims == list(range(len(shape))):
            return t
        gathered = self.gathers.get(t.value.id)
        if gathered and gathered[1].ndim and dims and dims[-1] == len(shape) - 1:
            # rows of a table broadcast over leading dims (GPT-2's position embedding
            # over the batch): the rows at the broadcast index, so the gather fuses into
            # the consumer; what is materialized is the [B, T] index, not [B, T, H] rows
            table, index = gathered
            at = self.broadcast(index, shape[:-1], dims[:-1])
            out = self.ops.gather_rows(table, at)
            self.gathers[out.value.id] = (table, at)
            return out
        y = self.ops.broadcast_in_dim(t, shape=shape, broadcast_dims=dims)
        self.broadcasts[y.value.id] = (t, tuple(dims))
        return y

    def expand_to(self, t: Tensor | Number, shape: Sequence[int]) -> Tensor | Number:
        """numpy broadcasting of a tensor operand to `shape` (numbers stay scalars)."""
        if not isinstance(t, Tensor) or t.ndim == 0 or [int(s) for s in t.shape] == list(shape):
            return t
        return self.broadcast(t, shape, range(len(shape) - t.ndim, len(shape)))

    # -- dtypes --------------------------------------------------------------------
    def cast(self, t: Tensor | Number, dtype: torch.dtype) -> Tensor | Number:
        """`t` in `dtype` (a Python number becomes a constant of that dtype)."""
        if not isinstance(t, Tensor):
            return self.scalar(t, dtype)
        if t.dtype == dtype:
            return t
        if t.value.id in self.broadcasts:  # cast the source, then broadcast: cheaper too
            src, dims = self.broadcasts[t.value.id]
            return self.broadcast(self.cast(src, dtype), t.shape, dims)  # type: ignore
        return self.ops.cast(t, dtype)

    def scalar(self, value: Number, dtype: torch.dtype) -> Tensor:
        if dtype.is_floating_point:
            value = float(value)
        elif dtype == torch.bool:
            value = bool(value)
        else:
            value = int(value)
        return self.fd.define_scalar(value, dtype=dtype)

    def up(self, t: Tensor) -> Tensor:
        """`t` in its compute dtype (float32 for half/bf16)."""
        return self.cast(t, compute_dtype(t.dtype))  # type: ignore[return-value]

    def finish(self, node: fx.Node, outs: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
        """Round each output to ATen's dtype and check its shape against ATen's."""
        val = meta_of(node)
        metas = list(val) if isinstance(val, (tuple, list)) else [val]
        if len(metas) != len(outs):
            raise NotLowerable(f"lowered {len(outs)} outputs, ATen gives {len(metas)}")
        done: list[Tensor | None] = []
        for i, (t, m) in enumerate(zip(outs, metas)):
            if t is None or m is None:
                done.append(None)
                continue
            want = static_shape(m, f"output {i} of {node.name}")
            if [int(s) for s in t.shape] != want:
                raise NotLowerable(
                    f"output {i} lowered to shape {list(t.shape)}, ATen gives {want}"
                )
            if m.dtype not in SUPPORTED_DTYPES:
                raise NotLowerable(f"output dtype {m.dtype} is not supported by fuser")
            done.append(self.cast(t, m.dtype))  # type: ignore[arg-type]
        return tuple(done)


def out_meta(node: fx.Node) -> torch.Tensor:
    val = meta_of(node)
    if not isinstance(val, torch.Tensor):
        raise NotLowerable(f"{node.name} does not produce a single tensor")
    return val


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument `index` (positional) or `name` (keyword) of an FX call."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)

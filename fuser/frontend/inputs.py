"""The inputs given to execute, reference, compile and bind, checked against the
definition: each problem is an InputError that names the input (its position and its
name in the definition), what was expected and what came."""

from __future__ import annotations

import warnings
from typing import Any

import sympy
import torch

from fuser.errors import InputError
from fuser.ir.dtypes import dtype_of
from fuser.ir.graph import Graph, Value

# the torch dtypes fuser has a DType for
_TORCH_OK = {
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
}


def describe(x: Any) -> str:
    """What came, in a few words: 'a torch.float32 tensor of shape [3, 8] on cpu'."""
    if isinstance(x, torch.Tensor):
        layout = "" if x.layout == torch.strided else f" with layout {x.layout}"
        return f"a {x.dtype} tensor of shape {list(x.shape)} on {x.device}{layout}"
    if x is None:
        return "None"
    kind = type(x).__module__.split(".")[0] + "." + type(x).__name__
    kind = kind.removeprefix("builtins.")
    if isinstance(x, (bool, int, float, complex)):
        return f"a {kind} ({x!r})"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"a {kind} of shape {list(x.shape)} and dtype {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"a {kind} of {len(x)} item(s)"
    return f"a {kind}"


def expected(v: Value) -> str:
    """The tensor the definition wants for input `v` ('?': any size)."""
    dims = ", ".join(str(d) if isinstance(d, int) else "?" for d in v.shape)
    return f"a {v.dtype.torch} tensor of shape [{dims}]"


def _convert_hint(x: Any) -> str:
    if type(x).__module__ == "numpy":
        return " (torch.from_numpy converts it)"
    if isinstance(x, (list, tuple, bool, int, float)):
        return " (torch.tensor converts it; a constant can also be fd.define_scalar)"
    return ""


def input_list(inputs: Any, graph: Graph, fusion: str, entry: str) -> list:
    """`inputs` as a list (a tuple is fine too); anything else is an InputError."""
    if isinstance(inputs, list):
        return inputs
    if isinstance(inputs, tuple):
        return list(inputs)
    names = ", ".join(v.name for v in graph.inputs)
    hint = " (wrap a single tensor: [x])" if isinstance(inputs, torch.Tensor) else ""
    raise InputError(
        f"{entry}: {fusion} takes a list of tensors, one per input ({names}); "
        f"got {describe(inputs)}{hint}"
    )


def check_inputs(graph: Graph, inputs: Any, fusion: str, entry: str) -> dict[sympy.Symbol, int]:
    """Check `inputs` against `graph`'s inputs; the size each symbolic dim takes.
    execute also needs data: a meta tensor is an error there (compile plans from them)."""
    inputs = input_list(inputs, graph, fusion, entry)
    want = graph.inputs
    if len(inputs) != len(want):
        names = ", ".join(v.name for v in want)
        few = len(inputs) < len(want)
        missing = f"; {want[len(inputs)].name} is the first missing" if few else ""
        raise InputError(
            f"{entry}: {fusion} defines {len(want)} inputs ({names}), got {len(inputs)}{missing}"
        )
    binding: dict[sympy.Symbol, int] = {}
    first: tuple[str, torch.device] | None = None
    for i, (v, t) in enumerate(zip(want, inputs)):
        what = f"{entry}: input {i} ({v.name})"
        _check_tensor(what, v, t, needs_data=entry == "execute")
        for size, got in zip(v.shape, t.shape):
            if not isinstance(size, int):
                binding[size] = int(got)
        if first is None:
            first = (f"input {i} ({v.name})", t.device)
        elif t.device != first[1]:
            raise InputError(
                f"{what} is on {t.device} but {first[0]} is on {first[1]}; "
                "expected all inputs on one device"
            )
    return binding


def _check_tensor(what: str, v: Value, t: Any, needs_data: bool) -> None:
    if not isinstance(t, torch.Tensor):
        raise InputError(
            f"{what} is {describe(t)}, not a tensor; expected {expected(v)}{_convert_hint(t)}"
        )
    if t.layout != torch.strided:
        raise InputError(
            f"{what} has layout {t.layout}; expected a dense (torch.strided) tensor, "
            "as .to_dense() gives"
        )
    if t.dtype not in _TORCH_OK or dtype_of(t.dtype) != v.dtype:
        raise InputError(f"{what} has dtype {t.dtype}, expected {v.dtype.torch}")
    if t.dim() != v.rank:
        raise InputError(
            f"{what} has rank {t.dim()} (shape {list(t.shape)}), expected rank {v.rank} "
            f"({expected(v)})"
        )
    for d, (size, got) in enumerate(zip(v.shape, t.shape)):
        if isinstance(size, int) and size != got:
            raise InputError(f"{what} has size {got} at dim {d}, expected {size}")
    if needs_data and t.is_meta:
        raise InputError(
            f"{what} is on the meta device, which holds no data; execute runs on real "
            "tensors (fd.compile plans from meta tensors)"
        )


def requires_grad(inputs: list[torch.Tensor]) -> bool:
    """Whether an input requires grad while grad mode is on (execute's hot path: a loop
    costs about half what any() over a generator does)."""
    for t in inputs:
        if t.requires_grad:
            return torch.is_grad_enabled()
    return False


def warn_grad(inputs: list[torch.Tensor], graph: Graph, fusion: str) -> None:
    """The warning fd.execute gives, once per FusionDefinition, for inputs that require
    grad while grad mode is on: its outputs are new tensors outside any autograd graph."""
    i = next(i for i, t in enumerate(inputs) if t.requires_grad)
    warnings.warn(
        f"fuser: {fusion}.execute: input {i} ({graph.inputs[i].name}) requires grad, but "
        "execute records no autograd graph: its outputs do not require grad and backward() "
        'will not reach the inputs. For training use torch.compile(model, backend="fuser"), '
        "which fuses the backward too; detach the inputs to silence this (warned once per "
        "FusionDefinition)",
        UserWarning,
        stacklevel=3,
    )

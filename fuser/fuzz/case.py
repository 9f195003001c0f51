"""A fuzz case as plain data, and how to turn it into a FusionDefinition and inputs.

The generator draws a `FuzzCase`; everything else (building, running, printing the
repro) reads it. Keeping the case as data, not as a built fusion, is what lets
hypothesis shrink it and lets a failure be replayed from its printed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.frontend.fusion_definition import FusionDefinition
from fuser.ir.printer import graph_repro

# input layouts: what a kernel must not assume about the tensors it is given
LAYOUTS = ("contiguous", "offset", "transposed", "strided", "row_sliced", "expanded")
SPECIALS = ("none", "nan", "inf", "nan_inf")


@dataclass(frozen=True)
class Ref:
    """An operand that is value number `index` of the case (inputs and op results)."""

    index: int


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str
    layout: str = "contiguous"
    # sizes left to execute time (-1); size-1 dims are always static, so they broadcast
    symbolic: bool = True
    # the last dim static even where the others are symbolic: a slice, pad or cat along
    # it needs its size at compile time (a model's hidden size is; its tokens are not)
    static_last: bool = False

    def define_shape(self) -> list[int]:
        last = len(self.shape) - 1
        return [
            -1 if self.symbolic and s != 1 and not (self.static_last and i == last) else s
            for i, s in enumerate(self.shape)
        ]


@dataclass(frozen=True)
class Step:
    """One `fd.ops.<op>(*args, **kwargs)` call, or an input (`op == "input"`)."""

    op: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class FuzzCase:
    domain: tuple[int, ...]
    inputs: tuple[InputSpec, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    data_seed: int = 0
    scale: float = 1.0
    specials: str = "none"
    backend: str = "triton"  # the code generator fuser runs the case with
    notes: tuple[str, ...] = field(default=(), compare=False)

    def size(self) -> tuple[int, int, int]:
        """A rough measure for keeping the smallest of several failing cases."""
        return (len(self.steps), math.prod(self.domain), len(self.inputs))

    def summary(self) -> str:
        ops = [s.op for s in self.steps if s.op != "input"]
        ins = ", ".join(f"{i.dtype}{list(i.shape)}:{i.layout}" for i in self.inputs)
        return (
            f"domain {list(self.domain)}; inputs {ins}; ops {' '.join(ops)}; "
            f"data seed {self.data_seed} scale {self.scale} specials {self.specials}; "
            f"backend {self.backend}"
        )


# -- building -------------------------------------------------------------------------
def build(case: FuzzCase, name: str = "fuzz") -> FusionDefinition:
    """The case as a FusionDefinition (symbolic sizes where the inputs ask for them)."""
    with FusionDefinition(name) as fd:
        values: list[Any] = []
        dims: list[Any] = list(case.domain)  # sizes of the domain, symbolic when known so

        def arg(a: Any) -> Any:
            if isinstance(a, tuple):  # a cat's operands
                return [arg(x) for x in a]
            return values[a.index] if isinstance(a, Ref) else a

        for step in case.steps:
            if step.op == "input":
                spec = case.inputs[step.args[0]]
                t = fd.define_tensor(spec.define_shape(), getattr(torch, spec.dtype))
                if tuple(spec.shape) == tuple(case.domain) and step.args[0] == 0:
                    dims = [t.shape[i] if s != 1 else 1 for i, s in enumerate(spec.shape)]
                values.append(t)
                continue
            kwargs = {k: arg(v) for k, v in step.kwargs}
            if kwargs.get("shape") == "domain":
                kwargs["shape"] = list(dims)
            if "dtype" in kwargs:
                kwargs["dtype"] = getattr(torch, kwargs["dtype"])
            out = getattr(fd.ops, step.op)(*[arg(a) for a in step.args], **kwargs)
            values.extend(out if isinstance(out, tuple) else [out])
        for i in case.outputs:
            fd.add_output(values[i])
    return fd


def make_input(
    spec: InputSpec,
    seed: int,
    scale: float = 1.0,
    specials: str = "none",
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Random data for `spec` in its layout; storage the view skips holds NaN, so a
    kernel that reads outside its view shows up as NaN where eager has none."""
    g = torch.Generator().manual_seed(seed)
    shape, dtype = tuple(spec.shape), getattr(torch, spec.dtype)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if specials != "none" and x.numel():
        picks = torch.rand(shape, generator=g) < max(0.02, 1.0 / x.numel())
        kinds = torch.rand(shape, generator=g)
        if specials == "nan":
            x = torch.where(picks, float("nan"), x)
        elif specials == "inf":
            x = torch.where(picks, torch.where(kinds < 0.5, -math.inf, math.inf), x)
        else:
            inf = torch.where(kinds < 0.7, math.inf, -math.inf)
            special = torch.where(kinds < 0.4, math.nan, inf)
            x = torch.where(picks, special, x)
    x = x.to(dtype).to(device)
    return with_layout(x, spec.layout)


def with_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """`x`'s values in the named layout (a copy; the original is untouched)."""
    nan = float("nan")
    shape, dt, dev = tuple(x.shape), x.dtype, x.device
    if layout == "contiguous" or x.dim() == 0:
        return x.clone()
    if layout == "offset":  # data one element into its storage: misaligned pointers
        flat = torch.full((x.numel() + 1,), nan, dtype=dt, device=dev)
        view = flat[1:].view(shape)
    elif layout == "transposed":  # the last two dims stored swapped
        if x.dim() < 2:
            return with_layout(x, "strided")
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout == "strided":  # every other element of the last dim
        wide = torch.full((*shape[:-1], 2 * shape[-1]), nan, dtype=dt, device=dev)
        view = wide[..., ::2]
    elif layout == "row_sliced":  # a column slice of wider rows (offset 1, row stride C+3)
        wide = torch.full((*shape[:-1], shape[-1] + 3), nan, dtype=dt, device=dev)
        view = wide[..., 1 : 1 + shape[-1]]
    elif layout == "expanded":  # stride 0 along the first dim of size > 1
        big = [d for d, s in enumerate(shape) if s > 1]
        if not big:
            return x.clone()
        return x.narrow(big[0], 0, 1).expand(shape)
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    view.copy_(x)
    return view


def make_inputs(case: FuzzCase, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    return [
        make_input(spec, case.data_seed * 1009 + i, case.scale, case.specials, device)
        for i, spec in enumerate(case.inputs)
    ]


# -- printing -------------------------------------------------------------------------
def repro(case: FuzzCase, fd: FusionDefinition | None = None, device: str = "cpu") -> str:
    """A runnable script: the FusionDefinition, its inputs, and the comparison."""
    fd = fd or build(case)
    lines = [
        f"# fuser fuzz repro: {case.summary()}",
        *[f"# {n}" for n in case.notes],
        graph_repro(fd.graph).rstrip("\n"),
        "",
        "from fuser.fuzz.case import InputSpec, make_input",
        "from fuser.fuzz.check import compare",
        "",
    ]
    if case.backend == "cuda" and not str(device).startswith("cuda"):
        lines += [
            "from fuser.runtime import cuda_backend",
            "",
            "cuda_backend.EMULATE_ON_CPU = True  # CPU tensors: the g++ emulator",
            "",
        ]
    lines += ["inputs = ["]
    for i, spec in enumerate(case.inputs):
        lines.append(
            f"    make_input({spec!r}, seed={case.data_seed * 1009 + i}, scale={case.scale!r}, "
            f"specials={case.specials!r}, device={device!r}),"
        )
    lines += ["]", f"print(compare(fd, inputs, backend={case.backend!r}) or 'no mismatch')"]
    return "\n".join(lines) + "\n"

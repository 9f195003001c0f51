"""FusionDefinition: the public API for building, printing, checking and running a fusion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from fuser.errors import DefinitionError, InputError
from fuser.frontend.builder import GraphBuilder, Tensor
from fuser.frontend.ops import Ops
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import evaluate
from fuser.ir.graph import Graph
from fuser.ir.printer import graph_repro
from fuser.passes import Pipeline, concretize, run_pipeline


class FusionDefinition:
    """Build a fusion inside `with FusionDefinition() as fd:`, then `fd.execute(inputs)`.

    `relaxed_precision=True` lets cast elimination drop real roundings such as
    `float(half(x))` round trips (faster, not bit-faithful to eager).
    """

    def __init__(self, name: str | None = None, relaxed_precision: bool = False):
        self.name = name or "fusion"
        self.relaxed_precision = relaxed_precision
        self._builder = GraphBuilder()
        self.ops = Ops(self._builder)
        self._graph: Graph | None = None
        self._executor: Any = None

    # -- building -------------------------------------------------------------------
    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self._finalize()

    def _open_builder(self) -> GraphBuilder:
        if self._graph is not None:
            raise DefinitionError(
                f"{self.name} is already finalized; define ops inside the `with` block"
            )
        return self._builder

    def define_tensor(
        self, shape: Sequence[int], dtype: Any = torch.float32, **layout: Any
    ) -> Tensor:
        """An input tensor; -1 in `shape` means the size is taken from the input at execute."""
        unknown = set(layout) - {"contiguity", "stride_order"}
        if unknown:
            raise DefinitionError(f"define_tensor: unknown argument(s) {sorted(unknown)}")
        return self._open_builder().define_input(list(shape), dtype)

    def define_scalar(self, value: Any, dtype: Any = None) -> Tensor:
        """A scalar constant of the fusion (a Python number, or a size like t1.shape[1])."""
        if not isinstance(value, (bool, int, float, sympy.Expr)):
            raise DefinitionError(f"define_scalar: {value!r} is not a number")
        return self._open_builder().const(value, dtype)

    def from_torch(self, tensor: torch.Tensor, static_shape: bool = False) -> Tensor:
        """An input shaped and typed like `tensor` (sizes stay symbolic unless static_shape)."""
        shape = list(tensor.shape) if static_shape else [-1] * tensor.dim()
        return self.define_tensor(shape, tensor.dtype)

    def add_output(self, tensor: Tensor) -> None:
        self._open_builder().add_output(tensor)

    def _finalize(self) -> Graph:
        if self._graph is None:
            from fuser.ir.verify import verify

            self._graph = verify(self._builder.graph())
        return self._graph

    @property
    def graph(self) -> Graph:
        """The fusion as defined (composites intact)."""
        return self._finalize()

    def pipeline(self) -> Pipeline:
        """Every graph the passes produce from the definition, with symbolic sizes."""
        return run_pipeline(self.graph, self.relaxed_precision)

    # -- inputs ---------------------------------------------------------------------
    def bind(self, inputs: Sequence[torch.Tensor]) -> Graph:
        """Check `inputs` against the definition and return the graph with concrete sizes."""
        graph = self.graph
        if not isinstance(inputs, (list, tuple)):
            raise InputError(
                f"execute: inputs must be a list of tensors, got {type(inputs).__name__}"
            )
        if len(inputs) != len(graph.inputs):
            raise InputError(
                f"execute: {self.name} defines {len(graph.inputs)} inputs, got {len(inputs)}"
            )
        binding: dict[sympy.Symbol, int] = {}
        devices = set()
        for i, (v, t) in enumerate(zip(graph.inputs, inputs)):
            if not isinstance(t, torch.Tensor):
                raise InputError(
                    f"execute: input {i} ({v.name}) is a {type(t).__name__}, not a tensor"
                )
            devices.add(t.device)
            if dtype_of(t.dtype) != v.dtype if t.dtype in _TORCH_OK else True:
                raise InputError(
                    f"execute: input {i} ({v.name}) has dtype {t.dtype}, expected {v.dtype.torch}"
                )
            if t.dim() != v.rank:
                raise InputError(
                    f"execute: input {i} ({v.name}) has rank {t.dim()} (shape {list(t.shape)}), "
                    f"expected rank {v.rank}"
                )
            for d, (want, got) in enumerate(zip(v.shape, t.shape)):
                if isinstance(want, int) and want != got:
                    raise InputError(
                        f"execute: input {i} ({v.name}) has size {got} at dim {d}, expected {want}"
                    )
                if not isinstance(want, int):
                    binding[want] = int(got)
        if len(devices) > 1:
            raise InputError(f"execute: inputs are on several devices: {sorted(map(str, devices))}")
        return concretize(graph, binding)

    # -- running --------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], upcast: bool = False) -> list[torch.Tensor]:
        """The fusion evaluated op by op with ATen (float64 throughout with upcast=True)."""
        return evaluate(self.bind(inputs), list(inputs), upcast=upcast)

    def _runtime(self) -> Any:
        if self._executor is None:
            from fuser.runtime.executor import FusionExecutor

            self._executor = FusionExecutor(self)
        return self._executor

    def execute(
        self, inputs: Sequence[torch.Tensor], backend: str | None = None
    ) -> list[torch.Tensor]:
        """Run the fusion's generated kernels on `inputs`; returns the outputs in order."""
        return self._runtime().execute(list(inputs), backend)

    def compile(
        self, inputs: Sequence[Any], device: str | None = None, backend: str | None = None
    ) -> list[Any]:
        """Choose schedules and render source for `inputs` (tensors or meta tensors) without
        running anything; `device` names a GPU preset ("h100", "h200", "a100")."""
        return self._runtime().compile(list(inputs), backend, device)

    @property
    def kernels(self) -> list[Any]:
        """The kernels compiled by the most recent execute() or compile()."""
        return self._runtime().last_kernels()

    def explain(self, print_it: bool = True) -> str:
        """Per kernel: the scheduler, the ops it took, the schedule and why, the estimate."""
        text = self._runtime().explain()
        if print_it:
            print(text)
        return text

    # -- printing -------------------------------------------------------------------
    def __str__(self) -> str:
        return str(self.graph)

    def __repr__(self) -> str:
        return graph_repro(self.graph)


_TORCH_OK = {
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
}

"""FusionDefinition: the public API for building, printing, checking and running a fusion."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from fuser.errors import DefinitionError
from fuser.explanation import Explanation
from fuser.frontend.builder import GraphBuilder, Tensor
from fuser.frontend.inputs import check_inputs, input_list, requires_grad, warn_grad
from fuser.frontend.ops import Ops
from fuser.ir.evaluate import evaluate
from fuser.ir.graph import Graph
from fuser.ir.printer import graph_repro
from fuser.ir.verify import verify
from fuser.passes import Pipeline, concretize, run_pipeline
from fuser.runtime.executor import FusionExecutor


class FusionDefinition:
    """Build a fusion inside `with FusionDefinition() as fd:`, then `fd.execute(inputs)`.

    `relaxed_precision=True` lets cast elimination drop real roundings such as
    `float(half(x))` round trips (faster, not bit-faithful to eager).
    """

    def __init__(self, name: str | None = None, relaxed_precision: bool = False):
        self.name = _identifier(name or "fusion")
        self.relaxed_precision = relaxed_precision
        self._builder = GraphBuilder()
        self.ops = Ops(self._builder)
        self._graph: Graph | None = None
        self._executor: Any = None
        self._warn_grad = True  # execute's warning for inputs that require grad, once
        # output position -> the strides execute allocates it with (a dense permutation:
        # torch.compile regions ask for ATen's layout, and the kernel that makes the
        # output writes it so, in place); outputs not named here are contiguous
        self.output_strides: dict[int, tuple[int, ...]] = {}

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
    def bind(self, inputs: Sequence[torch.Tensor], entry: str = "bind") -> Graph:
        """Check `inputs` against the definition and return the graph with concrete sizes.
        A problem is an InputError naming the input; `entry` names the call in it."""
        graph = self.graph
        return concretize(graph, check_inputs(graph, inputs, self.name, entry))

    # -- running --------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], upcast: bool = False) -> list[torch.Tensor]:
        """The fusion evaluated op by op with ATen (float64 throughout with upcast=True)."""
        return evaluate(self.bind(inputs, "reference"), list(inputs), upcast=upcast)

    def _runtime(self) -> Any:
        if self._executor is None:
            self._executor = FusionExecutor(self)
        return self._executor

    def execute(
        self, inputs: Sequence[torch.Tensor], backend: str | None = None
    ) -> list[torch.Tensor]:
        """Run the fusion's generated kernels on `inputs`; returns the outputs in order.

        No autograd: the outputs never require grad. Inputs that require grad (with grad
        mode on) get a warning, once per FusionDefinition, pointing to
        torch.compile(model, backend="fuser"), which fuses the backward too."""
        if type(inputs) is not list:
            inputs = input_list(inputs, self.graph, self.name, "execute")
        outs = self._runtime().execute(inputs, backend)
        # validated by now: every input is a tensor
        if self._warn_grad and requires_grad(inputs):
            self._warn_grad = False
            warn_grad(inputs, self.graph, self.name)
        return outs

    def compile(
        self, inputs: Sequence[Any], device: str | None = None, backend: str | None = None
    ) -> list[Any]:
        """Choose schedules and render source for `inputs` (tensors or meta tensors) without
        running anything; `device` names a GPU preset ("h100", "h200", "a100")."""
        inputs = input_list(inputs, self.graph, self.name, "compile")
        return self._runtime().compile(inputs, backend, device)

    @property
    def kernels(self) -> list[Any]:
        """The kernels compiled by the most recent execute() or compile()."""
        return self._runtime().last_kernels()

    def explain(self) -> Explanation:
        """Per kernel: the scheduler, the ops it took, the schedule and why, the estimate.
        Returned, not printed (a REPL shows it; a script prints it)."""
        return Explanation(self._runtime().explain())

    # -- printing -------------------------------------------------------------------
    def __str__(self) -> str:
        return str(self.graph)

    def __repr__(self) -> str:
        return graph_repro(self.graph)


def _identifier(name: str) -> str:
    """The fusion's name as its kernels' names start (a Python and C++ identifier): other
    characters become "_", and a leading digit gets "f_" ("3d col sum" -> "f_3d_col_sum";
    the name went into the generated source as it was: a SyntaxError)."""
    out = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return out if not out[:1].isdigit() else f"f_{out}"

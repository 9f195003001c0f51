"""The torch.compile backend: Dynamo captures, AOTAutograd splits forward and backward and
functionalizes them, and fuser lowers each resulting ATen graph.

    torch.compile(model, backend="fuser")              # registered on `import fuser` and
                                                       # through the entry point
    torch.compile(model, backend=FuserBackend(strict=True))   # options, own records
    torch.compile(model, backend="fuser", options={"cudagraphs": True})  # CUDA graphs
    torch.compile(model, backend="fuser", mode="reduce-overhead")        # the same
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

import torch
from torch import fx

from fuser.config import config, debug_print
from fuser.dynamo import tangents
from fuser.dynamo.ce_rewrite import chunk_linear_cross_entropy, one_pass_cross_entropy
from fuser.dynamo.gemm_call import template_warmups
from fuser.dynamo.graph_text import graph_text
from fuser.dynamo.lower import GraphRecord, Specializing, is_symbolic, lower_graph
from fuser.dynamo.program import cudagraphs
from fuser.dynamo.saved import partition_fn
from fuser.runtime import timing
from fuser.runtime.precompile import precompile, prefetch_triton_key, start_processes

aten = torch.ops.aten
_TORCH_DIR = str(Path(torch.__file__).parent)

# ATen ops decomposed before lowering: each becomes elementwise math and reductions fuser
# lowers (layer_norm, gelu, softmax and nll_loss, forward and backward, are lowered
# directly, and so are addcmul/addcdiv/lerp: torch's decompositions of them round each step
# to half types). log_softmax is decomposed so that the backward can recompute it from its
# input and two per-row values instead of keeping it (saved.py).
_DECOMPOSE = [
    "_log_softmax",
    "_log_softmax_backward_data",
    "detach",
    "silu",
    "silu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "hardtanh",
    "hardtanh_backward",
    "leaky_relu",
    "leaky_relu_backward",
    "elu",
    "elu_backward",
    "softplus",
    "softplus_backward",
    "mse_loss",
    "mse_loss_backward",
    "hardswish",
    "hardsigmoid",
    "mish",
    "native_dropout_backward",
]


def decompositions() -> dict:
    from torch._decomp import get_decompositions

    return get_decompositions([getattr(aten, n) for n in _DECOMPOSE if hasattr(aten, n)])


@dataclass
class Capture:
    """One graph Dynamo captured and the AOTAutograd graphs fuser compiled from it."""

    compile_id: str
    codes: tuple[CodeType, ...]
    input_shapes: list[list[int]]
    graphs: list[GraphRecord] = field(default_factory=list)
    dynamo_graph: str = ""
    # weak references to the tensors Dynamo passed in (a module's parameters and buffers
    # among them): which model a capture belongs to, however the backend was named
    inputs: tuple[weakref.ref, ...] = ()
    # where its first step's time went (tracing, lowering, compiling, first calls)
    timings: timing.Ledger = field(default_factory=timing.Ledger)
    cross_entropy: int = 0  # F.cross_entropy calls made one-pass (ce_rewrite.py)
    linear_ce: list[str] = field(default_factory=list)  # lm heads and cross-entropies, why
    # the forward side of absent gradients (tangents.py), when config.absent_grads is on
    absent: tangents.AbsentGrads | None = None

    def takes_any(self, ids: set[int]) -> bool:
        """Whether a live input of this capture is one of the tensors with these ids."""
        return any((t := r()) is not None and id(t) in ids for r in self.inputs)

    @property
    def recompile(self) -> bool:
        """A second (or later) compilation of the same frame: its guards failed."""
        parts = self.compile_id.split("/")
        return len(parts) >= 2 and parts[-1].isdigit() and int(parts[-1]) > 0

    @property
    def where(self) -> str:
        """The first traced code outside torch (a compiled module's frame is torch's
        wrapper, then the model's forward), else the first."""
        if not self.codes:
            return "?"
        ours = [c for c in self.codes if not c.co_filename.startswith(_TORCH_DIR)]
        c = (ours or self.codes)[0]
        return f"{c.co_name} ({c.co_filename.rsplit('/', 1)[-1]}:{c.co_firstlineno})"


_SHORT = {"forward": "fw", "backward": "bw", "inference": "inf"}

# every Capture made by any FuserBackend in this process, oldest first
CAPTURES: list[Capture] = []


def _compile_context() -> tuple[str, tuple[CodeType, ...]]:
    from torch._guards import CompileContext, TracingContext

    cid = CompileContext.current_compile_id()
    tc = TracingContext.try_get()
    codes = tuple(getattr(tc, "traced_code", ()) or ()) if tc is not None else ()
    return (str(cid) if cid is not None else "?"), codes


class FuserBackend:
    """A torch.compile backend object; `captures` lists what it compiled.

    strict: raise instead of falling back to ATen when fuser fails on a region.
    check: also run every region's ATen ops and raise if fuser's result differs (slow;
        for debugging a model).
    partition: "min_cut" (AOTAutograd recomputes cheap forward ops in the backward
        instead of saving them, as for Inductor) or "default" (save what eager saves).
    cudagraphs: replay each compiled graph from CUDA graphs (torch's cudagraph trees;
        fuser/dynamo/program/cudagraphs.py). torch.compile's `options` set any of these
        by name, and mode="reduce-overhead" (or "max-autotune", as for Inductor) sets
        cudagraphs.
    """

    def __init__(
        self,
        strict: bool = False,
        check: bool = False,
        partition: str = "min_cut",
        cudagraphs: bool = False,
    ):
        if partition not in ("min_cut", "default"):
            raise ValueError(f"partition={partition!r}; expected 'min_cut' or 'default'")
        self.strict = strict
        self.check = check
        self.partition = partition
        self.cudagraphs = cudagraphs
        self.captures: list[Capture] = []

    def __call__(
        self,
        gm: fx.GraphModule,
        example_inputs: list[Any],
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Any:
        if mode is not None or options:
            return self._with(mode, options)(gm, example_inputs)
        return self._compile(gm, example_inputs)

    def _with(self, mode: str | None, options: dict[str, Any] | None) -> FuserBackend:
        """This backend with torch.compile's `mode` and `options` applied (its captures
        are this one's: explain finds them either way)."""
        settings = {k: getattr(self, k) for k in OPTIONS}
        if mode not in (None, *MODES):
            raise ValueError(f"fuser: mode={mode!r}; expected one of {MODES}")
        if mode in ("reduce-overhead", "max-autotune"):
            settings["cudagraphs"] = True
        for key, value in (options or {}).items():
            name = "cudagraphs" if key == "triton.cudagraphs" else key  # Inductor's name
            if name not in OPTIONS:
                raise ValueError(
                    f"fuser: unknown option {key!r}; the options are {', '.join(OPTIONS)}"
                )
            if name != "partition" and not isinstance(value, bool):
                # "no" or "false" would otherwise turn the setting on
                raise ValueError(f"fuser: option {key!r} takes True or False, not {value!r}")
            settings[name] = value
        other = FuserBackend(**settings)
        other.captures = self.captures
        return other

    def _compile(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        if _device_type(example_inputs) == "cuda":
            start_processes()  # the compile workers import while AOTAutograd traces
            prefetch_triton_key()  # and Triton's installation is hashed
        cid, codes = _compile_context()
        shapes = [list(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)]
        refs = tuple(weakref.ref(x) for x in example_inputs if isinstance(x, torch.Tensor))
        capture = Capture(cid, codes, shapes, dynamo_graph=gm.code, inputs=refs)
        self.captures.append(capture)
        CAPTURES.append(capture)
        if capture.recompile:
            debug_print(1, f"[fuser.dynamo] recompiling {capture.where} (compile {cid})")
        graphs = cudagraphs.GraphState()

        def graphed(fn: Any, g: fx.GraphModule, inputs: list, kind: str) -> tuple[Any, str]:
            if not self.cudagraphs:
                return fn, ""
            return cudagraphs.wrap(fn, g, inputs, kind, is_symbolic(g), graphs)

        # absent gradients (tangents.py): the forward's autograd node is told not to fill
        # them with zeros, the backward is lowered for the tangents that are None
        absent = capture.absent = tangents.AbsentGrads() if config.absent_grads else None

        def lower_one(g: fx.GraphModule, inputs: list[Any], kind: str, tag: str, note: str) -> Any:
            name = f"g{cid.replace('/', '_')}_{_SHORT[kind]}{tag}"
            if is_symbolic(g):
                spec = Specializing(g, kind, name, self.strict, self.check)
                fn, cg_note = graphed(spec, g, inputs, kind)
                spec.on_record = lambda r: (
                    setattr(r, "cudagraphs", cg_note),
                    setattr(r, "tangents", note),
                    capture.graphs.append(r),
                    _debug(capture, r),
                )
                debug_print(
                    1,
                    f"[fuser.dynamo] {kind} graph {name} has symbolic sizes: "
                    "lowered for each new input signature at run time",
                )
                return fn
            with timing.collecting(capture.timings):
                with timing.phase("lowering"):
                    fn, record = lower_graph(g, kind, name, self.strict, self.check)
                templates = template_warmups(record.module)  # GEMM template calls
                precompile(record.kernels, _device_type(inputs), templates=templates)
            if record.program is not None:
                record.program.ledger = capture.timings
            record.tangents = note
            fn, record.cudagraphs = graphed(fn, g, inputs, kind)
            capture.graphs.append(record)
            _debug(capture, record)
            return fn

        def compiler(kind: str) -> Any:
            def compile_one(g: fx.GraphModule, inputs: list[Any]) -> Any:
                if kind == "backward" and absent is not None:
                    # lowered at its first call, for the tangents that call leaves None
                    return tangents.TangentVariants(
                        g,
                        inputs,
                        lambda vg, vin, tag, note: lower_one(vg, vin, kind, tag, note),
                        self.strict,
                    )
                fn = lower_one(g, inputs, kind, "", "")
                returns = tangents.forward_returns() if kind == "forward" else None
                if absent is not None and returns and not is_symbolic(g):
                    fn = absent.watch(fn, returns)
                return fn

            return compile_one

        kwargs: dict[str, Any] = {
            "fw_compiler": compiler("forward"),
            "bw_compiler": compiler("backward"),
            "inference_compiler": compiler("inference"),
            "decompositions": decompositions(),
            "keep_inference_input_mutations": True,
        }
        kwargs["partition_fn"] = partition_fn(self.partition)
        ledger = capture.timings
        before = ledger.seconds.get("lowering", 0.0) + ledger.seconds.get("compiling", 0.0)
        t0 = time.perf_counter()
        if config.one_pass_cross_entropy:
            capture.linear_ce = chunk_linear_cross_entropy(gm)
            capture.cross_entropy = one_pass_cross_entropy(gm, capture.linear_ce)
        with _tangents_as_outputs(gm):
            compiled = aot_autograd(**kwargs)(gm, example_inputs)
        if absent is not None and absent.returns:
            compiled = absent.wrap(compiled)
        spent = time.perf_counter() - t0
        ours = ledger.seconds.get("lowering", 0.0) + ledger.seconds.get("compiling", 0.0)
        ledger.add("tracing", max(0.0, spent - (ours - before)))
        debug_print(2, f"[fuser.dynamo] {capture.where}: traced in {spent:.2f}s")
        return compiled


def _tangents_as_outputs(gm: fx.GraphModule) -> Any:
    """AOTAutograd traces each output's gradient (tangent) with the output's own strides,
    not made contiguous. Where it guesses contiguous (torch 2.11's default; 2.13's is
    strides), a gradient that arrives in the output's layout (q and k of a rotary
    embedding, transposed as `transformers` makes them) is copied to contiguous before
    every backward: two ATen copies of 0.23 ms in issue 21's rotary step on an H200. A
    gradient in another layout is copied to the output's strides instead, as before.

    Not for a graph with an output whose elements share memory (an `expand`): torch
    2.11 would copy its gradient into those strides, which fails ("more than one element
    of the written-to tensor refers to a single memory location"; 2.13 guesses a memory
    format there instead). Its graph keeps torch's own guess."""
    fc = torch._functorch.config
    if not hasattr(fc, "guess_tangent_strides_as_outputs") or _overlapping_output(gm):
        return contextlib.nullcontext()
    return fc.patch(guess_tangent_strides_as_outputs=True)


def _overlapping_output(gm: fx.GraphModule) -> bool:
    """Whether a tensor output of Dynamo's graph may have elements that share memory (or
    has no recorded value to tell)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    for a in out.all_input_nodes:
        t = a.meta.get("example_value", a.meta.get("val"))
        if t is None or (isinstance(t, torch.Tensor) and torch._debug_has_internal_overlap(t) == 1):
            return True
    return False


def _device_type(inputs: list[Any]) -> str:
    """Where a graph's kernels will run: the device of its first tensor input that is
    not a CPU scalar, else of its first tensor."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    big = [t for t in tensors if t.dim() > 0 or t.device.type != "cpu"]
    return (big or tensors)[0].device.type if tensors else "cpu"


def _debug(capture: Capture, record: GraphRecord) -> None:
    if config.debug < 1:
        return
    kernels = len(record.kernels)
    debug_print(
        1,
        f"[fuser.dynamo] {record.kind} graph of {capture.where}: {record.nodes} ATen ops -> "
        f"{len(record.fused)} fused regions ({kernels} kernels), {len(record.fallbacks)} "
        f"ATen calls, in {record.compile_seconds:.2f}s",
    )
    debug_print(2, graph_text(record, source=config.debug >= 4))


# FuserBackend's settings that torch.compile's `options` may name, and the modes it takes
OPTIONS = ("strict", "check", "partition", "cudagraphs")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_DEFAULT = FuserBackend()


def fuser_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The backend registered as "fuser" (torch.compile(model, backend="fuser")); takes
    torch.compile's `mode` and `options` (see FuserBackend)."""
    return _DEFAULT(gm, example_inputs, **kwargs)


def register() -> None:
    """Register "fuser" with Dynamo unless its entry point already provides it."""
    from torch._dynamo.backends import registry

    known = getattr(registry, "_BACKENDS", {})
    if "fuser" in known or "fuser" in getattr(registry, "_COMPILER_FNS", {}):
        return  # the torch_dynamo_backends entry point registers it when first looked up
    registry.register_backend(fuser_backend, name="fuser")

"""CUDA graphs for the call programs, through torch's own cudagraph trees.

    torch.compile(model, backend="fuser", options={"cudagraphs": True})
    torch.compile(model, backend="fuser", mode="reduce-overhead")   # the same

What torch offers a custom backend (read in torch 2.11-2.13):
- `torch._inductor.cudagraph_trees.cudagraphify_impl(fn, inputs, static_input_idxs, *,
  device_index, is_backward, is_inference, stack_traces, placeholders,
  mutated_input_idxs)` takes any boxed callable, not only Inductor's output: it is what
  torch's own "cudagraphs" backend (torch/_dynamo/backends/cudagraphs.py, aot_eager plus
  graphs) calls from its AOTAutograd forward and backward compilers. So fuser drives the
  trees exactly as that backend does, and gets what Inductor's mode="reduce-overhead"
  gets: one memory pool per device shared by all graphs (the forward's saved activations
  are the backward's inputs without copies), a warm-up run then a recording then replays,
  a new tree node (re-recording) when a static input moves, graph-owned copies of every
  other input at each replay (a new input address is correct), the generation rules of
  training (a forward after the backwards starts a new step) and
  torch.compiler.cudagraph_mark_step_begin() for anything else: a graph's outputs are
  overwritten by the next replay of that graph, as under Inductor.
- Static inputs: the forward's are TracingContext.fw_metadata.static_input_indices (the
  parameters and buffers Dynamo lifted, and mark_static_address), as Inductor's
  get_static_input_idxs; torch's cudagraphs backend counts num_fw_fixed_arguments, which
  is 0 once Dynamo inlines modules, so it would copy every parameter at each replay. The
  backward's are its inputs before the tangents (count_tangents): parameters and saved
  activations, which the forward's graph made at fixed addresses.
- What cannot be captured is decided before anything runs, with torch's own tests where
  they exist (get_first_incompatible_cudagraph_node: ops that synchronize with the host
  or allocate by data; find_input_mutations) and fuser's: tensors off CUDA, several
  devices, symbolic sizes (fuser specializes those at run time). Such a graph runs as it
  would without graphs, and explain says why; the backward of a forward that is not
  captured is not captured either (the trees need the pair).

What fuser adds:
- The first call of each graph runs outside the trees (it is the call the program is
  built from): whatever fuser makes once and keeps (each kernel's index-check record,
  Triton's and NVRTC's modules, padded parameters) is made in the ordinary allocator, not
  in the trees' pool, whose memory the trees hand out again between recordings. The trees
  then warm up at the second call and record at the third.
- Index checks (fuser/runtime/checks.py): a replayed kernel writes its record and the
  pinned host flag as a launched one does (both stay put after the first call), but a
  replay runs no Python, so the generated program's poll does not run. The wrapper polls
  before every call instead: a bad index is raised by the next compiled call after the
  graph that found it ran, as without graphs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.config import debug_print
from fuser.runtime.checks import poll

CPU_NOTE = "cudagraphs need CUDA tensors; running without"
CAPTURED = (
    "captured in CUDA graphs (torch's cudagraph trees; the first call runs outside them, "
    "the second warms up, the third records, later ones replay)"
)


def _devices(g: fx.GraphModule) -> dict[torch.device, str]:
    """Each device a tensor of the graph is on, with the first node holding one."""
    out: dict[torch.device, str] = {}
    for n in g.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        for v in vals:
            if isinstance(v, torch.Tensor) and v.device.type != "meta":
                out.setdefault(v.device, n.name)
    return out


# ops that read device data on the host (a synchronization a capture forbids) or size
# their output by it, matched by name whatever the overload: torch's list names some
# without one ("aten._local_scalar_dense"), which a traced graph's overloads never equal
_HOST_SYNCS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item", "unique"}


def unsafe_op(g: fx.GraphModule) -> str | None:
    """The first node of `g` a CUDA graph cannot hold, or None: torch's own test, and
    the host synchronizations above."""
    node = next(
        (
            n
            for n in g.graph.nodes
            if n.op == "call_function"
            and str(n.target).removeprefix("aten.").split(".")[0] in _HOST_SYNCS
        ),
        None,
    )
    if node is None:
        try:
            from torch._inductor.utils import get_first_incompatible_cudagraph_node
        except ImportError:  # an older torch: the list above is all there is
            return None
        node = get_first_incompatible_cudagraph_node(g)
    if node is None:
        return None
    return (
        f"op {node.target} ({node.name}) cannot be captured: it synchronizes with the host "
        "or sizes its output by the data"
    )


def skip_reason(g: fx.GraphModule, symbolic: bool, fixed: int) -> str | None:
    """Why graph `g` (an AOTAutograd graph; `fixed`: its leading static inputs) runs
    without CUDA graphs, or None when it can be captured."""
    devices = _devices(g)
    if any(d.type != "cuda" for d in devices) or not devices:
        off = sorted({str(d) for d in devices if d.type != "cuda"}) or ["no device"]
        where = ", ".join(off)
        if any(d.type == "cuda" for d in devices):
            node = next(n for d, n in devices.items() if d.type != "cuda")
            where = f"{where} beside CUDA tensors ({node}: a CPU scalar tensor?)"
        return f"{CPU_NOTE} (tensors on {where})"
    if len(devices) > 1:
        return f"several CUDA devices ({', '.join(sorted(map(str, devices)))}); running without"
    if symbolic:
        return (
            "symbolic sizes (dynamic shapes): fuser specializes the graph per size at run "
            "time; running without"
        )
    if why := unsafe_op(g):
        return f"{why}; running without"
    from torch._dynamo import config as dynamo_config
    from torch._dynamo.backends.cudagraphs import (
        check_for_mutation_ignore_cuda_graph_managed_tensor,
    )

    if not dynamo_config.cudagraph_backend_support_input_mutation:
        if why := check_for_mutation_ignore_cuda_graph_managed_tensor(g, fixed):
            return f"{why}; running without"
    return None


def static_inputs(g: fx.GraphModule, kind: str, inputs: list[Any]) -> list[int]:
    """The inputs whose address stays put from call to call (see the module's notes)."""
    if kind == "backward":
        from torch._inductor.utils import count_tangents

        return list(range(count_tangents(g)))
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is not None and getattr(meta, "static_input_indices", None) is not None:
        return list(meta.static_input_indices)
    return []


class Graphed:
    """A compiled graph's boxed callable, replayed from torch's cudagraph trees from its
    third call on (see the module's notes); `note` says so, or why not."""

    def __init__(self, fn: Any, tree_fn: Any, note: str):
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__
        self.fn, self.tree_fn, self.note = fn, tree_fn, note
        self.calls = 0

    def __call__(self, args: list) -> Any:
        poll()  # replays run no Python: a bad index found by the last one is raised here
        self.calls += 1
        if self.calls == 1:
            return self.fn(args)
        return self.tree_fn(args)


class Unpaired:
    """The backward of a captured forward that cannot be captured itself: it runs as
    compiled, and tells the trees that the forward's pending backward ran (as torch's
    cudagraphs backend does)."""

    def __init__(self, fn: Any, device_index: int, note: str):
        self._boxed_call = True
        self.fn, self.device_index, self.note = fn, device_index, note

    def __call__(self, args: list) -> Any:
        from torch._inductor.cudagraph_trees import get_manager

        manager = get_manager(self.device_index, create_if_none_exists=False)
        if manager is not None:
            manager.set_to_running_backward()
        return self.fn(args)


class GraphState:
    """The CUDA-graph decisions of one Dynamo capture: a backward is captured only when
    its forward was (the trees pair them)."""

    def __init__(self) -> None:
        self.forward_captured: bool | None = None
        self.device_index: int | None = None


def wrap(
    fn: Any,
    g: fx.GraphModule,
    inputs: list[Any],
    kind: str,
    symbolic: bool,
    state: GraphState,
) -> tuple[Any, str]:
    """`fn` (the boxed callable fuser compiled `g` to) captured in CUDA graphs when it can
    be, and the note explain shows either way."""
    backward = kind == "backward"
    fixed = static_inputs(g, kind, inputs) if not symbolic and _on_cuda(g) else []
    reason = skip_reason(g, symbolic, len(fixed) if backward else 0)
    if reason is None and backward and state.forward_captured is False:
        return fn, "its forward graph is not captured; running without"
    if reason is not None:
        debug_print(1, f"[fuser.dynamo] {kind} graph not in CUDA graphs: {reason}")
        if not backward:
            state.forward_captured = False
        elif state.forward_captured and state.device_index is not None:
            return Unpaired(fn, state.device_index, reason), reason
        return fn, reason
    from torch._dynamo.backends.cudagraphs import find_input_mutations, get_stack_traces
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._inductor.cudagraph_utils import get_placeholder_info

    device = next(iter(_devices(g)))
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not backward:
        state.forward_captured, state.device_index = True, index
    tree_fn = cudagraphify_impl(
        fn,
        inputs,
        fixed,
        device_index=index,
        is_backward=backward,
        is_inference=kind == "inference",
        stack_traces=get_stack_traces(g),
        placeholders=get_placeholder_info(g.graph),
        mutated_input_idxs=find_input_mutations(g.graph),
    )
    note = f"{CAPTURED}; {len(fixed)} static inputs"
    return Graphed(fn, tree_fn, note), note


def _on_cuda(g: fx.GraphModule) -> bool:
    devices = _devices(g)
    return bool(devices) and all(d.type == "cuda" for d in devices)

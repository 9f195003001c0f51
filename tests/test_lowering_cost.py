"""What lowering a graph costs in generated Python: each GraphModule recompile generates
and compiles the source of a whole training graph (~0.1 s at GPT-2 124M), so lowering
makes the final module's source once per graph, edits drafts (support.DraftModule) in
between, and builds a region's ATen fallback module only when it is used. Planning
happens once per region: at lowering, for meta tensors, whose plan the first call takes."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import fuser.dynamo.backend as backend_module
from fuser import FusionDefinition
from fuser.dynamo import FuserBackend, region, tangents
from fuser.examples.gpt2 import GPT, get_config
from fuser.runtime import executor


@pytest.fixture
def recompiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every GraphModule recompile during fuser's lowering of a graph and its fold of
    absent tangents (a backward variant, tangents.py), as 'class name:node count'."""
    seen: list[str] = []
    lowering = [False]
    original = fx.GraphModule.recompile

    def counting(self: fx.GraphModule):  # noqa: ANN202
        if lowering[0]:
            seen.append(f"{type(self).__name__}:{len(self.graph.nodes)}")
        return original(self)

    def watched(fn):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            lowering[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                lowering[0] = False

        return call

    monkeypatch.setattr(fx.GraphModule, "recompile", counting)
    monkeypatch.setattr(backend_module, "lower_graph", watched(backend_module.lower_graph))
    monkeypatch.setattr(tangents, "fold_absent", watched(tangents.fold_absent))
    return seen


def _step(check: bool) -> FuserBackend:
    """One training step of the tiny GPT-2 (on the GPU where there is one: CPU tensors
    there would leave every region to ATen)."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT(get_config("tiny")).to(device)
    backend = FuserBackend(strict=True, check=check)
    compiled = torch.compile(model, backend=backend)
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1)).to(device)
    _, loss = compiled(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return backend


def test_each_graph_is_made_into_python_once(recompiles: list[str]) -> None:
    backend = _step(check=False)
    graphs = backend.captures[0].graphs
    assert len(graphs) == 2 and all(g.regions and g.module is not None for g in graphs)
    assert graphs[1].tangents  # the logits' gradient is absent: the backward is a fold
    # one source per graph (its final module); no region fallback module (nothing fell
    # back), no intermediate copy's source
    assert len(recompiles) == len(graphs), recompiles


def test_a_region_builds_its_fallback_when_checked() -> None:
    backend = _step(check=True)  # check mode runs each region's ATen ops beside it
    regions = [r for g in backend.captures[0].graphs for r in g.regions]
    assert regions and all(not r.mismatches for r in regions)


def test_each_region_is_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowering plans every region for meta tensors; its first call, on real tensors of
    the same shapes, strides, dtypes and alignment, takes that plan instead of planning
    again (half of a warm first step's planning, before), and gives eager's numbers."""
    planned: list[str] = []
    original = executor.plan

    def counting(graph, inputs, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        planned.append(f"{name}:{inputs[0].device.type}")
        return original(graph, inputs, name, *args, **kwargs)

    monkeypatch.setattr(executor, "plan", counting)
    monkeypatch.setattr(region, "_DEFINITIONS", {})  # no plans from another test's regions
    backend = _step(check=True)  # check mode compares every region with its ATen ops
    regions = [r for g in backend.captures[0].graphs for r in g.regions if r.fused]
    assert regions and all(r.calls or r.total_calls for r in regions)
    assert all(not r.mismatches for r in regions)
    assert planned and all(p.endswith(":meta") for p in planned), planned
    assert len(planned) == len(set(planned)), planned


def test_a_misaligned_input_is_planned_for_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan made ahead for aligned meta tensors is taken for aligned real tensors of
    the same layout, and not for a misaligned view: that call plans for its own
    alignment (narrower vectors). Both give eager's result."""
    with FusionDefinition("add_rows") as fd:
        a = fd.define_tensor([-1, -1], torch.float32)
        b = fd.define_tensor([-1, -1], torch.float32)
        fd.add_output(fd.ops.add(fd.ops.exp(a), b))
    meta = [torch.empty(3, 64, device="meta") for _ in range(2)]
    fd.compile(meta)
    planned: list[int] = []
    original = executor.plan

    def counting(graph, inputs, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        planned.append(inputs[0].data_ptr() % 16)
        return original(graph, inputs, name, *args, **kwargs)

    monkeypatch.setattr(executor, "plan", counting)
    g = torch.Generator().manual_seed(3)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    flat, y = (torch.randn(n, generator=g).to(dev) for n in (3 * 64 + 1, 3 * 64))
    y = y.view(3, 64)
    aligned = flat[:-1].clone().view(3, 64)
    (out,) = fd.execute([aligned, y])
    torch.testing.assert_close(out, aligned.exp() + y)
    assert planned == []  # the meta plan
    shifted = flat[1:].view(3, 64)  # 4 bytes past a 16-byte boundary
    (out,) = fd.execute([shifted, y])
    torch.testing.assert_close(out, shifted.exp() + y)
    assert planned == [4]

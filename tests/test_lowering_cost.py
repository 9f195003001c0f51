"""What lowering a graph costs in generated Python: each GraphModule recompile generates
and compiles the source of a whole training graph (~0.1 s at GPT-2 124M), so lowering
makes the final module's source once per graph, edits drafts (support.DraftModule) in
between, and builds a region's ATen fallback module only when it is used."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import fuser.dynamo.backend as backend_module
from fuser.dynamo import FuserBackend
from fuser.examples.gpt2 import GPT, get_config


@pytest.fixture
def recompiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every GraphModule recompile during fuser's lowering of a graph, as
    'class name:node count'."""
    seen: list[str] = []
    lowering = [False]
    original, lower = fx.GraphModule.recompile, backend_module.lower_graph

    def counting(self: fx.GraphModule):  # noqa: ANN202
        if lowering[0]:
            seen.append(f"{type(self).__name__}:{len(self.graph.nodes)}")
        return original(self)

    def lower_graph(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        lowering[0] = True
        try:
            return lower(*args, **kwargs)
        finally:
            lowering[0] = False

    monkeypatch.setattr(fx.GraphModule, "recompile", counting)
    monkeypatch.setattr(backend_module, "lower_graph", lower_graph)
    return seen


def _step(check: bool) -> FuserBackend:
    torch.manual_seed(0)
    model = GPT(get_config("tiny"))
    backend = FuserBackend(strict=True, check=check)
    compiled = torch.compile(model, backend=backend)
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    _, loss = compiled(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return backend


def test_each_graph_is_made_into_python_once(recompiles: list[str]) -> None:
    backend = _step(check=False)
    graphs = backend.captures[0].graphs
    assert len(graphs) == 2 and all(g.regions and g.module is not None for g in graphs)
    # one source per graph (its final module); no region fallback module (nothing fell
    # back), no intermediate copy's source
    assert len(recompiles) == len(graphs), recompiles


def test_a_region_builds_its_fallback_when_checked() -> None:
    backend = _step(check=True)  # check mode runs each region's ATen ops beside it
    regions = [r for g in backend.captures[0].graphs for r in g.regions]
    assert regions and all(not r.mismatches for r in regions)

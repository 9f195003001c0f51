"""CUDA graphs for the call programs (fuser/dynamo/program/cudagraphs.py), on CPU: the
option's plumbing (options=, mode=, FuserBackend(cudagraphs=True), bad names), the
visible fallback (explain says why; results are those without graphs), the reasons a
graph is not captured (decided from fake CUDA tensors, no GPU needed) and the wrapper's
order of calls. The GPU half is tests/test_cudagraphs_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

import fuser
from fuser.dynamo import FuserBackend
from fuser.dynamo.program import cudagraphs
from fuser.examples.gpt2 import GPT, GPTConfig

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=24, vocab_size=37, block_size=8)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train(model: torch.nn.Module, step, steps: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, TINY.vocab_size, (3, 6), generator=g)
        _, loss = step(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())
    return losses


def _models() -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    a = GPT(TINY)
    b = GPT(TINY)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize(
    "how",
    [{"options": {"cudagraphs": True}}, {"mode": "reduce-overhead"}],
    ids=["options", "mode"],
)
def test_the_option_on_cpu_runs_without_graphs_and_explain_says_why(how):
    plain, graphed = _models()
    want = _train(plain, torch.compile(plain, backend=FuserBackend(strict=True)))
    torch._dynamo.reset()
    got = _train(graphed, torch.compile(graphed, backend="fuser", **how))
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)  # the same program runs: the same bits
    text = str(fuser.explain(graphed))
    notes = [ln for ln in text.splitlines() if "CUDA graphs:" in ln]
    assert len(notes) == 2, text  # forward and backward
    assert all(cudagraphs.CPU_NOTE in ln for ln in notes), notes


def test_without_the_option_explain_says_nothing_of_graphs():
    model, _ = _models()
    _train(model, torch.compile(model, backend="fuser"), steps=1)
    assert "CUDA graphs" not in str(fuser.explain(model))


def test_options_reach_the_backend_and_bad_ones_are_named():
    backend = FuserBackend()
    assert backend._with(None, {"cudagraphs": True}).cudagraphs
    assert backend._with("reduce-overhead", None).cudagraphs
    assert backend._with("max-autotune", None).cudagraphs
    assert not backend._with("max-autotune-no-cudagraphs", None).cudagraphs
    assert backend._with(None, {"triton.cudagraphs": True}).cudagraphs  # Inductor's name
    assert backend._with(None, {"strict": True}).strict
    other = backend._with(None, {"partition": "default"})
    assert other.partition == "default" and other.captures is backend.captures
    with pytest.raises(ValueError, match="unknown option 'cudagrafs'.*cudagraphs"):
        backend._with(None, {"cudagrafs": True})
    with pytest.raises(ValueError, match="mode='fast'"):
        backend._with("fast", None)
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(torch.nn.Linear(3, 3), backend="fuser", options={"nope": 1})(
            torch.randn(2, 3)
        )


def _graph(device: str, item: bool = False, symbolic_ok: bool = True) -> fx.GraphModule:
    """x -> relu(x) * 2 (and x.sum().item() when `item`), with fake values on `device`."""
    g = fx.Graph()
    x = g.placeholder("x")
    aten = torch.ops.aten
    r = g.call_function(aten.relu.default, (x,))
    out = g.call_function(aten.mul.Tensor, (r, 2))
    nodes = [x, r, out]
    if item:
        s = g.call_function(aten.sum.default, (x,))
        v = g.call_function(aten._local_scalar_dense.default, (s,))
        nodes += [s]
        v.meta["val"] = 1.0
    g.output((out,))
    with FakeTensorMode():
        for n in nodes:
            n.meta["val"] = torch.empty(4, 5, device=device)
    return fx.GraphModule(torch.nn.Module(), g)


def test_reasons_a_graph_is_not_captured():
    assert cudagraphs.skip_reason(_graph("cuda"), False, 0) is None
    cpu = cudagraphs.skip_reason(_graph("cpu"), False, 0)
    assert cpu is not None and cpu.startswith(cudagraphs.CPU_NOTE) and "cpu" in cpu
    sync = cudagraphs.skip_reason(_graph("cuda", item=True), False, 0)
    assert sync is not None and "_local_scalar_dense" in sync and "synchronizes" in sync
    dyn = cudagraphs.skip_reason(_graph("cuda"), True, 0)
    assert dyn is not None and "dynamic shapes" in dyn
    # a CPU scalar tensor beside CUDA activations is named
    g = _graph("cuda")
    with FakeTensorMode():
        next(iter(g.graph.nodes)).meta["val"] = torch.empty((), device="cpu")
    mixed = cudagraphs.skip_reason(g, False, 0)
    assert mixed is not None and "beside CUDA tensors (x" in mixed


def test_a_backward_is_not_captured_when_its_forward_is_not():
    state = cudagraphs.GraphState()
    fwd, note = cudagraphs.wrap(lambda a: a, _graph("cuda", item=True), [], "forward", False, state)
    assert "synchronizes" in note and state.forward_captured is False
    bwd, note = cudagraphs.wrap(lambda a: a, _graph("cuda"), [], "backward", False, state)
    assert note == "its forward graph is not captured; running without"
    assert not isinstance(bwd, cudagraphs.Graphed)


def test_graphed_runs_the_first_call_outside_the_trees_and_polls_every_call(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(cudagraphs, "poll", lambda: calls.append("poll"))
    g = cudagraphs.Graphed(lambda a: calls.append("eager"), lambda a: calls.append("tree"), "")
    assert g._boxed_call
    for _ in range(3):
        g([])
    assert calls == ["poll", "eager", "poll", "tree", "poll", "tree"]

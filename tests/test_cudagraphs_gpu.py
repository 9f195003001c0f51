"""CUDA graphs on a GPU (fuser/dynamo/program/cudagraphs.py): results equal to those without
graphs over several steps whose inputs move, tiny GPT-2 training parity over 5 steps, no
recompiles and no re-records per step, and index errors still reported under replay.
Skipped without a CUDA GPU (tests/test_cudagraphs.py covers the plumbing on CPU). Run:
    PYTHONPATH=. python -m pytest -q tests/test_cudagraphs_gpu.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.dynamo import FuserBackend
from fuser.dynamo.program import cudagraphs
from fuser.errors import OutOfBoundsError
from fuser.examples.gpt2 import GPT, GPTConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=40, vocab_size=67, block_size=16)


@pytest.fixture(autouse=True)
def _fresh():
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees

    torch._dynamo.reset()
    reset_cudagraph_trees()
    yield
    torch._dynamo.reset()
    reset_cudagraph_trees()


def _tree_nodes() -> int:
    """Graphs recorded so far in the cudagraph trees of the current device."""
    from torch._inductor.cudagraph_trees import get_manager

    manager = get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    if manager is None:
        return 0
    count, todo = 0, list(manager.get_roots())
    while todo:
        node = todo.pop()
        count += 1
        todo += [c for kids in node.children.values() for c in kids]
    return count


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.fc(x)) + x).softmax(-1)


def _step(model, x):
    out = model(x)
    (out * torch.arange(out.shape[-1], device=out.device)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.detach().clone(), grads


def test_equal_to_without_graphs_when_inputs_move():
    torch.manual_seed(0)
    plain = Block(97).cuda()
    graphed = Block(97).cuda()
    graphed.load_state_dict(plain.state_dict())
    want_fn = torch.compile(plain, backend=FuserBackend(strict=True))
    backend = FuserBackend(strict=True, cudagraphs=True)
    got_fn = torch.compile(graphed, backend=backend)
    keep = []  # every input stays alive: each step's is at a new address
    for step in range(6):
        x = torch.randn(5, 33, 97, device="cuda")
        keep.append(x)
        want, want_grads = _step(want_fn, x)
        got, got_grads = _step(got_fn, x)
        torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"step {step}")
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"step {step}")
    notes = [g.cudagraphs for c in backend.captures for g in c.graphs]
    assert notes and all(n.startswith(cudagraphs.CAPTURED) for n in notes), notes


def _train(model, step_fn, steps: int, mark: bool) -> tuple[list[float], list[int]]:
    g = torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    losses, nodes = [], []
    for _ in range(steps):
        idx = torch.randint(0, TINY.vocab_size, (3, 8), generator=g).cuda()
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        _, loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        nodes.append(_tree_nodes())
    return losses, nodes


def test_tiny_gpt2_training_parity_and_no_rerecording():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    plain, graphed = GPT(TINY).cuda(), GPT(TINY).cuda()
    graphed.load_state_dict(plain.state_dict())
    want, _ = _train(plain, torch.compile(plain, backend=FuserBackend(strict=True)), 5, False)
    torch._dynamo.reset()
    skips = counters["inductor"]["cudagraph_skips"]
    backend = FuserBackend(strict=True, cudagraphs=True)
    got, nodes = _train(graphed, torch.compile(graphed, backend=backend), 5, True)
    for step, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"step {step}: {a} vs {b}"
    # call 1 outside the trees, 2 warms up, 3 records the forward and the backward
    assert nodes[2] == 2 and nodes[3:] == [2] * (len(nodes) - 3), nodes
    assert len(backend.captures) == 1 and not backend.captures[0].recompile
    assert counters["inductor"]["cudagraph_skips"] == skips
    text = str(fuser.explain(graphed))
    assert text.count("CUDA graphs: " + cudagraphs.CAPTURED) == 2, text
    programs = [g.program for g in backend.captures[0].graphs]
    assert all(p is not None and p.fn is not None for p in programs)


def test_index_errors_are_reported_under_replay():
    def f(x, t):
        return F.cross_entropy(x, t)

    compiled = torch.compile(f, backend=FuserBackend(cudagraphs=True), dynamic=False)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g).cuda()
    target = torch.randint(0, 1000, (64,), generator=g).cuda()
    for _ in range(4):  # eager, warm-up, record, replay
        torch.compiler.cudagraph_mark_step_begin()
        want = F.cross_entropy(logits, target)
        torch.testing.assert_close(compiled(logits, target), want)
    bad = target.clone()
    bad[9] = 1000  # copied into the graph's own input at the replay
    torch.compiler.cudagraph_mark_step_begin()
    compiled(logits, bad)
    with pytest.raises(OutOfBoundsError, match="row 9"):
        fuser.check_errors()
    fuser.check_errors()  # raised once
    torch.compiler.cudagraph_mark_step_begin()
    torch.testing.assert_close(compiled(logits, target), F.cross_entropy(logits, target))

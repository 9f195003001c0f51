"""Absent gradients (fuser/dynamo/tangents.py): an output whose gradient nobody asks for
is not filled with zeros by autograd nor read by the backward; the backward lowered for
that case takes it as zero. Against eager, on CPU (kernels in Triton's interpreter):

- GPT-2 returning (logits, loss), `loss.backward()` only: the backward variant without the
  logits' tangent runs (no zeros filled or read), gradients are eager's;
- the same compiled model given a gradient for the logits too
  (`torch.autograd.backward([loss, logits], [None, g])`, `loss + logits.sum()`): the
  graph as traced runs, gradients are eager's; both variants in one model, alternating;
- other models: a parameter reached only through the unused output keeps no gradient, as
  in eager; an output whose tangent meets an op outside the fold's rules (zeros made
  there); an output that is a view of an intermediate; outputs with other strides;
- the fold alone on hand-made graphs: what becomes zero, what is bypassed, what is
  materialized, and that a replacement never changes a returned gradient's strides;
- a fold that fails: autograd's zeros made at run time, with a warning (strict: raises);
- FUSER_ABSENT_GRADS off: autograd's zeros, as before.
"""

from __future__ import annotations

import pytest
import torch
from torch import fx

from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.support import DraftModule, copy_module
from fuser.dynamo.zero_fold import fold_absent
from fuser.examples.gpt2 import GPT, GPTConfig

# odd sizes: 3 x 7 tokens, 40 wide, vocabulary 67
TINY = GPTConfig(n_layer=1, n_head=2, n_embd=40, vocab_size=67, block_size=16)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(got: dict, want: dict, tol: float = 1e-5) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        assert (g is None) == (w is None), f"{name}: got {g is not None}, eager {w is not None}"
        if w is not None:
            torch.testing.assert_close(g, w, atol=tol, rtol=tol * 10, msg=name)


def _backward_records(backend: FuserBackend) -> list:
    return [g for c in backend.captures for g in c.graphs if g.kind == "backward"]


def _gpt2_pair(seed: int = 0) -> tuple[GPT, GPT]:
    torch.manual_seed(seed)
    eager, fused = GPT(TINY), GPT(TINY)
    fused.load_state_dict(eager.state_dict())
    return eager, fused


# how each step asks for gradients: loss only, or the logits' too
def _loss_only(logits: torch.Tensor, loss: torch.Tensor, g: torch.Tensor) -> None:
    loss.backward()


def _both(logits: torch.Tensor, loss: torch.Tensor, g: torch.Tensor) -> None:
    torch.autograd.backward([loss, logits], [None, g])


def _summed(logits: torch.Tensor, loss: torch.Tensor, g: torch.Tensor) -> None:
    (loss + (logits * g).sum()).backward()


def test_gpt2_logits_tangent_absent_then_present() -> None:
    """Three steps of one compiled GPT-2: loss only, a gradient for the logits too, loss
    only again. Each matches eager; the loss-only steps run the backward without the
    logits' tangent (the forward's autograd node was told), the other the traced one."""
    eager, fused = _gpt2_pair()
    backend = FuserBackend(strict=True)
    compiled = torch.compile(fused, backend=backend)
    gen = torch.Generator().manual_seed(1)
    for i, how in enumerate((_loss_only, _both, _loss_only, _summed)):
        x = torch.randint(0, TINY.vocab_size, (3, 7), generator=gen)
        y = torch.randint(0, TINY.vocab_size, (3, 7), generator=gen)
        g = torch.randn(3, 7, TINY.vocab_size, generator=gen)
        for m, fn in ((eager, eager), (fused, compiled)):
            m.zero_grad(set_to_none=True)
            logits, loss = fn(x, y)
            how(logits, loss, g)
        _assert_same(_grads(fused), _grads(eager))
        records = _backward_records(backend)
        want = ["g0_0_bw_zero1"] if i == 0 else ["g0_0_bw_zero1", "g0_0_bw"]
        assert [r.name for r in records] == want, f"step {i}"
    capture = backend.captures[0]
    assert capture.absent is not None and capture.absent.marked == 4
    zero, full = records
    assert "absent tangents tangents_1" in zero.tangents and "add" in zero.tangents
    assert "no zeros filled or read" in zero.tangents, zero.tangents
    assert full.tangents == ""
    # the variant's graph no longer takes the tangent: one input fewer
    inputs = [len(r.module.graph.find_nodes(op="placeholder")) for r in records]
    assert inputs[0] == inputs[1] - 1


def test_off_switch_leaves_autograds_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """FUSER_ABSENT_GRADS=0: the forward's node is not told, the backward gets the zeros
    and runs as traced."""
    monkeypatch.setattr(config, "absent_grads", False)
    eager, fused = _gpt2_pair(seed=2)
    backend = FuserBackend(strict=True)
    x = torch.randint(0, TINY.vocab_size, (3, 7))
    y = torch.randint(0, TINY.vocab_size, (3, 7))
    for fn in (eager, torch.compile(fused, backend=backend)):
        fn(x, y)[1].backward()
    _assert_same(_grads(fused), _grads(eager))
    assert backend.captures[0].absent is None
    assert [r.name for r in _backward_records(backend)] == ["g0_0_bw"]


class _TwoHeads(torch.nn.Module):
    """A trunk with two heads; `aux` is reached only through the first output."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(12, 20)
        self.main = torch.nn.Linear(20, 5)
        self.aux = torch.nn.Linear(20, 9)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.tanh(self.trunk(x))
        side = torch.nn.functional.gelu(self.aux(h)) * 1.5
        # where(): its backward's where(mask, grad, 0) is outside the fold's rules
        gated = torch.where(h > 0, h, torch.zeros_like(h))
        return side, self.main(h).sum(), gated.t()  # the last a view: other strides


@pytest.mark.parametrize("asked", ["main", "main+gated", "side", "all"])
def test_other_model_parameters_left_without_gradient(asked: str) -> None:
    """Only `main` asked: `aux`'s parameters get no gradient, as in eager (autograd's
    zeros would have given them zeros). The where() output's tangent meets an op the fold
    has no rule for: zeros are made there, and the gradients stay eager's."""
    torch.manual_seed(0)
    eager = _TwoHeads()
    fused = _TwoHeads()
    fused.load_state_dict(eager.state_dict())
    backend = FuserBackend(strict=True)
    x = torch.randn(6, 12)
    g_side, g_gated = torch.randn(6, 9), torch.randn(20, 6)
    for fn in (eager, torch.compile(fused, backend=backend)):
        side, main, gated = fn(x)
        if asked == "main":
            main.backward()
        elif asked == "main+gated":
            torch.autograd.backward([main, gated], [None, g_gated])
        elif asked == "side":  # the scalar output's tangent absent
            side.backward(g_side)
        else:
            torch.autograd.backward([side, main, gated], [g_side, None, g_gated])
    want = _grads(eager)
    _assert_same(_grads(fused), want)
    (record,) = _backward_records(backend)
    if asked == "all":
        assert record.tangents == ""
        return
    absent = {
        "main": "tangents_1, tangents_3",
        "main+gated": "tangents_1",
        "side": "tangents_2, tangents_3",
    }
    assert f"absent tangents {absent[asked]} " in record.tangents, record.tangents
    if asked == "side":
        assert want["main.weight"] is None and "2 gradients left None" in record.tangents
    if asked == "main":
        assert want["aux.weight"] is None and want["aux.bias"] is None
        assert "2 gradients left None" in record.tangents, record.tangents
        assert "zeros materialized for t_4 for where" in record.tangents, record.tangents


class _Viewed(torch.nn.Module):
    """Outputs that are views of an intermediate (AOTAutograd returns the intermediate
    and regenerates the views outside its Function)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x) * 2
        return h.view(-1), h.sum()


def test_view_output_with_absent_gradient() -> None:
    torch.manual_seed(0)
    eager = _Viewed()
    fused = _Viewed()
    fused.load_state_dict(eager.state_dict())
    backend = FuserBackend(strict=True)
    x = torch.randn(5, 8)
    for fn in (eager, torch.compile(fused, backend=backend)):
        flat, total = fn(x)
        (total * 3).backward()
    _assert_same(_grads(fused), _grads(eager))


def _graph(fn, *vals: torch.Tensor) -> fx.GraphModule:
    """`fn` traced to an ATen graph whose placeholders carry fake values, named as
    AOTAutograd names a backward's inputs (tangents_*)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = make_fx(fn)(*vals)
    for i, n in enumerate(gm.graph.find_nodes(op="placeholder")):
        n.name = n.target = f"tangents_{i + 1}" if i < 2 else f"saved_{i}"
    gm.recompile()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*vals)
    return gm


def _run(gm: fx.GraphModule, args: list) -> list:
    """gm's outputs on args; a fold's draft (a graph without source) is made a module."""
    out = (copy_module(gm) if isinstance(gm, DraftModule) else gm)(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def test_fold_rules_on_a_hand_made_backward() -> None:
    """tangents_1 absent: through views, a product, a reduction and a backward op it stays
    a structural zero; the sum with tangents_2 becomes tangents_2's side; the gradient
    that only it fed is None; the result equals the graph run with zeros."""
    aten = torch.ops.aten

    def bw(t1, t2, x):  # noqa: ANN001, ANN202
        a = aten.view.default(t1, [6, 4])
        b = aten.mul.Tensor(a, x)
        c = aten.gelu_backward.default(b, x)
        d = aten.add.Tensor(c, aten.mul.Tensor(t2, x))
        e = aten.sum.dim_IntList(aten.mul.Tensor(a, 3.0), [0])
        return d.t().contiguous(), e

    t1, t2, x = torch.randn(2, 3, 4), torch.randn(6, 4), torch.randn(6, 4)
    gm = _graph(bw, t1, t2, x)
    folded, note = fold_absent(gm, {"tangents_1"})
    names = [n.name for n in folded.graph.find_nodes(op="placeholder")]
    assert names == ["tangents_2", "saved_2"], names
    got = _run(folded, [t2, x])
    want = _run(gm, [torch.zeros_like(t1), t2, x])
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is None  # all zero: no gradient
    assert "no zeros filled or read" in note and "1 gradients left None" in note, note
    targets = {n.target for n in folded.graph.nodes}
    assert torch.ops.aten.gelu_backward.default not in targets


def test_fold_materializes_where_no_rule_applies() -> None:
    """An op outside the rules (here a clamp of the incoming gradient, which a custom
    backward might do) gets real zeros of the tangent's layout, non-contiguous included;
    `zero - x` too."""
    aten = torch.ops.aten

    def bw(t1, t2, x):  # noqa: ANN001, ANN202
        a = aten.clamp.default(aten.t.default(t1), -1.0, 1.0)
        return aten.sub.Tensor(t1.t(), x) + a, aten.add.Tensor(a, t2)

    t1 = torch.randn(5, 3)
    t2, x = torch.randn(3, 5), torch.randn(3, 5)
    gm = _graph(bw, t1, t2, x)
    folded, note = fold_absent(gm, {"tangents_1"})
    got = _run(folded, [t2, x])
    want = _run(gm, [torch.zeros_like(t1), t2, x])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # the zero is made where it is read, as the transposed view it is there
    assert "zeros materialized for t for clamp, t_1 for sub" in note, note
    assert torch.ops.aten.as_strided.default in {n.target for n in folded.graph.nodes}


def test_fold_keeps_returned_gradient_strides() -> None:
    """`add(zero, y)` returned as a gradient where y has other strides than the sum: not
    replaced by y (autograd would copy a gradient of other strides), the zeros are made;
    inside the graph, where only a reader's strides change, it is replaced."""
    aten = torch.ops.aten

    def bw(t1, t2, x):  # noqa: ANN001, ANN202
        y = aten.t.default(aten.mul.Tensor(t2, x))  # [4, 6] of strides (1, 4)
        returned = aten.add.Tensor(t1, y)  # dense [4, 6]: t1's strides
        inner = aten.add.Tensor(t1, y)
        return returned, aten.mm.default(inner, x)

    t1, t2, x = torch.randn(4, 6), torch.randn(6, 4), torch.randn(6, 4)
    gm = _graph(bw, t1, t2, x)
    folded, note = fold_absent(gm, {"tangents_1"})
    got = _run(folded, [t2, x])
    want = _run(gm, [torch.zeros_like(t1), t2, x])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert got[0].stride() == want[0].stride()
    assert "zeros materialized" in note, note


def test_a_fold_that_fails_fills_zeros_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the fold cannot take a graph, the absent tangents are filled with zeros of their
    traced layout (what autograd would have made) and the graph runs as traced: a
    warning says so, gradients stay eager's; a strict backend raises instead."""
    import fuser.dynamo.tangents as tangents

    def broken(gm: fx.GraphModule, absent: set[str]) -> None:
        raise NotImplementedError("no rule")

    monkeypatch.setattr(tangents, "fold_absent", broken)
    torch.manual_seed(0)
    eager = _TwoHeads()
    fused = _TwoHeads()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(6, 12)
    backend = FuserBackend()
    with pytest.warns(UserWarning, match="filled with zeros .*no rule"):
        for fn in (eager, torch.compile(fused, backend=backend)):
            fn(x)[1].backward()
    got, want = _grads(fused), _grads(eager)
    # autograd's zeros reach aux's parameters: zeros where eager has none
    assert got["aux.weight"] is not None and not got["aux.weight"].any()
    _assert_same(
        {k: v for k, v in got.items() if not k.startswith("aux")},
        {k: v for k, v in want.items() if not k.startswith("aux")},
    )
    assert [r.name for r in _backward_records(backend)] == ["g0_0_bw"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="no rule"):
        torch.compile(_TwoHeads(), backend=FuserBackend(strict=True))(x)[1].backward()


def test_outputs_made_are_told_apart_from_inputs_not_by_their_node() -> None:
    """Under CUDA graphs (torch's cudagraph trees) a replayed forward returns the same
    tensor objects at every step, still holding the previous step's autograd node when
    the forward returns them. Taking "made by this call" as "no node yet" missed them from
    the first replay on, so autograd filled the absent gradients with zeros again and the
    backward without absent tangents was lowered beside the variant (found on a GPU:
    tests/test_cudagraphs_gpu.py). Made outputs are now those that are not inputs."""
    from fuser.dynamo.tangents import AbsentGrads

    absent = AbsentGrads()
    w = torch.randn(4, requires_grad=True)
    cached = w * 2  # a tensor that already has an autograd node, as a replayed output
    passed = torch.randn(4, requires_grad=True) * 3  # an input handed back as it is

    def fw(args: list) -> tuple:
        x, p = args
        args.clear()  # as a call program does
        return cached, p, x + 1

    forward = absent.watch(fw, 3)
    x = torch.randn(4)
    outs = forward([x, passed])
    made = absent._local.made
    assert any(o is cached for o in made) and any(o is outs[2] for o in made)
    assert not any(o is passed for o in made)

    # end to end, as under replay: every output the Function returns is an object the
    # forward handed back before, holding the previous call's node when it does
    kept = [torch.randn(4) * 1, torch.randn(4) * 1]

    def replayed(args: list) -> tuple:
        args.clear()
        return tuple(kept)

    forward = absent.watch(replayed, 2)

    class Replay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return forward([a])

        @staticmethod
        def backward(ctx, g_first, g_second):
            assert g_first is None  # not filled with zeros: the node was told
            return g_second * 2

    wrapped = absent.wrap(lambda a: Replay.apply(a))
    a = torch.randn(4, requires_grad=True)
    for _ in range(3):
        first, second = wrapped(a)
        second.sum().backward()
    assert absent.marked == 3

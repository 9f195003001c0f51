"""Casts of graph inputs launched together (fuser/runtime/cast_group.py, the call program's
fuser/dynamo/program/casts.py): the group kernel against torch's casts at odd sizes and
every float pair; a compiled autocast MLP whose weight casts become one launch, with the
same results and gradients as without grouping and as eager; and the grouping's limits
(in-place calls, tensors and bytes a group, devices)."""

from __future__ import annotations

import itertools

import pytest
import torch

from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.program import casts
from fuser.dynamo.program.step import Cast, Step
from fuser.dynamo.program.steps import Names
from fuser.runtime.cast_group import MAX_TENSORS, CastGroup, source

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _data(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3.0
    x[:: max(n // 7, 1)] *= 1e-38  # bf16 subnormals and values that round at the boundary
    return x.to(dtype).to(DEVICE)


def test_group_kernel_matches_torch_casts() -> None:
    """Each float pair (same dtype too), sizes that are not multiples of the block, one
    element, and a group of MAX_TENSORS tensors: each result equals torch's cast."""
    pairs = [(a, b) for a, b in itertools.product(FLOATS, FLOATS)]
    sizes = [1, 1000, 1025, 3, 4097, 2048, 7, 129, 1]
    for start in range(0, len(pairs), MAX_TENSORS):
        chunk = pairs[start : start + MAX_TENSORS]
        srcs = [_data(sizes[k], a, seed=start + k) for k, (a, _) in enumerate(chunk)]
        dsts = [torch.full_like(s, float("nan"), dtype=b) for s, (_, b) in zip(srcs, chunk)]
        group = CastGroup(tuple(s.numel() for s in srcs), tuple(chunk))
        group.launch([t for pair in zip(srcs, dsts) for t in pair])
        for s, d in zip(srcs, dsts):
            assert torch.equal(d, s.to(d.dtype)), (s.dtype, d.dtype, s.numel())


def test_group_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="1 to 8 tensors"):
        CastGroup((), ())
    with pytest.raises(ValueError, match="float pairs"):
        CastGroup((4,), ((torch.int32, torch.float32),))
    with pytest.raises(ValueError, match="sizes must be"):
        CastGroup((0,), ((torch.float32, torch.bfloat16),))
    text = source(((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)))
    assert "def cast_group_2(src0, dst0, n0, end0, src1, dst1, n1, end1)" in text


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(40, 72)
        self.b = torch.nn.Linear(72, 40)
        self.c = torch.nn.Linear(40, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.nn.functional.gelu(self.b(torch.nn.functional.gelu(self.a(x)))))


def _run(model: torch.nn.Module, fn, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = fn(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=DEVICE)).sum().backward()
    return y.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("grouped", [True, False])
def test_autocast_weight_casts_launch_together(grouped: bool, monkeypatch) -> None:
    """Under autocast the six weight and bias casts (and the input's) of a 3-layer MLP
    are lone casts of graph inputs: grouped, the forward program launches them as one
    CastGroup, and the backward its gradients' casts back to float32; either way the
    step computes what eager computes."""
    monkeypatch.setattr(config, "cast_groups", grouped)
    torch.manual_seed(0)
    model = _MLP().to(DEVICE)
    x = torch.randn(5, 40, device=DEVICE)
    want_y, want_g = _run(model, model, x)
    backend = FuserBackend(strict=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):  # the program is built at the first call and runs from the second
        got_y, got_g = _run(model, compiled, x)
        torch.testing.assert_close(got_y, want_y, atol=2e-2, rtol=2e-2)
        for n, g in want_g.items():
            torch.testing.assert_close(got_g[n], g, atol=2e-2, rtol=2e-2, msg=n)
    forward = backend.captures[0].graphs[0].program
    assert forward.calls >= 1
    assert ("casts, one launch" in forward.source) == grouped, forward.source
    groups = [s for s in forward.steps if s.op == "cast group"]
    assert len(groups) == (1 if grouped else 0)
    if grouped:
        assert len(groups[0].uses) == 2 * 7  # six parameters and the input, each a pair
    # the backward's casts of the weight gradients (bf16 matmul results) to float32 run
    # late, together
    backward = backend.captures[0].graphs[1].program
    assert ("casts, one launch" in backward.source) == grouped, backward.source


def _cast_pair(i: int, numel: int = 10, device: str = "cuda:0", where: str = "input") -> list[Step]:
    src, dst = f"p{i}", f"c{i}"
    alloc = Step("alloc", (dst,), (), alloc=((numel,), (1,), torch.bfloat16, device))
    cast = Cast(src, dst, numel, torch.float32, torch.bfloat16, where)
    return [alloc, Step("launch", (), (src, dst), "launch", device=device, cast=cast)]


def _grouped_launches(steps: list[Step]) -> list[tuple[str, ...]]:
    out = casts.group_casts(steps, Names(set()))
    return [s.uses for s in out if s.kind == "launch"]


def test_grouping_limits(monkeypatch) -> None:
    monkeypatch.setattr(config, "cast_groups", True)
    mm = Step("call", ("y",), ("x",), "y = mm(x)", op="aten.mm")
    copy = Step("call", ("z",), ("p9",), "z = copy_(p9)", op="aten.copy_")
    # hoisted over an out-of-place call, not over an in-place one
    steps = _cast_pair(0) + [mm] + _cast_pair(1) + [copy] + _cast_pair(2)
    launches = _grouped_launches(steps)
    assert launches == [("p0", "c0", "p1", "c1"), ("p2", "c2")]
    # nor over a Python function of the graph, which may write what it is given
    scale = Step("call", (), ("p1",), "scale_in_place(p1)", op="scale_in_place")
    steps2 = _cast_pair(0) + [mm, scale] + _cast_pair(1)
    assert _grouped_launches(steps2) == [("p0", "c0"), ("p1", "c1")]
    # at most MAX_TENSORS a launch
    many = [s for i in range(MAX_TENSORS + 1) for s in _cast_pair(i)]
    assert [len(u) // 2 for u in _grouped_launches(many)] == [MAX_TENSORS, 1]
    # at most MAX_BYTES made ahead: two casts of 3/4 of it each go apart
    big = casts.MAX_BYTES * 3 // 4 // 2  # bf16 elements
    assert len(_grouped_launches(_cast_pair(0, big) + _cast_pair(1, big))) == 2
    # one device a group
    other = _cast_pair(0) + _cast_pair(1, device="cuda:1")
    assert len(_grouped_launches(other)) == 2
    # off: unchanged
    monkeypatch.setattr(config, "cast_groups", False)
    assert casts.group_casts(steps, Names(set())) == steps


def test_casts_of_computed_values_sink_to_their_first_reader(monkeypatch) -> None:
    """A cast of a computed value (a weight gradient back to float32) runs later, with
    the next ones, up to the first step that reads one of their results; never across an
    in-place call; the results no step reads are cast together at the end."""
    monkeypatch.setattr(config, "cast_groups", True)

    def mm(i: int, *uses: str) -> Step:
        return Step("call", (f"p{i}",), uses, f"p{i} = mm()", op="aten.mm")

    reader = Step("call", ("r",), ("c1",), "r = c1 + 1", op="aten.add")
    copy = Step("call", ("z",), ("q",), "z = copy_(q)", op="aten.copy_")
    steps = (
        [mm(0)] + _cast_pair(0, where="value") + [mm(1)] + _cast_pair(1, where="value")
        + [mm(2), reader] + _cast_pair(2, where="value") + [copy, mm(3)]
        + _cast_pair(3, where="value") + [mm(4)] + _cast_pair(4, where="value")
    )  # fmt: skip
    out = casts.group_casts(steps, Names(set()))
    order = [s.defines[0] if s.kind != "launch" else "+".join(s.uses[1::2]) for s in out]
    assert order == ["p0", "p1", "p2", "c0", "c1", "c0+c1", "r", "c2", "c2", "z",
                     "p3", "p4", "c3", "c4", "c3+c4"]  # fmt: skip
    # each cast still reads a source made before it runs
    made: set[str] = set()
    for s in out:
        assert all(u in made or u == "q" for u in s.uses if u.startswith(("p", "q"))), s
        made.update(s.defines)


def test_a_grouped_cast_reads_its_view_as_a_tensor(monkeypatch) -> None:
    """A view only launches read becomes a pointer (program/pointers.py) and its tensor
    is never made. A cast group reads its tensors by name, so the program's passes group
    first and the views a group reads stay tensors (on a GPU, grouping after the pointer
    pass once left the backward reading a view that no longer existed)."""
    from types import SimpleNamespace

    from fuser.dynamo.program import rewrite

    monkeypatch.setattr(config, "cast_groups", True)
    steps: list[Step] = []
    for i in range(3):
        steps.append(Step("call", (f"m{i}",), (), f"m{i} = mm()", op="aten.mm"))
        view = (None, (10,), (1,), 0)
        code = f"t{i} = reinterpret(m{i}, (10,), (1,), 0)"
        steps.append(Step("view", (f"t{i}",), (f"m{i}",), code, (f"m{i}",), view=view))
        alloc = ((10,), (1,), torch.float32, "cuda:0")
        steps.append(Step("alloc", (f"c{i}",), (), alloc=alloc))
        cast = Cast(f"t{i}", f"c{i}", 10, torch.bfloat16, torch.float32, "value")
        code = f"k{i}(t{i}.data_ptr(), c{i}.data_ptr())"
        steps.append(Step("launch", (), (f"t{i}", f"c{i}"), code, device="cuda:0", cast=cast))
    b = SimpleNamespace(
        names=Names(set()),
        inputs=[],
        result_uses=["c0", "c1", "c2"],
        clones={},
        itemsize={f"t{i}": 2 for i in range(3)},
    )
    out = rewrite(steps, b)
    (group,) = [s for s in out if s.op == "cast group"]
    defined: set[str] = set()
    for s in out:
        assert set(s.uses) <= defined, (s, defined)
        defined.update(s.defines)
    assert all(f"t{i}" in group.code for i in range(3))

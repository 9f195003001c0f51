"""views.sink_row_views on FX graphs built by hand: which rewrites it makes, and that the
rewritten graph computes what the original did (random data, real tensors)."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from fuser.dynamo.views import VIEWS, sink_row_views

aten = torch.ops.aten


class _Graph:
    """An FX graph whose nodes carry fake values, as AOTAutograd's do."""

    def __init__(self) -> None:
        self.g = fx.Graph()
        self.mode = FakeTensorMode()

    def input(self, name: str, *shape: int) -> fx.Node:
        n = self.g.placeholder(name)
        with self.mode:
            n.meta["val"] = torch.empty(*shape)
        return n

    def op(self, target, *args, **kwargs) -> fx.Node:  # noqa: ANN001
        n = self.g.call_function(target, args, kwargs)

        def val(a):  # noqa: ANN001, ANN202
            if isinstance(a, (list, tuple)):
                return [val(x) for x in a]
            return a.meta["val"] if isinstance(a, fx.Node) else a

        vals = [val(a) for a in args]
        n.meta["val"] = target(*vals, **kwargs)
        return n

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return fx.GraphModule(torch.nn.Module(), self.g)(*inputs)


def _views_between(g: fx.Graph, a: str, b: str) -> bool:
    """Whether a view sits between an op whose name starts with `a` and one with `b`."""
    for n in g.nodes:
        if n.op == "call_function" and n.target in VIEWS:
            src = n.args[0]
            if str(src.target).startswith(a) and any(str(u.target).startswith(b) for u in n.users):
                return True
    return False


@pytest.mark.parametrize("dtype_kwarg", [False, True])
def test_sums_of_a_row_view_fold_with_or_without_a_dtype(dtype_kwarg: bool) -> None:
    """sum over the leading dims and sum over the last dim kept, of exp of a row view: both
    reduce the source (CUDA autocast gives sum a dtype=float32 argument, which stopped the
    fold: the Llama's RMSNorm backward stayed three regions on a GPU)."""
    t = _Graph()
    x = t.input("x", 6, 8)
    v = t.op(aten.reshape.default, x, [2, 3, 8])
    e = t.op(aten.exp.default, v)
    kw = {"dtype": torch.float32} if dtype_kwarg else {}
    cols = t.op(aten.sum.dim_IntList, e, [0, 1], True, **kw)
    rows = t.op(aten.sum.dim_IntList, e, [-1], True, **kw)
    scaled = t.op(aten.mul.Tensor, e, rows)  # [2, 3, 8] * [2, 3, 1]: sinks too
    t.g.output((cols, rows, scaled))
    xs = [torch.randn(6, 8, generator=torch.Generator().manual_seed(0))]
    want = t.run(xs)
    assert sink_row_views(t.g) >= 3
    t.g.lint()
    ops = [n.target for n in t.g.nodes if n.op == "call_function"]
    assert aten.exp.default in ops and not _views_between(t.g, "aten.exp", "aten.sum")
    assert not _views_between(t.g, "aten.exp", "aten.mul")
    got = t.run(xs)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


def test_repeated_views_of_one_source_are_one_node() -> None:
    """Each op moved below a view views its operands itself: views of one source to one
    shape end as one node (a region read the same saved activation three times)."""
    t = _Graph()
    h = t.input("h", 2, 3, 8)  # a saved [B, T, C] activation
    r = t.input("r", 2, 3, 1)
    g2 = t.input("g", 6, 8)  # a gradient out of a matmul, [B*T, C]
    gv = t.op(aten.reshape.default, g2, [2, 3, 8])
    a = t.op(aten.mul.Tensor, gv, h)
    b = t.op(aten.mul.Tensor, h, r)
    c = t.op(aten.add.Tensor, a, b)
    out = t.op(aten.reshape.default, c, [6, 8])
    t.g.output((out,))
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 1, generator=g)]
    xs.append(torch.randn(6, 8, generator=g))
    (want,) = t.run(xs)
    sink_row_views(t.g)
    t.g.lint()
    views_of_h = [n for n in t.g.nodes if n.target in VIEWS and n.args[0] is h]
    assert len(views_of_h) == 1, t.g
    (got,) = t.run(xs)
    torch.testing.assert_close(got, want)


def test_the_bias_sum_of_a_cat_reads_its_result() -> None:
    """sum over the rows of a view of a cat (GPT-2's q, k, v gradients, one tensor for the
    matmuls) stays a sum of the view: folded, it joined the cat's region, whose column
    reduction read the three pieces through views (1.44 against 0.60 ms a GPT-2 step on
    an H200). A sum of a view of anything else folds."""
    t = _Graph()
    pieces = [t.input(f"p{i}", 2, 3, 4) for i in range(3)]
    cat = t.op(aten.cat.default, pieces, 2)
    rows = t.op(aten.reshape.default, cat, [6, 12])
    bias = t.op(aten.sum.dim_IntList, rows, [0], dtype=torch.float32)
    other = t.op(aten.reshape.default, t.op(aten.exp.default, pieces[0]), [6, 4])
    folded = t.op(aten.sum.dim_IntList, other, [0])
    t.g.output((bias, folded))
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(2, 3, 4, generator=g) for _ in range(3)]
    want = t.run(xs)
    sink_row_views(t.g)
    t.g.lint()
    sums = {n.args[0].target for n in t.g.nodes if n.target is aten.sum.dim_IntList}
    assert sums == {aten.reshape.default, aten.exp.default}, sums
    for a, b in zip(t.run(xs), want):
        torch.testing.assert_close(a, b)


def test_a_sum_over_the_unit_rows_of_a_vector_stays() -> None:
    """[C] viewed as [1, C], summed over dim 0 (the bias gradient of F.linear on a vector):
    the source has no leading dims to reduce, and sum over an empty dim list reduces every
    dim in ATen, so the fold would give a scalar (found by fuser.fuzz.programs)."""
    t = _Graph()
    x = t.input("x", 24)
    v = t.op(aten.reshape.default, x, [1, 24])
    s = t.op(aten.sum.dim_IntList, v, [0])
    t.g.output((s,))
    xs = [torch.randn(24, generator=torch.Generator().manual_seed(3))]
    (want,) = t.run(xs)
    sink_row_views(t.g)
    t.g.lint()
    (got,) = t.run(xs)
    assert got.shape == (24,)
    torch.testing.assert_close(got, want)

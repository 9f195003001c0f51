"""The passes one by one: each is graph -> graph, keeps the results, and verifies."""

from __future__ import annotations

import copy
import dataclasses
from enum import Enum

import pytest
import sympy
import torch
import torch.nn.functional as F
from op_registry import COMPOSITE_SAMPLES, Case, binding, by_name, output_tolerance

from fuser import FusionDefinition
from fuser.examples import seed_inputs, seed_layernorm_fusion
from fuser.ir.dtypes import DType, dtype_of
from fuser.ir.evaluate import evaluate, tolerance
from fuser.ir.graph import Graph, Node
from fuser.ir.ops import Op
from fuser.ir.verify import verify
from fuser.passes import (
    concretize,
    cse,
    dce,
    decompose,
    eliminate_casts,
    fold_constants,
    run_pipeline,
)

F16, F32 = torch.float16, torch.float32


def run(graph: Graph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    if graph.is_symbolic():
        graph = concretize(graph, binding(graph, inputs))
    return evaluate(graph, inputs)


def casts(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == Op.CAST]


def round_trips(graph: Graph) -> list[tuple[Node, Node]]:
    """(narrowing cast, cast back): `float(half(x))` for float32 x and the like."""
    producer = graph.producers()
    pairs = []
    for outer in casts(graph):
        inner = producer.get(outer.inputs[0].id)
        if inner is not None and inner.op == Op.CAST and inner.inputs[0].dtype == outer.out.dtype:
            pairs.append((inner, outer))
    return pairs


def rand(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], what: str, reduced: int = 0) -> None:
    """Outputs match within fuser's tolerance; with `reduced` (a row length), within one
    ulp plus the float32 error of such rows: both sides then round once from float32."""
    for x, y in zip(a, b, strict=True):
        tol = output_tolerance(y.dtype, reduced) if reduced else tolerance(dtype_of(y.dtype))
        torch.testing.assert_close(
            x, y, atol=tol[0], rtol=tol[1], equal_nan=True, msg=lambda m: f"{what}: {m}"
        )


# -- cast elimination: the seed ---------------------------------------------------------
def seed_eager(t0, t1, t2, t3, t4, rounding: bool = True) -> torch.Tensor:
    """The seed fusion in eager torch, as its docstring writes it (optionally without the
    half rounding of t5, which is what relaxed precision computes)."""
    t5 = t1.float() + t0.float()
    t13 = (t5.half().float() if rounding else t5) + t2.float()
    y = F.layer_norm(t13, t13.shape[-1:], eps=1e-5) * t4.float() + t3.float()
    return y.half()


@pytest.mark.parametrize("rows,hidden", [(3, 7), (2, 5140)])
def test_seed_keeps_its_fp16_rounding(rows: int, hidden: int) -> None:
    fd = seed_layernorm_fusion()
    decomposed = decompose(fd.graph)
    assert round_trips(decomposed), "the seed has float(half(x)); the test needs it"
    strict = eliminate_casts(decomposed)
    assert len(round_trips(strict)) == len(round_trips(decomposed))
    inputs = seed_inputs(rows, hidden)
    expected = seed_eager(*inputs)
    final = fd.pipeline().final
    assert_same(run(final, inputs), [expected], "strict pipeline vs eager", hidden)

    relaxed = run_pipeline(fd.graph, relaxed_precision=True).final
    assert not round_trips(relaxed)
    assert len(casts(relaxed)) == len(casts(final)) - 2
    unrounded = seed_eager(*inputs, rounding=False)
    assert_same(run(relaxed, inputs), [unrounded], "relaxed vs eager, no rounding", hidden)
    assert not torch.equal(unrounded, expected), "inputs too tame: the rounding changed nothing"


def test_seed_relaxed_through_fusion_definition() -> None:
    fd = seed_layernorm_fusion()
    fd.relaxed_precision = True
    assert not round_trips(fd.pipeline().final)
    assert round_trips(seed_layernorm_fusion().pipeline().final)


# -- cast elimination: hand-built chains -------------------------------------------------
def chain(x_dtype: torch.dtype, *steps: torch.dtype, relaxed: bool = False) -> FusionDefinition:
    """neg(cast(...cast(x, steps[0])..., steps[-1])): neg keeps a node after the casts."""
    with FusionDefinition(relaxed_precision=relaxed) as fd:
        x = fd.define_tensor([4, 33], x_dtype)
        y = x
        for d in steps:
            y = fd.ops.cast(y, d)
        fd.add_output(fd.ops.neg(y))
    return fd


def chain_input(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return rand(4, 33) > 0
    if not dtype.is_floating_point:
        scale = 1e12 if dtype == torch.int64 else 1e3  # int64 values that int32 cannot hold
        return (rand(4, 33, dtype=torch.float64) * scale).to(dtype)
    # values that do not fit fp16 exactly, some beyond its range, some below its normals
    lo, hi = (-3, 3) if dtype == F16 else (-9, 6)
    scale = torch.logspace(lo, hi, 33, dtype=torch.float64)
    return (rand(4, 33, dtype=torch.float64) * scale).to(dtype)


def eager_chain(x: torch.Tensor, steps: tuple) -> torch.Tensor:
    for d in steps:
        x = x.to(d)
    return -x


GOES = [  # (input dtype, cast chain, casts left after the pipeline)
    (F32, (F32,), 0),  # cast to the same dtype
    (F16, (F32, F16), 0),  # half(float(h))
    (torch.bfloat16, (F32, torch.bfloat16), 0),
    (F16, (F32, torch.float64, F16), 0),  # a chain of exact widenings
    (torch.int32, (torch.int64, torch.int32), 0),
    (torch.bool, (F32, F16), 1),  # becomes one cast: bool -> half
    (F16, (F32, F32, F32), 1),
]
STAYS = [  # real roundings or truncations: (input dtype, cast chain)
    (F32, (F16, F32)),  # float(half(x))
    (F32, (torch.bfloat16, F32)),
    (torch.float64, (F32, torch.float64)),
    (torch.bfloat16, (F16, F32)),  # bf16 -> f16 is not exact (range)
    (F32, (torch.int32, F32)),  # truncation
    (F32, (torch.bool, F32)),
    (torch.int64, (torch.int32, torch.int64)),
]


@pytest.mark.parametrize("x_dtype,steps,left", GOES, ids=[str(g[1]) for g in GOES])
def test_exact_casts_go(x_dtype, steps, left) -> None:
    fd = chain(x_dtype, *steps)
    final = fd.pipeline().final
    assert len(casts(final)) == left, f"{x_dtype} -> {steps}\n{final}"
    x = chain_input(x_dtype)
    assert torch.equal(evaluate(final, [x])[0], eager_chain(x, steps))


@pytest.mark.parametrize("x_dtype,steps", STAYS, ids=[str(s[1]) for s in STAYS])
def test_roundings_stay(x_dtype, steps) -> None:
    fd = chain(x_dtype, *steps)
    final = fd.pipeline().final
    assert len(casts(final)) == len(steps), f"{x_dtype} -> {steps}\n{final}"
    x = chain_input(x_dtype)
    expected = eager_chain(x, steps)
    assert torch.equal(evaluate(final, [x])[0], expected)
    assert not torch.equal(expected, -x.to(expected.dtype)), "the chain must change values"


@pytest.mark.parametrize("x_dtype,steps", STAYS, ids=[str(s[1]) for s in STAYS])
def test_relaxed_drops_float_roundings_only(x_dtype, steps) -> None:
    final = chain(x_dtype, *steps, relaxed=True).pipeline().final
    float_round_trip = all(dtype_of(d).is_float for d in (x_dtype, *steps))
    float_round_trip &= steps[-1] == x_dtype
    assert len(casts(final)) == (0 if float_round_trip else len(steps)), f"{steps}\n{final}"


# -- common subexpression elimination ----------------------------------------------------
def test_cse_merges_duplicates() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 7])
        a = fd.ops.mul(fd.ops.exp(x), 2.0)
        b = fd.ops.mul(fd.ops.exp(x), 2.0)
        fd.add_output(fd.ops.add(a, b))
    merged = cse(fd.graph)
    assert [n.op for n in fd.graph.nodes].count(Op.EXP) == 2
    ops = [n.op for n in merged.nodes]
    assert ops.count(Op.EXP) == 1 and ops.count(Op.MUL) == 1 and ops.count(Op.CONST) == 1
    add = merged.nodes[-1]
    assert add.inputs[0] == add.inputs[1]
    x_ = rand(3, 7)
    assert torch.equal(evaluate(merged, [x_])[0], evaluate(fd.graph, [x_])[0])


def test_cse_keeps_scalars_of_different_types_apart() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([5], torch.int32)
        outs = [fd.ops.add(x, 1), fd.ops.add(x, 1.0), fd.ops.add(x, True)]
        for o in outs:
            fd.add_output(o)
    merged = cse(fd.graph)
    consts = [n for n in merged.nodes if n.op == Op.CONST]
    assert sorted(n.attr("dtype").value for n in consts) == ["bool", "float32", "int64"]
    assert len([n for n in merged.nodes if n.op == Op.ADD]) == 3
    x_ = torch.arange(1, 6, dtype=torch.int32)
    got = evaluate(merged, [x_])
    for g, e in zip(got, [x_ + 1, x_ + 1.0, x_ + True], strict=True):
        assert g.dtype == e.dtype and torch.equal(g, e)


def test_cse_keeps_int_and_float_values_apart_in_attrs() -> None:
    # 1 == 1.0 == True in Python; a hand-built graph whose consts differ only in that
    g = fd_graph_with_consts([1, 1.0])
    assert len([n for n in cse(g).nodes if n.op == Op.CONST]) == 2
    g = fd_graph_with_consts([1.0, 1.0])
    assert len([n for n in cse(g).nodes if n.op == Op.CONST]) == 1


def fd_graph_with_consts(values: list) -> Graph:
    with FusionDefinition() as fd:
        x = fd.define_tensor([5])
        y = x
        for _ in values:
            y = fd.ops.add(y, 0.5)
        fd.add_output(y)
    g = fd.graph
    consts = iter(values)
    nodes = tuple(
        Node(n.op, n.inputs, n.outputs, (("value", next(consts)), ("dtype", DType.float32)))
        if n.op == Op.CONST
        else n
        for n in g.nodes
    )
    return verify(Graph(g.inputs, nodes, g.outputs))


DIFFERENT_ATTRS = {
    "sum dims": lambda fd, x: (fd.ops.sum(x, dims=[0]), fd.ops.sum(x, dims=[1])),
    "cast dtype": lambda fd, x: (fd.ops.cast(x, F16), fd.ops.cast(x, torch.bfloat16)),
    "softmax dim": lambda fd, x: (fd.ops.softmax(x, dim=0), fd.ops.softmax(x, dim=1)),
    "layer_norm eps": lambda fd, x: (
        fd.ops.layer_norm(x, eps=1e-5),
        fd.ops.layer_norm(x, eps=1e-2),
    ),
    "const value": lambda fd, x: (fd.ops.mul(x, 2.0), fd.ops.mul(x, 3.0)),
    "gelu approximate": lambda fd, x: (fd.ops.gelu(x), fd.ops.gelu(x, approximate="tanh")),
    "var_mean correction": lambda fd, x: (
        fd.ops.var_mean(x, dims=[1], correction=0)[0],
        fd.ops.var_mean(x, dims=[1], correction=1)[0],
    ),
}


@pytest.mark.parametrize("build", DIFFERENT_ATTRS.values(), ids=DIFFERENT_ATTRS.keys())
def test_cse_does_not_merge_different_attrs(build) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([6, 6])
        a, b = build(fd, x)
        fd.add_output(a)
        fd.add_output(b)
    for graph in (fd.graph, decompose(fd.graph)):
        merged = cse(graph)
        assert merged.outputs[0] != merged.outputs[1], f"merged:\n{merged}"
        x_ = rand(6, 6)
        a_, b_ = evaluate(merged, [x_])
        assert not torch.equal(a_.float(), b_.float())


# -- dead code elimination ---------------------------------------------------------------
def test_dce_removes_unused_nodes() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 7])
        fd.ops.neg(fd.ops.exp(x))  # dead
        fd.ops.mul(x, 3.0)  # dead, with a dead constant
        var, mean = fd.ops.var_mean(x, dims=[1])  # only the mean is used
        fd.add_output(fd.ops.add(mean, 1.0))
    live = dce(fd.graph)
    ops = [n.op for n in live.nodes]
    assert ops == [Op.VAR_MEAN, Op.CONST, Op.ADD], str(live)
    x_ = rand(3, 7)
    assert torch.equal(evaluate(live, [x_])[0], evaluate(fd.graph, [x_])[0])
    assert dce(live) == live


# -- constant folding --------------------------------------------------------------------
def test_fold_constants_folds_scalar_subgraphs() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 9])
        two, three = fd.define_scalar(2.0), fd.define_scalar(3.0)
        scale = fd.ops.sqrt(fd.ops.add(fd.ops.mul(two, three), 1.0))
        half_up = fd.ops.cast(fd.ops.cast(fd.define_scalar(2.7), torch.int32), F32)
        ratio = fd.ops.div(fd.define_scalar(7), fd.define_scalar(2))  # int / int -> float
        pick = fd.ops.where(fd.ops.gt(two, three), two, three)
        y = fd.ops.mul(fd.ops.mul(fd.ops.mul(x, scale), half_up), ratio)
        fd.add_output(fd.ops.add(y, pick))
    folded = dce(fold_constants(fd.graph))
    producers = folded.producers()
    for n in folded.nodes:
        from_consts = [producers.get(v.id) for v in n.inputs]
        from_consts = [p is not None and p.op == Op.CONST for p in from_consts]
        assert n.op == Op.CONST or not all(from_consts), f"not folded: {n.describe()}\n{folded}"
    values = sorted(n.attr("value") for n in folded.nodes if n.op == Op.CONST)
    expected = sorted([torch.tensor(7.0).sqrt().item(), float(int(2.7)), 7 / 2, max(2.0, 3.0)])
    assert values == pytest.approx(expected)
    x_ = rand(4, 9)
    assert_same(evaluate(folded, [x_]), evaluate(fd.graph, [x_]), "folded vs unfolded")


def test_fold_constants_leaves_symbolic_sizes_until_bound() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        n = fd.ops.mul(fd.define_scalar(x.shape[1]), 2)
        fd.add_output(fd.ops.div(x, n))
    folded = fold_constants(fd.graph)
    assert Op.MUL in folded.ops()
    assert any(isinstance(n.attr("value"), sympy.Expr) for n in folded.nodes if n.op == Op.CONST)
    x_ = rand(3, 11)
    bound = dce(fold_constants(fd.bind([x_])))
    assert Op.MUL not in bound.ops()
    assert [n.attr("value") for n in bound.nodes if n.op == Op.CONST] == [11 * 2]
    torch.testing.assert_close(evaluate(bound, [x_])[0], x_ / 22)


# -- every pass verifies; the pipeline keeps and prints every stage -----------------------
PASSES = [decompose, fold_constants, eliminate_casts, cse, dce]


@pytest.mark.parametrize("sample", COMPOSITE_SAMPLES, ids=[s.name for s in COMPOSITE_SAMPLES])
def test_every_pass_output_verifies(sample) -> None:
    case = Case(sample, sample.shapes[1], F16)
    inputs = case.make_inputs()
    fd = case.define(inputs)
    graph = fd.graph
    for p in PASSES:
        out = p(graph)
        assert verify(out) is out and out.origin == p.__name__
        concrete = concretize(out, binding(out, inputs))
        assert verify(concrete) is concrete and not concrete.is_symbolic()
        assert_same(run(out, inputs), run(graph, inputs), f"{sample.name} after {p.__name__}")
        graph = out


def test_pipeline_keeps_and_prints_every_stage() -> None:
    fd = seed_layernorm_fusion()
    pipe = fd.pipeline()
    origins = [g.origin for g in pipe.stages]
    assert origins == ["definition"] + [p.__name__ for p in PASSES]
    assert pipe.final is pipe.stages[-1] and pipe.stages[0] == fd.graph
    text = str(pipe)
    starts = [text.index(f"fusion ({o})") for o in origins]
    assert starts == sorted(starts)
    for g in pipe.stages:
        assert str(g) in text
    assert Op.LAYER_NORM in pipe.stages[0].ops() and Op.LAYER_NORM not in pipe.final.ops()


def _mutable_parts(obj: object, path: str = "graph") -> list[str]:
    """Where `obj` holds something a pass could change in place: a list, dict or set, an
    unfrozen dataclass, or any object not known to be immutable."""
    if obj is None or isinstance(obj, (bool, int, float, str, Enum, sympy.Basic)):
        return []
    if isinstance(obj, tuple):
        return [p for i, x in enumerate(obj) for p in _mutable_parts(x, f"{path}[{i}]")]
    if dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen:
        return [
            p
            for f in dataclasses.fields(obj)
            for p in _mutable_parts(getattr(obj, f.name), f"{path}.{f.name}")
        ]
    return [f"{path}: {type(obj).__name__}"]


def test_passes_do_not_touch_their_input() -> None:
    """A pass cannot change the graph it is given because no part of a Graph can change:
    frozen dataclasses and tuples all the way down (a list or dict anywhere, an attr
    included, would let a pass edit its input in place). Checked on every stage of a
    pipeline that rewrites the graph, and the input compared field by field (==, not its
    printed form, which leaves out attrs) with a deep copy taken before."""
    case = Case(by_name("layer_norm_mean_rstd"), (3, 7), F16)
    fd = case.define(case.make_inputs())
    before = copy.deepcopy(fd.graph)
    pipe = fd.pipeline()
    relaxed = run_pipeline(fd.graph, relaxed_precision=True)
    assert fd.graph == before
    assert pipe.final != fd.graph and relaxed.final != fd.graph  # the passes rewrote it
    for g in [*pipe.stages, *relaxed.stages]:
        assert _mutable_parts(g) == [], g.origin
    unfrozen = Node(Op.CONST, (), (), (("value", [1.0]),))
    assert _mutable_parts(unfrozen) == ["graph.attrs[0][1]: list"]

"""str(fd) shows the whole graph; repr(fd) is Python that rebuilds it."""

from __future__ import annotations

import pytest
import torch
from op_registry import SAMPLES, Case, binding

from fuser import FusionDefinition
from fuser.examples import seed_inputs, seed_layernorm_fusion
from fuser.ir.evaluate import evaluate
from fuser.ir.graph import Graph
from fuser.ir.printer import graph_repro
from fuser.passes import concretize


def rebuild(source: str) -> FusionDefinition:
    namespace: dict = {}
    exec(compile(source, "<repr(fd)>", "exec"), namespace)
    return namespace["fd"]


def assert_shows_every_node(graph: Graph) -> None:
    """One header, one line per input, per node (outputs typed, operands named), outputs."""
    lines = str(graph).splitlines()
    assert lines[0] == (
        f"fusion ({graph.origin}): {len(graph.inputs)} inputs, {len(graph.nodes)} nodes, "
        f"{len(graph.outputs)} outputs"
    )
    assert lines[1 : 1 + len(graph.inputs)] == [f"  input  {v!r}" for v in graph.inputs]
    body = lines[1 + len(graph.inputs) : -1]
    assert len(body) == len(graph.nodes), str(graph)
    for line, node in zip(body, graph.nodes):
        outs = ", ".join(repr(v) for v in node.outputs)  # e.g. t3: f32[t0.shape[0], 7]
        call = f"{node.op.value}({', '.join(v.name for v in node.inputs)}"
        assert line.startswith(f"  {outs} = {call}"), f"{line!r} does not show {node}"
    assert lines[-1] == "  output " + ", ".join(v.name for v in graph.outputs)


def assert_round_trip(fd: FusionDefinition) -> FusionDefinition:
    source = repr(fd)
    again = rebuild(source)
    assert str(again) == str(fd), f"repr does not rebuild the fusion:\n{source}"
    assert repr(again) == source
    return again


# -- hand-written fusions ------------------------------------------------------------------
def fd_var_mean() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 5], torch.bfloat16)
        var, mean = fd.ops.var_mean(x, dims=[0, 2], correction=0, keepdim=True)
        fd.add_output(var)
        fd.add_output(fd.ops.sub(mean, var))
    return fd


def fd_layer_norm_stats() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 768], torch.float16)
        b = fd.define_tensor([768], torch.float16)
        y, mean, rstd = fd.ops.layer_norm(x, bias=b, eps=1e-6, return_mean_rstd=True)
        for t in (y, mean, rstd):
            fd.add_output(t)
    return fd


def fd_scalars() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], torch.float32)
        masked = fd.ops.where(fd.ops.isnan(x), float("-inf"), x)
        y = fd.ops.maximum(masked, 1e-12) * 0.5 + 3
        y = fd.ops.where(fd.ops.gt(y, float("inf")), float("nan"), y)
        n = fd.define_scalar(x.shape[1])
        flag = fd.define_scalar(True)
        fd.add_output(fd.ops.div(fd.ops.mul(y, flag), n))
        fd.add_output(fd.ops.iota(x.shape, dim=1, dtype=torch.int32))
    return fd


def fd_interleaved() -> FusionDefinition:
    # inputs defined between ops: the repro must keep the numbering
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], torch.float16)
        e = fd.ops.exp(fd.ops.cast(x, torch.float32))
        w = fd.define_tensor([-1], torch.float16)
        fd.add_output(fd.ops.gelu(e * w, approximate="tanh"))
    return fd


def _rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)


def _with_nan(x: torch.Tensor) -> torch.Tensor:
    x[0, 1] = float("nan")
    return x


F16 = torch.float16
HAND_WRITTEN = {  # name: (make the fusion, make inputs for it)
    "seed": (seed_layernorm_fusion, lambda: seed_inputs(2, 9)),
    "var_mean": (fd_var_mean, lambda: [_rand(3, 4, 5, dtype=torch.bfloat16)]),
    "layer_norm_mean_rstd": (
        fd_layer_norm_stats,
        lambda: [_rand(3, 768, dtype=F16), _rand(768, dtype=F16)],
    ),
    "scalars": (fd_scalars, lambda: [_with_nan(_rand(3, 7, dtype=torch.float32))]),
    "interleaved": (fd_interleaved, lambda: [_rand(3, 7, dtype=F16), _rand(7, dtype=F16)]),
}
MAKERS = [make for make, _ in HAND_WRITTEN.values()]


@pytest.mark.parametrize("make", MAKERS, ids=HAND_WRITTEN.keys())
def test_str_shows_every_node(make) -> None:
    fd = make()
    assert str(fd) == str(fd.graph)
    assert_shows_every_node(fd.graph)


@pytest.mark.parametrize("make", MAKERS, ids=HAND_WRITTEN.keys())
def test_repr_rebuilds_the_fusion(make) -> None:
    assert_round_trip(make())


def test_repr_of_the_seed_computes_the_same() -> None:
    fd = seed_layernorm_fusion()
    again = assert_round_trip(fd)
    inputs = seed_inputs(3, 7)
    assert torch.equal(again.reference(inputs)[0], fd.reference(inputs)[0])


def test_text_shows_attrs_and_multi_outputs() -> None:
    text = str(fd_layer_norm_stats())
    assert "t2: f16[t0.shape[0], 768], t3: f32[t0.shape[0], 1], t4: f32[t0.shape[0], 1] = " in text
    assert "layer_norm(t0, t1, eps=1e-06, return_mean_rstd=True)" in text
    assert "params" not in text
    text = str(fd_var_mean())
    assert "var_mean(t0, dims=[0, 2], correction=0, keepdim=True)" in text
    assert "t1: bf16[1, t0.shape[1], 1], t2: bf16[1, t0.shape[1], 1] = var_mean(" in text


def test_repro_calls_composites_by_keyword() -> None:
    source = repr(fd_layer_norm_stats())
    assert "t2, t3, t4 = fd.ops.layer_norm(t0, bias=t1, eps=1e-06, return_mean_rstd=True)" in source
    assert "fd.define_tensor(shape=[-1, 768], dtype=torch.float16)" in source
    assert "approximate='tanh'" in repr(fd_interleaved())
    assert "float('-inf')" in repr(fd_scalars())


# -- every registry sample ---------------------------------------------------------------
SAMPLE_CASES = [Case(s, s.shapes[-1], s.dtypes[0]) for s in SAMPLES]


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=[c.sample.name for c in SAMPLE_CASES])
def test_every_sample_round_trips(case: Case) -> None:
    fd = case.define(case.make_inputs())
    assert_shows_every_node(fd.graph)
    assert_round_trip(fd)


# -- pipeline stages ---------------------------------------------------------------------
@pytest.mark.parametrize("make,make_inputs", HAND_WRITTEN.values(), ids=HAND_WRITTEN.keys())
def test_pipeline_stages_print_and_rebuild(make, make_inputs) -> None:
    fd, inputs = make(), make_inputs()
    pipe = fd.pipeline()
    assert str(pipe) == "\n\n".join(str(stage) for stage in pipe.stages)
    for stage in pipe.stages:
        assert_shows_every_node(stage)
        # a stage's repro runs and computes what the stage computes (values renumbered)
        again = rebuild(graph_repro(stage))
        want = evaluate(concretize(stage, binding(stage, inputs)), inputs)
        got = again.reference(inputs)
        where = stage.origin
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m, s=where: f"{s}: {m}")

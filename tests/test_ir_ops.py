"""Every op of the registry, every dtype it takes: the reference evaluator and the
decomposed, optimized graph both match plain torch."""

from __future__ import annotations

import pytest
import torch
from op_registry import Case, assert_close, binding, by_name, cases, repro_on_error

from fuser import FusionDefinition
from fuser.ir.evaluate import evaluate
from fuser.ir.ops import COMPOSITE, PRIMITIVE
from fuser.passes import concretize, run_pipeline

CASES = [pytest.param(c, id=c.id) for c in cases()]


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_torch(case: Case, request: pytest.FixtureRequest) -> None:
    nodeid = request.node.nodeid
    with repro_on_error(case, nodeid):
        inputs = case.make_inputs()
        fd = case.define(inputs)
        assert_close(fd.reference(inputs), case.expected(inputs), case, "fd.reference", nodeid)
        # upcast=True runs in float64 throughout (roundings the graph asks for are kept)
        truth = case.truth64(inputs)
        got = fd.reference(inputs, upcast=True)
        assert all(g.dtype == torch.float64 for g in got if g.is_floating_point())
        got = [g.to(t.dtype) for g, t in zip(got, truth)]
        assert_close(got, truth, case, "fd.reference(upcast=True)", nodeid)


@pytest.mark.parametrize("case", CASES)
def test_pipeline_matches_torch(case: Case, request: pytest.FixtureRequest) -> None:
    nodeid = request.node.nodeid
    with repro_on_error(case, nodeid):
        inputs = case.make_inputs()
        fd = case.define(inputs)
        expected = case.truth(inputs)
        # symbolic sizes through every pass, bound at the end
        final = fd.pipeline().final
        left = sorted(o.value for o in final.ops() - PRIMITIVE)
        assert not left, f"{case.repro(nodeid)}\nnot decomposed: {left}"
        got = evaluate(concretize(final, binding(fd.graph, inputs)), inputs)
        assert_close(got, expected, case, "pipeline(symbolic).final", nodeid)
        # sizes bound first (constant folding then sees the row lengths as numbers)
        got = evaluate(run_pipeline(fd.bind(inputs)).final, inputs)
        assert_close(got, expected, case, "pipeline(bound).final", nodeid)


@pytest.mark.xfail(
    strict=True,
    reason="known: infer types a rank-0 tensor like a Python scalar, so f16[] * 0.5 is "
    "float32 in fuser and float16 in torch (the IR cannot tell a CONST from a 0-d input)",
)
def test_zero_dim_tensor_times_python_scalar_keeps_its_dtype() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([], torch.float16)
        fd.add_output(x * 0.5)
    x_ = torch.tensor(1.5, dtype=torch.float16)
    assert fd.reference([x_])[0].dtype == (x_ * 0.5).dtype


def test_registry_covers_every_op() -> None:
    defined = set()
    for c in cases():
        inputs = c.make_inputs()
        defined |= c.define(inputs).graph.ops()
        if defined >= PRIMITIVE | COMPOSITE:
            break
    missing = (PRIMITIVE | COMPOSITE) - defined
    assert not missing, f"ops without a registry sample: {sorted(o.value for o in missing)}"


# -- layouts: what a kernel must not assume about its inputs ----------------------------
LAYOUT_OPS = [
    ("exp", (3, 7)),
    ("add", (2, 5140)),
    ("where", (3, 7)),
    ("cast_f16", (3, 7)),
    ("sum_dimsL", (2, 5140)),
    ("sum_dims0", (3, 7)),
    ("softmax_dimL", (3, 7)),
    ("layer_norm_w_b", (2, 5140)),
    ("cross_entropy", (5, 7)),
]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """Same values, but the view starts one element into its storage."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    assert view.storage_offset() == 1
    return view


def _strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, not contiguous: transposed storage for 2-d, every other element for 1-d."""
    if t.dim() >= 2:
        out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        out = torch.empty(t.numel() * 2, dtype=t.dtype)[::2].view(t.shape)
        out.copy_(t)
    assert not out.is_contiguous() or t.numel() <= 1
    return out


@pytest.mark.parametrize("layout", [_misaligned, _strided], ids=["misaligned", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("name,shape", LAYOUT_OPS, ids=[n for n, _ in LAYOUT_OPS])
def test_layouts(name: str, shape: tuple, dtype: torch.dtype, layout, request) -> None:
    case = Case(by_name(name), shape, dtype)
    nodeid = request.node.nodeid
    with repro_on_error(case, nodeid):
        contiguous = case.make_inputs()
        inputs = [layout(t) for t in contiguous]
        fd = case.define(inputs)
        what = f"{layout.__name__.strip('_')} inputs"
        eager = case.expected(contiguous)
        assert_close(fd.reference(inputs), eager, case, f"fd.reference, {what}", nodeid)
        final = run_pipeline(fd.bind(inputs)).final
        truth = case.truth(contiguous)
        assert_close(evaluate(final, inputs), truth, case, f"pipeline, {what}", nodeid)


# (max and min over an empty dim are errors in torch, so they are not here)
EMPTY_OPS = [
    "exp",
    "add",
    "where",
    "cast_f32",
    "sum_dimsL",
    "sum_dims0",
    "mean_dims0",
    "max_dimsL",
    "softmax_dimL",
    "log_softmax_dimL",
    "layer_norm_w_b",
    "rms_norm_w",
    "var_mean_dimsL_c0_keep",
    "cross_entropy",
]


@pytest.mark.filterwarnings(r"ignore:var_mean\(\). degrees of freedom:UserWarning")
@pytest.mark.parametrize("name", EMPTY_OPS)
def test_zero_rows(name: str, request: pytest.FixtureRequest) -> None:
    case = Case(by_name(name), (0, 7), torch.float16)
    nodeid = request.node.nodeid
    with repro_on_error(case, nodeid):
        inputs = case.make_inputs()
        assert inputs[0].shape[0] == 0
        fd = case.define(inputs)
        assert_close(fd.reference(inputs), case.expected(inputs), case, "fd.reference", nodeid)
        final = fd.pipeline().final
        got = evaluate(concretize(final, binding(fd.graph, inputs)), inputs)
        assert_close(got, case.truth(inputs), case, "pipeline, 0 rows", nodeid)

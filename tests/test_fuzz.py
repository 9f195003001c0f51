"""The random-fusion fuzzer in its CI budget, the fuzzer's own machinery, and a regression
test for every bug it found (a strict xfail while a bug is open; fuser/fuzz/known.py lists
the open ones so long runs count them instead of stopping).

Longer runs: `python -m fuser.fuzz --seconds 600 --seed N` (see fuser/fuzz/__main__.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import shutil
import sys
import warnings
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from fuser import FusionDefinition
from fuser.config import config, use_interpreter
from fuser.errors import FuserError
from fuser.fuzz import __main__ as fuzz_cli
from fuser.fuzz.case import FuzzCase, InputSpec, Ref, Step, build, make_input, repro, with_layout
from fuser.fuzz.check import (
    compare,
    compare_output,
    judge,
    perturbed_runs,
    reference,
)
from fuser.fuzz.generator import CPU, GPU, fuzz_cases
from fuser.fuzz.known import KNOWN, known_issue
from fuser.fuzz.runner import Outcome, Stats, check_case, run_batch
from fuser.runtime import cuda_backend

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# about 70 s on one core of the interpreter (median case: 5 ops over 512 elements; 7% of
# rows 1000 to 50257 long); on a GPU every case compiles its kernels: fewer
CI_EXAMPLES = 1200 if DEVICE == "cpu" else 100
# the CUDA C++ backend: ~1 case a second in the g++ emulator
CUDA_CI_EXAMPLES = 100
INTERP = pytest.mark.skipif(not use_interpreter(), reason="Triton's CPU interpreter only")


def define(build_fn: Callable[[FusionDefinition], None]) -> FusionDefinition:
    with FusionDefinition("regression") as fd:
        build_fn(fd)
    return fd


def randn(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


def assert_agrees(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    problems = compare(fd, inputs)
    assert not problems, "\n".join(problems) + "\n" + repr(fd)


# -- the CI fuzz budget -------------------------------------------------------------------
@pytest.mark.nonfinite  # its data holds NaN and inf, and its scales overflow exp and pow
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_random_fusions(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI_EXAMPLES random fusions (CUDA_CI_EXAMPLES on the CUDA backend), derandomized
    (the same ones every run), all agreeing with eager; the schedules they reached cover
    every scheduler kind. Without a GPU the CUDA kernels run in the g++ emulator."""
    examples = CI_EXAMPLES
    if backend == "cuda":
        examples = CUDA_CI_EXAMPLES
        if DEVICE == "cpu":
            if shutil.which("g++") is None:
                pytest.skip("the CUDA emulator needs g++")
            monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", True)
        else:
            pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC through cuda-python")
    seen: Counter = Counter()
    fallbacks = []

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_cases(GPU if DEVICE == "cuda" else CPU, (backend,)))
    def one(case: FuzzCase) -> None:
        out = check_case(case, DEVICE, runs=2 if DEVICE == "cuda" else 1)
        assert out.status != "invalid", f"the generator made an invalid case: {out.problems}"
        if out.status != "ok" and known_issue("\n".join(out.problems), case):
            return  # a known bug, xfailed below
        assert out.status == "ok", "\n".join(out.problems) + "\n" + repro(case, device=DEVICE)
        seen.update(out.kinds)
        fallbacks.append(out.fallbacks)

    one()
    kinds = {"pointwise", "inner_persistent", "inner_looped", "outer_reduction"}
    assert kinds <= set(seen), f"schedule kinds reached: {dict(seen)}"
    if examples > 1000:  # the CPU's 1200 cases; 100 may all fit one kernel
        assert any(fallbacks), "no fusion needed an ATen segment: the generator lost odd dims"


# -- the fuzzer's machinery -----------------------------------------------------------------
def _case(*steps: Step, inputs: tuple[InputSpec, ...], outputs: tuple[int, ...]) -> FuzzCase:
    return FuzzCase(inputs[0].shape, inputs, steps, outputs, data_seed=3, scale=2.0)


LN_CASE = _case(
    Step("input", (0,)),
    Step("input", (1,)),
    Step("layer_norm", (Ref(0),), (("weight", Ref(1)),)),
    Step("mean", (Ref(2),), (("dims", (1,)), ("keepdim", True))),
    Step("sub", (Ref(2), Ref(3))),
    inputs=(InputSpec((5, 33), "float16", "transposed"), InputSpec((33,), "float16", "offset")),
    outputs=(2, 4),
)


@INTERP  # the machinery's tests run CPU tensors
def test_repro_is_runnable_python() -> None:
    """A failure prints Python that rebuilds the fusion and its inputs and compares."""
    source = repro(LN_CASE)
    namespace: dict = {}
    exec(compile(source, "<repro>", "exec"), namespace)
    fd = namespace["fd"]
    assert str(fd.graph) == str(build(LN_CASE).graph)
    assert [t.stride() for t in namespace["inputs"]] == [(1, 5), (1,)]


@INTERP
def test_repro_of_a_cuda_case(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    """A CUDA backend case's repro runs the CUDA kernels (in the emulator on a CPU)."""
    if shutil.which("g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", False)  # the repro turns it on
    source = repro(dataclasses.replace(LN_CASE, backend="cuda"))
    assert "compare(fd, inputs, backend='cuda')" in source
    exec(compile(source, "<repro>", "exec"), {})
    assert cuda_backend.EMULATE_ON_CPU
    assert capsys.readouterr().out.strip() == "no mismatch"


@INTERP
def test_compare_sees_wrong_answers() -> None:
    """The tolerance is not vacuous: one element off by 1%, a lost NaN, an inf for a
    finite value and a flipped bool are all reported."""
    fd = build(LN_CASE)
    inputs = [make_input(s, i) for i, s in enumerate(LN_CASE.inputs)]
    assert_agrees(fd, inputs)
    eager = fd.reference(inputs)[0]
    ref64 = fd.reference(inputs, upcast=True)[0]
    n = 33
    bad = eager.clone()
    bad[2, 7] *= 1.01
    assert compare_output(0, bad, eager, ref64, [ref64], n)
    nan_in, nan64 = eager.clone(), ref64.clone()
    nan_in[1, 1] = nan64[1, 1] = math.nan  # a NaN eager and float64 agree on, lost
    assert "NaN" in compare_output(0, eager, nan_in, nan64, [nan64], n)
    # where only eager has it (CPU ATen's vectorized gelu), matching float64 is fine
    assert compare_output(0, eager, nan_in, ref64, [ref64], n) is None
    inf = eager.clone()
    inf[0, 0] = math.inf
    assert compare_output(0, inf, eager, ref64, [ref64], n)
    flags = eager > 0
    flipped = flags.clone()
    flipped[3, 3] = ~flipped[3, 3]
    assert compare_output(0, flipped, flags, flags, [flags], 1)
    assert compare_output(0, eager, eager, ref64, [ref64], n) is None


def test_flipped_comparisons_excuse_only_near_ties() -> None:
    """A comparison may go either way only where its operands lie within their own
    spread of each other (`flip_uncertain`): lt(gelu(x), bf16(gelu(x))) flips where gelu
    cancels or sits at a rounding tie, not everywhere; an answer flipped everywhere is
    still reported at most elements."""
    with FusionDefinition("flips") as fd:
        x = fd.define_tensor([-1, -1], F32)
        g = fd.ops.gelu(x)
        fd.add_output(fd.ops.lt(g, fd.ops.cast(fd.ops.cast(g, BF16), F32)))
    inputs = [make_input(InputSpec((64, 33), "float32"), 5, scale=3.0, device=DEVICE)]
    got = fd.execute(inputs)[0]
    assert judge(fd, inputs, [got]) == []
    (msg,) = judge(fd, inputs, [~got])
    assert int(msg.split(": ")[1].split()[0]) > got.numel() // 2, msg
    flips = perturbed_runs(fd.bind(inputs), inputs, (1.0, -1.0))[3]
    ((mask, _),) = flips.values()
    assert 0 < int(mask.sum()) < got.numel() // 20, int(mask.sum())


def test_a_flipped_branch_is_not_a_blank_cheque() -> None:
    """Where a comparison may go either way, fuser may take either branch, but must still
    compute it: where(lt(gelu(x), bf16(gelu(x))), x, -x) at a near-tie may give x or -x,
    not 0 or x / 2 (an early checker accepted anything between the branches)."""
    with FusionDefinition("branches") as fd:
        x = fd.define_tensor([-1], F32)
        g = fd.ops.gelu(x)
        flip = fd.ops.lt(g, fd.ops.cast(fd.ops.cast(g, BF16), F32))
        fd.add_output(fd.ops.where(flip, x, fd.ops.neg(x)))
    inputs = [torch.linspace(-5.0, -4.0, 4001, dtype=F32).to(DEVICE)]
    got = fd.execute(inputs)[0]
    assert judge(fd, inputs, [got]) == []
    flips = perturbed_runs(fd.bind(inputs), inputs, (1.0, -1.0, None))[3]
    ((mask, _),) = flips.values()
    assert int(mask.sum()) >= 3
    other = torch.where(mask, -got, got)  # the other branch wherever it may be taken
    assert judge(fd, inputs, [other]) == []
    for j in mask.nonzero().flatten()[:3].tolist():
        for wrong in (0.0, got[j].item() / 2):
            bad = got.clone()
            bad[j] = wrong
            assert judge(fd, inputs, [bad]), (j, wrong)


def test_perturbed_references_keep_special_values() -> None:
    """The perturbed float64 runs move finite values only: an inf stays inf (inf - inf
    would make a NaN there look legitimate), a NaN stays NaN."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.log(fd.ops.abs(x)))
        fd.add_output(fd.ops.sum(x, dims=[1]))

    x = randn(3, 5)  # row 2 stays finite
    x[0, 1], x[1, 2] = math.inf, math.nan
    fd = define(build_fn)
    graph = fd.bind([x])
    truth = reference(graph, [x], upcast=True)
    for seed, sign in ((0, 1.0), (1, -1.0), (2, None)):
        moved = reference(graph, [x], seed=seed, sign=sign)
        for m, t in zip(moved, truth):
            assert torch.equal(m.isnan(), t.isnan()) and torch.equal(m.isinf(), t.isinf())
            finite = t.isfinite()
            assert ((m - t).abs()[finite] <= 1e-4 * (t.abs()[finite] + 1)).all()
            assert (m != t)[finite].any(), "finite values do move"


@pytest.mark.parametrize(
    "layout,stride,offset",
    [
        ("contiguous", (7, 1), 0),
        ("offset", (7, 1), 1),
        ("transposed", (1, 3), 0),
        ("strided", (14, 2), 0),
        ("row_sliced", (10, 1), 1),
        ("expanded", (0, 1), 0),
    ],
)
def test_layouts(layout: str, stride: tuple[int, int], offset: int) -> None:
    x = make_input(InputSpec((3, 7), "float32", layout), seed=1)
    assert (x.stride(), x.storage_offset()) == (stride, offset)
    if layout != "expanded":  # same values in every layout
        assert torch.equal(x, make_input(InputSpec((3, 7), "float32"), seed=1))
        # storage the view skips is NaN: a kernel reading outside the view gets NaN
        flat = torch.as_strided(x, (x.untyped_storage().nbytes() // 4,), (1,), 0)
        assert flat.isnan().sum() == flat.numel() - 21
    assert with_layout(torch.tensor(2.0), layout).dim() == 0


@pytest.mark.parametrize("profile", [CPU, GPU], ids=["cpu", "gpu"])
def test_generator_makes_valid_cases(profile: object) -> None:
    """Cases build, their shapes match the generator's bookkeeping, and sizes respect the
    profile (a few long rows, few rows on the interpreter)."""
    domains: list[tuple[int, ...]] = []

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(fuzz_cases(profile))
    def one(case: FuzzCase) -> None:
        fd = build(case)  # raises if the generator's shape bookkeeping is off
        assert len(fd.graph.inputs) == len(case.inputs)
        assert len(fd.graph.outputs) == len(case.outputs) >= 1
        domains.append(case.domain)

    one()
    assert all(math.prod(d[:-1]) <= profile.max_rows for d in domains if d[-1] < 5000)
    assert len({len(d) for d in domains}) == 3, "ranks 1, 2 and 3"


@pytest.mark.nonfinite  # the fuzzer's data
def test_cli_writes_json(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fuzz.json"
    argv = ["--seconds", "8", "--seed", "7", "--batch-size", "2", "--json", str(path)]
    monkeypatch.setattr(config, "cache_dir", config.cache_dir)  # main() points it elsewhere
    monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", False)  # main() turns it on
    filters = list(warnings.filters)
    code = fuzz_cli.main(argv + ["--workers", "1", "--device", "cpu", "--backends", "triton,cuda"])
    # it ignored every RuntimeWarning, for the caller too; the interpreter is silent now
    assert warnings.filters == filters, "main() changed the warning filters"
    report = json.loads(path.read_text())
    assert code == (1 if report["mismatches"] or report["errors"] else 0)
    assert report["invalid"] == 0, report["invalid_examples"]
    assert report["fusions"] >= 1 and report["batches"][0]["seed"] == 7_000_000
    for key in ("seed", "device", "versions", "kinds", "failures", "known", "mismatches"):
        assert key in report
    assert report["backends"] == ["triton", "cuda"]  # as asked: the replay line uses it
    assert set(report["per_backend"]) <= {"triton", "cuda"}
    assert sum(report["per_backend"].values()) == report["fusions"]
    assert not cuda_backend.EMULATE_ON_CPU, "main() left the CUDA emulator on"
    with pytest.raises(SystemExit, match="triton and/or cuda"):
        fuzz_cli.main(argv + ["--device", "cpu", "--backends", "tritn"])


def test_every_known_bug_has_its_xfail() -> None:
    tests = dict(inspect.getmembers(sys.modules[__name__], inspect.isfunction))
    for k in KNOWN:
        path, name = k.test.split("::")
        assert path == "tests/test_fuzz.py" and name in tests, k
    known = {k.test.split("::")[1] for k in KNOWN}
    for name, fn in tests.items():
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "xfail"]
        assert not marks or name in known, f"{name} is xfailed but not in fuser/fuzz/known.py"


# -- bugs the fuzzer found, fixed ---------------------------------------------------------------
def test_rank0_tensor_next_to_a_tensor() -> None:
    """A rank-0 tensor operand from outside the kernel had no kind (KeyError in the
    executor); found as mean(x[1]) broadcast back, and as a 0-d input."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        s = fd.define_tensor([])
        fd.add_output(fd.ops.mul(x, s))
        fd.add_output(fd.ops.sum(fd.ops.add(x, s), dims=[1]))

    assert_agrees(define(build_fn), [randn(3, 5), randn(seed=1)])

    def mean_sub(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, dims=[0])))

    fd = define(mean_sub)
    assert_agrees(fd, [randn(1)])
    assert_agrees(fd, [randn(40, seed=2)])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_python_scalar_rounds_like_eager(dtype: torch.dtype) -> None:
    """Eager add/sub cast a Python scalar to the tensor's dtype first (bf16 + 0.01 adds
    0.010009765625); fuser added 0.01 in float32, one ulp off wherever that decides the
    rounding, and pow(|log(x + 0.01)|...) amplified it to 6 ulps. Bitwise equal now.
    (mul/div: CPU eager keeps the scalar, CUDA eager rounds it; one ulp either way.)"""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.add(x, 0.01))
        fd.add_output(0.3 - x)
        fd.add_output(x - 1e-3)
        fd.add_output(fd.ops.mul(0.1, x))
        fd.add_output(fd.ops.div(x, 3.3))

    x = (torch.arange(1, 4097, device=DEVICE) / 4096).to(dtype)
    fd = define(build_fn)
    got = fd.execute([x])
    eager = [x + 0.01, 0.3 - x, x - 1e-3, 0.1 * x, x / 3.3]
    # CUDA eager keeps every scalar in float32 (its opmath), add/sub included: there the
    # rounded scalar is one ulp off where it decides the rounding, as mul/div are on CPU
    exact = 3 if DEVICE == "cpu" else 0
    for i, (g, e) in enumerate(zip(got[:exact], eager[:exact])):
        assert torch.equal(g, e), (i, (g != e).sum().item())
    for g, e in zip(got[exact:], eager[exact:]):  # an ulp of operands up to 1.3 (0.3 - x)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(g, e, atol=eps, rtol=eps)


def test_softmax_over_a_middle_dim() -> None:
    """ATen segments handed kernels stride-0 broadcast views the kernels read as dense
    (garbage and inf); fixed in 0aba7dc (evaluate: broadcast/iota results dense)."""
    fd = define(lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([1, -1, -1]), dim=1)))
    assert_agrees(fd, [randn(1, 2, 2)])
    assert_agrees(fd, [randn(1, 9, 130, seed=1)])


# -- bugs the fuzzer found in code generation, fixed (fuser/codegen) -------------------------
def test_relu_propagates_nan() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.relu(fd.define_tensor([-1, -1]))))
    x = randn(2, 33)
    x[1, 4] = math.nan
    assert_agrees(fd, [x])


def test_tanh_of_small_values() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1])
        t = fd.ops.tanh(x)
        fd.add_output(fd.ops.div(t, x))  # tanh(x) / x: 1 - x^2/3, exactly as accurate
        fd.add_output(fd.ops.gt(t, x))  # never true for x > 0

    x = torch.logspace(-6, -1, 400, device=DEVICE)
    fd = define(build_fn)
    ratio, above = fd.execute([x])
    torch.testing.assert_close(ratio, torch.tanh(x) / x, atol=0, rtol=1e-6)
    assert not above.any()


@pytest.mark.nonfinite
def test_pow_one_to_the_inf() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.pow(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])))

    base = torch.tensor([[1.0, 1.0, 2.0, 0.5, -1.0]], device=DEVICE)
    exponent = torch.tensor([[math.inf, -math.inf, 3.0, math.inf, math.inf]], device=DEVICE)
    assert_agrees(define(build_fn), [base, exponent])


def test_softmax_of_a_broadcast_column() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        col = fd.ops.mean(x, dims=[0])
        wide = fd.ops.broadcast_in_dim(col, shape=x.shape, broadcast_dims=[1])
        fd.add_output(fd.ops.softmax(wide, dim=-1))

    assert_agrees(define(build_fn), [randn(4, 9)])


@pytest.mark.nonfinite
def test_var_mean_of_a_row_holding_inf() -> None:
    """ATen's var_mean (Welford) gives a NaN mean for a row holding an inf; torch.mean and
    fuser's two-pass decomposition give the inf. The checker accepts fuser's (documented
    in check.compare_output); this pins fuser's answer."""

    def build_fn(fd: FusionDefinition) -> None:
        var, mean = fd.ops.var_mean(fd.define_tensor([-1, -1]), dims=[1])
        fd.add_output(mean)
        fd.add_output(var)

    x = randn(2, 5)
    x[0, 3] = -math.inf
    fd = define(build_fn)
    mean, var = fd.execute([x])
    assert mean[0].item() == -math.inf and torch.equal(mean[1:], x[1:].mean(dim=1))
    assert var[0].isnan() and not var[1].isnan()
    if DEVICE == "cpu":  # CUDA's var_mean gives the inf too
        assert fd.reference([x])[0][0].isnan()  # eager's NaN
    assert_agrees(fd, [x])


def transposed(rows: int, cols: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    """Random [rows, cols] stored column-major: a non-contiguous input."""
    return randn(cols, rows, dtype=dtype, seed=seed).t()


# Triton chose its own dtype for an op on two float dtypes: tl.div_rn rejected float32 with
# float16 ("Expected dtype fp32 but got fp16"), float16 + bfloat16 ran in float16 (its
# rule 3) where torch promotes to float32. The renderer now converts every operand to the
# dtype the IR gives the op (float32 for a 16-bit one) first.
def test_div_of_float32_by_float16() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.div(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], F16)))

    y = randn(3, 5, dtype=F16, seed=1).abs() + 0.5
    assert_agrees(define(build_fn), [randn(3, 5), y])


def test_add_float16_bfloat16() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.add(fd.define_tensor([-1], F16), fd.define_tensor([-1], BF16)))

    assert_agrees(define(build_fn), [randn(511, dtype=F16), randn(511, dtype=BF16, seed=1)])


MIXED = [(F32, F16), (F32, BF16), (F16, BF16), (torch.float64, BF16)]


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "_".join(str(t)[6:] for t in d))
def test_ops_on_two_float_dtypes(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    """Every binary op family on [3, 37] operands of two float dtypes, one transposed;
    a third of the elements equal in both (comparisons at their ties)."""
    da, db = dtypes

    def build_fn(fd: FusionDefinition) -> None:
        a, b = fd.define_tensor([-1, -1], da), fd.define_tensor([-1, -1], db)
        for op in ("add", "sub", "mul", "div", "maximum", "minimum", "gt", "eq", "le"):
            fd.add_output(getattr(fd.ops, op)(a, b))
        fd.add_output(fd.ops.pow(fd.ops.add(fd.ops.abs(a), 0.5), b))
        fd.add_output(fd.ops.where(fd.ops.gt(a, 0.0), a, b))

    a = transposed(3, 37, BF16).to(da)  # values both dtypes hold exactly
    b = randn(3, 37, dtype=db, seed=1)
    b[:, ::3] = a[:, ::3].to(db)
    fd = define(build_fn)
    assert_agrees(fd, [a, b])
    for i, (g, e) in enumerate(zip(fd.execute([a, b]), fd.reference([a, b]))):
        assert g.dtype == e.dtype, (i, g.dtype, e.dtype)


@pytest.mark.parametrize("op", ["exp", "div", "gt"])
def test_int_operands_of_float_ops(op: str) -> None:
    """An int tensor in an op whose dtype is float (exp, true division, a comparison with
    a Python float): Triton's tl.exp and tl.div_rn rejected int32 operands."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], torch.int32)
        fd.add_output(
            fd.ops.div(x, 3) if op == "div" else fd.ops.gt(x, 0.5) if op == "gt" else fd.ops.exp(x)
        )

    x = torch.arange(-50, 61, dtype=torch.int32, device=DEVICE).view(37, 3).t()
    assert_agrees(define(build_fn), [x])


# kernels.outer_reduction emitted COL nodes before its row loop and FULL/ROW nodes in it,
# never SCALAR ones: with one row, broadcast_in_dim(var[1] -> [1, 1]) is SCALAR and was
# never defined (NameError); the prologue and the split finalize kernel emit them now
def test_column_sum_of_one_row_minus_its_variance() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([1, -1])
        var, _ = fd.ops.var_mean(x, dims=[1], correction=0, keepdim=True)
        wide = fd.ops.broadcast_in_dim(var, shape=x.shape, broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(fd.ops.sub(x, wide), dims=[0]))

    assert_agrees(define(build_fn), [randn(1, 511)])


@pytest.mark.parametrize("rows", [1, 3])
def test_column_sum_with_scalar_values(rows: int) -> None:
    """A 0-d input and values computed from it alone, in the row loop and after the
    column sum, on a transposed [rows, 37]."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        half = fd.ops.mul(s, 0.5)
        col = fd.ops.sum(fd.ops.mul(x, half), dims=[0])
        fd.add_output(fd.ops.sub(col, fd.ops.exp(s)))

    assert_agrees(define(build_fn), [transposed(rows, 37), randn(seed=2)])


# Triton's interpreter faults that fuser's generated source now avoids, with the same GPU
# code (SASS for sm_90 compared before and after)
def test_where_bf16_with_python_scalar() -> None:
    """where(cond, <Python float>, bf16 tile) made Triton's interpreter build a bf16
    constant (InterpreterBuilder has no get_bf16); a 16-bit where now selects in float32."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.where(fd.ops.gt(x, 0.0), -math.inf, x))

    assert_agrees(define(build_fn), [randn(2, 3, dtype=BF16)])


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_python_scalars_in_comparisons_and_where(dtype: torch.dtype) -> None:
    """Eager rounds a Python scalar to the tensor's dtype before it compares or selects
    (bf16(0.1) == 0.1 is true); the comparisons run in float32 with the rounded literal."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.eq(x, 0.1))
        fd.add_output(fd.ops.gt(x, 0.1))
        fd.add_output(fd.ops.where(fd.ops.lt(x, 0.1), 0.1, x))
        fd.add_output(fd.ops.where(fd.ops.gt(x, 1.0), -math.inf, x))
        fd.add_output(fd.ops.mul(fd.ops.maximum(x, 0.1), 3.0))

    x = transposed(3, 37, dtype)
    x[0, :4] = torch.tensor(0.1).to(dtype)
    fd = define(build_fn)
    got, eager = fd.execute([x]), fd.reference([x])
    for i in range(4):
        assert torch.equal(got[i], eager[i]), (i, got[i], eager[i])
    assert_agrees(fd, [x])


def test_pow_python_scalar_exponent() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.pow(fd.define_tensor([-1, -1]), 2.0)))
    assert_agrees(fd, [randn(3, 5)])


@pytest.mark.parametrize(
    "exponent",
    [3.0, 0.5, -1.0, 0.0, pytest.param(math.inf, marks=pytest.mark.nonfinite), math.nan],
)
def test_pow_scalar_exponent_and_base(exponent: float) -> None:
    """pow with a Python float exponent or base, or a 0-d tensor one, on negative, zero
    and one bases: the pow_ helper broadcasts its operands before it `&`s comparisons."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        fd.add_output(fd.ops.pow(x, exponent))
        fd.add_output(fd.ops.pow(exponent, fd.ops.floor(x)))
        fd.add_output(fd.ops.pow(x, s))
        fd.add_output(fd.ops.pow(s, fd.ops.floor(x)))

    x = transposed(3, 37) * 3
    x[0, :3] = torch.tensor([0.0, 1.0, -1.0])
    s = torch.tensor(exponent, device=DEVICE)
    assert_agrees(define(build_fn), [x, s])


def test_logical_and_with_a_scalar_comparison() -> None:
    def build_fn(fd: FusionDefinition) -> None:  # as the fuzzer shrank it
        x = fd.define_tensor([-1])
        p = fd.ops.softmax(fd.ops.neg(fd.ops.sum(x, dims=[0], keepdim=True)), dim=-1)
        big = fd.ops.broadcast_in_dim(fd.ops.gt(p, 1.0), shape=x.shape, broadcast_dims=[0])
        fd.add_output(fd.ops.logical_and(fd.ops.gt(x, 1.0), big))

    assert_agrees(define(build_fn), [randn(2)])


def test_logical_ops_with_a_scalar_operand() -> None:
    """logical_and/or of a tile and a 0-d comparison, both ways round, and of a float
    tensor (nonzero is true); rendered as tl.where, not `&`/`|`."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        tile, flat = fd.ops.gt(x, 0.0), fd.ops.gt(s, 0.0)
        fd.add_output(fd.ops.logical_and(tile, flat))
        fd.add_output(fd.ops.logical_or(flat, tile))
        fd.add_output(fd.ops.logical_and(flat, tile))
        fd.add_output(fd.ops.logical_or(tile, fd.ops.floor(x)))

    for sign in (1.0, -1.0):
        assert_agrees(define(build_fn), [transposed(3, 37), torch.tensor(sign, device=DEVICE)])


@INTERP
def test_bf16_comparisons_on_the_interpreter() -> None:
    """Triton's interpreter keeps bf16 as uint16 bit patterns and compares those as
    unsigned ints (-1.5 > 1.5): bf16 operands are compared after .to(tl.float32) (exact;
    a GPU makes the same code)."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.gt(fd.ops.neg(x), x))
        fd.add_output(fd.ops.le(x, 0.5))

    fd = define(build_fn)
    x = torch.tensor([[-1.5, 2.0, -3.0, 0.25]], dtype=BF16)
    got = fd.execute([x])
    assert [g.tolist() for g in got] == [r.tolist() for r in fd.reference([x])]


@INTERP
def test_bf16_ops_on_the_interpreter() -> None:
    """Comparisons, maximum, isnan and logical_not of bf16 on random [3, 37] data with
    zeros of both signs and a NaN, as users' CPU runs get them."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        y = fd.ops.neg(x)
        fd.add_output(fd.ops.lt(x, y))
        fd.add_output(fd.ops.ge(x, 0.0))
        fd.add_output(fd.ops.ne(x, y))
        fd.add_output(fd.ops.maximum(x, y))
        fd.add_output(fd.ops.isnan(x))
        fd.add_output(fd.ops.logical_not(x))

    x = transposed(3, 37, BF16)
    x[0, :3] = torch.tensor([0.0, -0.0, math.nan])
    fd = define(build_fn)
    got = fd.execute([x])
    for g, e in zip(got, fd.reference([x])):
        assert (
            torch.equal(g, e)
            or torch.equal(g.isnan(), e.isnan())
            and torch.equal(g.nan_to_num(), e.nan_to_num())
        ), (g, e)


@INTERP
def test_cast_bool_to_bf16_on_the_interpreter() -> None:
    """cast(bool, bf16) copied the integer into the bit pattern in Triton's interpreter;
    casts to a 16-bit float now go through float32 (exact for bool)."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.cast(fd.ops.gt(x, 0.0), BF16))

    fd = define(build_fn)
    x = randn(2, 4, dtype=BF16)
    got = fd.execute([x])
    assert torch.equal(got[0], fd.reference([x])[0])


@pytest.mark.parametrize("src", [torch.bool, torch.int32, F16, torch.float64])
def test_casts_to_bf16_go_through_float32(src: torch.dtype) -> None:
    """Casts to bf16 from bool, int32, float16 and float64 (values bf16 holds)."""
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1, -1], src), BF16)))
    x = transposed(3, 37, BF16) * 64
    x = (x > 0) if src == torch.bool else x.to(src)
    got = fd.execute([x])
    assert torch.equal(got[0], fd.reference([x])[0])


def test_float32_to_bf16_rounds_to_nearest_even() -> None:
    """Bit for bit as torch: ties to even both ways, values just off a tie, overflow to
    inf past bf16's largest, subnormals, signed zeros, inf and NaN. Triton's interpreter
    truncates this conversion; interpreted kernels round with the bf16_rne helper."""
    base = 1.0 + 2.0**-7  # bf16's last mantissa bit set: a tie above rounds up
    ties = [1.0 + 2.0**-8, base + 2.0**-8, -(1.0 + 2.0**-8), -(base + 2.0**-8)]
    near = [1.0 + 2.0**-8 + 2.0**-20, 1.0 + 2.0**-8 - 2.0**-20, 3.0e38, 3.4e38, -3.4e38]
    small = [1e-40, -1e-40, 2.0**-133 * 3, 0.0, -0.0, math.inf, -math.inf, math.nan]
    special = torch.tensor(ties + near + small, dtype=F32)
    x = torch.cat([special, torch.randn(200, generator=torch.Generator().manual_seed(3)) * 7])
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1], F32), BF16)))
    got = fd.execute([x.to(DEVICE)])[0].cpu()
    want = x.to(BF16)
    assert torch.equal(got.view(torch.int16)[: -1 - 200], want.view(torch.int16)[: -1 - 200])
    assert got[-201].isnan()
    assert torch.equal(got[-200:], want[-200:])


def test_bf16_subnormals_widen_exactly() -> None:
    """bf16 subnormals (below 2^-126) widen to the same float32 values as torch's, through
    a cast and as operands of arithmetic and comparisons."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1], BF16)
        fd.add_output(fd.ops.cast(x, F32))
        fd.add_output(fd.ops.mul(x, 2.0**100))
        fd.add_output(fd.ops.gt(x, 0.0))

    bits = torch.tensor([1, 3, 0x7F, 0x8001, 0x807F, 0, 0x8000, 0x3F80], dtype=torch.int32)
    x = bits.to(torch.uint16).view(BF16)
    fd = define(build_fn)
    got = fd.execute([x.to(DEVICE)])
    for g, e in zip(got, fd.reference([x])):
        assert torch.equal(g.cpu(), e), (g, e)


def test_float64_to_bf16_rounds_through_float32() -> None:
    """torch converts a double to bf16 through float (c10): 1 + 2^-8 + 2^-30 is a tie in
    float32 and rounds to 1.0, where one rounding gives 1.0078125."""
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1], torch.float64), BF16)))
    x = torch.tensor([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 3.0], dtype=torch.float64)
    x = x.to(DEVICE)
    assert torch.equal(fd.execute([x])[0], fd.reference([x])[0])
    assert fd.reference([x])[0][0].item() == 1.0


# -- GPU soak of 2026-11-22 (seed 11, 8199 fusions): its two mismatches -----------------
@pytest.mark.nonfinite
def test_pow_near_the_float32_overflow_is_accurate() -> None:
    """pow with results near 2**128: the float32 exp2(b * log2 a) of the GPU was ~1e-5
    off and stayed finite where torch's powf overflows (batch seed 11800000)."""
    g = torch.Generator().manual_seed(11)
    a = torch.rand(2000, generator=g) * 50 + 1.5
    b = (127.99 / torch.log2(a)) * (1 + (torch.rand(2000, generator=g) - 0.5) * 2e-4)
    fd = define(
        lambda fd: fd.add_output(fd.ops.pow(fd.define_tensor([-1]), fd.define_tensor([-1])))
    )
    (got,) = fd.execute([a.to(DEVICE), b.to(DEVICE)])
    exact = torch.pow(a.double(), b.double())
    fmax = torch.finfo(torch.float32).max
    clear = (exact - fmax).abs() > 4 * fmax * torch.finfo(torch.float32).eps
    assert bool(clear.sum() > 1500) and bool((exact[clear] > fmax).any())
    want = exact.float()  # correctly rounded, inf past the largest float
    torch.testing.assert_close(got.cpu()[clear], want[clear], rtol=4e-7, atol=0.0)


def test_chaotic_elements_are_not_judged() -> None:
    """cos of a 1e9 argument, renormalized (batch seed 12500001): perturbing each op by a
    few eps moves the float64 answer across the output's whole range, so no float32 value
    is wrong there; an element that perturbations barely move still is."""
    ref64 = torch.tensor([0.0105, 0.5, -0.7], dtype=torch.float64)
    eager = torch.tensor([0.1325, 0.5, -0.7])
    moved = [ref64 + torch.tensor([1.26, 0.0, 0.0], dtype=torch.float64)]
    got = torch.tensor([-1.39, 0.5, -0.7])
    assert compare_output(0, got, eager, ref64, moved, 16) is None
    bad = torch.tensor([-1.39, 0.9, -0.7])
    assert "out of tolerance" in (compare_output(0, bad, eager, ref64, moved, 16) or "")
    # an output that is ~0 everywhere: chaotic or not, a value far outside its scale is wrong
    tiny = torch.full((4,), 1e-13, dtype=torch.float64)
    far = [tiny + 1e-3]
    way_off = torch.full((4,), 5.0)
    msg = compare_output(0, way_off, tiny.float(), tiny, far, 16) or ""
    assert "out of tolerance" in msg


# -- GPU soak, seed 12 (benchmarks/results/h100-2026-11-22-fuzz-seed12): FMA contraction --
def _product_minus_itself(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], F16)
    doubled = fd.ops.add(x, x)
    mean = fd.ops.mean(doubled, dims=[0])
    product = fd.ops.mul(doubled, fd.ops.broadcast_in_dim(mean, [1, 1], [1]))
    fd.add_output(fd.ops.sub(product, product))


def _max_minus_product(fd: FusionDefinition) -> None:
    x = fd.define_tensor([5140], F32)
    var, _ = fd.ops.var_mean(x, dims=[0], correction=0)
    xv = fd.ops.mul(x, var)
    gap = fd.ops.sub(fd.ops.maximum(var, xv), xv)
    fd.add_output(gap)
    fd.add_output(fd.ops.softmax(fd.ops.minimum(gap, x), dim=-1))


def _scaled_compare(fd: FusionDefinition) -> None:
    x = fd.define_tensor([1, -1, -1], F16)
    scaled = fd.ops.mul(0.001, fd.ops.add(x, x))
    wide = fd.ops.cast(scaled, F32)
    above = fd.ops.gt(wide, fd.ops.cast(fd.ops.gt(wide, 1.0), F32))
    fd.add_output(fd.ops.logical_and(fd.ops.eq(scaled, 0.1), above))


@pytest.mark.parametrize(
    "build_fn,shape,dtype,scale,seed",
    [
        (_product_minus_itself, (1, 1), "float16", 1.0, 0),
        (_max_minus_product, (5140,), "float32", 1000.0, 4036),
    ],
    ids=["product_minus_itself", "max_minus_product"],
)
def test_no_multiply_add_contraction(build_fn, shape, dtype: str, scale: float, seed: int) -> None:
    """On the GPU, LLVM contracted a multiply and a later subtract into one FMA (Triton's
    default): x*y - x*y gave the product's rounding error (-0.00108 in fp16, not 0) and
    max(v, x*v) - x*v gave +-60 at 1e9, which a softmax then picked out (0.993 where eager
    has 0.0004). Kernels are compiled without floating-point contraction now."""
    fd = define(build_fn)
    inputs = [make_input(InputSpec(shape, dtype, "contiguous"), seed, scale, device=DEVICE)]
    assert not compare(fd, inputs), compare(fd, inputs)
    gap = fd.execute(inputs)[0]
    assert torch.equal(gap == 0, fd.reference(inputs)[0] == 0)


def test_scalar_product_compared_at_a_tie() -> None:
    """Soak seed 12: 0.001 * (x + x) == 0.1 for fp16 x = 50 is True in the kernel and in
    eager (`0.001 * t`, the scalar unrounded); the reference evaluator made the scalar a
    0-d float32 tensor, which ATen rounds to fp16 first (False). It passes a constant to
    mul/div as the Python number now, the tensor first."""
    fd = define(_scaled_compare)
    spec = InputSpec((1, 64, 511), "float16", "contiguous")
    inputs = [make_input(spec, 4036, 30.0, device=DEVICE)]
    assert not compare(fd, inputs), compare(fd, inputs)


# -- GPU soak, seed 14 (benchmarks/results/h100-2026-11-22-fuzz-seed13-14) ------------------
def _exp_through_half(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], F32)
    half = fd.ops.cast(fd.ops.neg(fd.ops.exp(x)), F16)
    fd.add_output(fd.ops.cast(half, F32))


def test_value_at_a_half_rounding_boundary() -> None:
    """Soak seed 14: exp(3.0684164) is one float32 ulp above 21.5078125, the midpoint of
    two float16 neighbours, so a GPU's approximate exp (an ulp low) rounds -exp(x) to
    -21.5 where eager has -21.515625, and the float32 output is judged at float32's
    tolerance. The perturbed references missed it: the all-up run moved exp up and then
    neg up, which cancel. A narrowing cast now moves its operand in the run's direction,
    so one of the two signed runs lands on the other neighbour, and only there."""
    fd = define(_exp_through_half)
    x = randn(2, 16)
    x[1, 5] = 3.0684164
    graph = fd.bind([x])
    eager = fd.reference([x])[0]
    at = eager[1, 5].item()
    assert at in (-21.5, -21.515625)
    other = -21.5 if at == -21.515625 else -21.515625
    signed = {
        reference(graph, [x], seed=i, sign=s)[0][1, 5].item() for i, s in ((0, 1.0), (1, -1.0))
    }
    assert signed == {-21.5, -21.515625}
    got = eager.clone()
    got[1, 5] = other
    assert not judge(fd, [x], [got])
    # an element away from a boundary may not move to a neighbour
    got[0, 3] = float(torch.tensor(got[0, 3].item()).half().float() * (1 + 2**-10))
    assert "out of tolerance" in "".join(judge(fd, [x], [got]))


def _broadcast_row_normalized(fd: FusionDefinition, cols: int) -> None:
    # the soak's shape: a per-row value broadcast over the row, rounded to fp16
    per_row = fd.define_tensor([1, 3], F32)
    wide = fd.ops.broadcast_in_dim(per_row, shape=[1, 3, cols], broadcast_dims=[0, 1])
    row = fd.ops.cast(wide, F16)
    y, mean, rstd = fd.ops.layer_norm(row, eps=1e-5, return_mean_rstd=True)
    for t in (y, mean, rstd):
        fd.add_output(t)
    as_float = fd.ops.cast(row, F32)
    fd.add_output(fd.ops.sum(as_float, dims=[2]))
    fd.add_output(fd.ops.max(as_float, dims=[2]))
    # pow amplifies any error in rstd (the soak's pow turned a 14x error into 4x)
    fd.add_output(fd.ops.pow(fd.ops.mul(rstd, 0.003), 40.0))  # 0.95^40, not inf


@pytest.mark.parametrize("cols", [20480, 1000, 3])
def test_sum_of_a_broadcast_row(cols: int) -> None:
    """Soak seed 14: a layer_norm over a per-row value broadcast across 20480 columns
    gave rstd 22 where eager has 316. Triton laid the [1, 1] value broadcast to
    [1, 4096] out with the whole row in every thread and summed it serially: 20480
    copies of 746.5 came to 15287396, not 15288320, and x - mean was 0.045, not 0. A
    reduction of a value that is the same across the row is now n * x (a sum) or x (a
    max or min), never a tl.sum of a broadcast."""
    fd = define(lambda fd: _broadcast_row_normalized(fd, cols))
    per_row = torch.tensor([[-118.7372, 211.0013, 746.2682]], device=DEVICE)
    y, mean, rstd, total, top, amplified = fd.execute([per_row])
    row = per_row.half().float()
    assert torch.equal(total, row * cols)  # exact: n * x fits float32 here
    assert torch.equal(top, row)
    assert torch.equal(mean.flatten(), row.flatten())
    assert torch.equal(y, torch.zeros_like(y))
    expected_rstd = torch.rsqrt(torch.tensor(1e-5)).item()
    assert torch.allclose(rstd, torch.full_like(rstd, expected_rstd), rtol=1e-6)
    assert amplified.min() > 0.1
    assert_agrees(fd, [per_row])
    # on any machine: the kernel for an H100 sums the broadcast row as a product
    (kernel,) = fd.compile([per_row.cpu()], device="h100")
    if kernel.backend == "triton" and kernel.schedule.kind == "inner_persistent":
        # every reduction here is of a row-constant value (the squares of x - mean too)
        source = kernel.source
        assert "tl.sum(" not in source and "tl.reduce(" not in source, source
        assert f"* {cols}" in source


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_constant_rows_normalize(dtype: torch.dtype) -> None:
    """Materialized constant rows: a 16-bit value's float32 sums are exact (every partial
    sum k * x fits 24 bits), so a layer_norm gives the bias, mean x and variance 0 as
    eager's Welford does; a float32 row of 24-bit values has a two-pass variance within
    float32 rounding of 0, which the checker accepts."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        b = fd.define_tensor([-1], dtype)
        y, mean, _ = fd.ops.layer_norm(x, bias=b, eps=1e-5, return_mean_rstd=True)
        var, _ = fd.ops.var_mean(x, dims=[1], correction=1)
        for t in (y, mean, var):
            fd.add_output(t)

    fd = define(build_fn)
    cols = 20480
    values = (torch.randn(4, 1, generator=torch.Generator().manual_seed(0)) * 1000).to(dtype)
    values[0, 0] = 734.5
    x = values.expand(4, cols).contiguous().to(DEVICE)
    b = randn(cols, dtype=dtype, seed=3)
    assert_agrees(fd, [x, b])
    if dtype != F32:
        y, mean, var = fd.execute([x, b])
        assert torch.equal(y, b.expand(4, cols))
        assert torch.equal(mean[:, 0], x[:, 0].float())
        assert torch.equal(var, torch.zeros_like(var))


@pytest.mark.parametrize(
    "error,status",
    [
        (RuntimeError("Triton Error [CUDA]: out of memory"), "oom"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "error"),
        (
            FuserError("CUDA driver call fuzz_k0 failed: <CUresult.CUDA_ERROR_OUT_OF_MEMORY: 2>"),
            "oom",
        ),
    ],
    ids=["triton_module_load", "torch_allocator", "fault", "cuda_module_load"],
)
def test_out_of_memory_is_not_a_bug(
    monkeypatch: pytest.MonkeyPatch, error: Exception, status: str
) -> None:
    """Soak seed 13: 16 workers on one GPU ran it out of memory. Triton reports that as a
    RuntimeError loading a module; it counted as a fuser error (and the CUDA "unknown
    error" after it as invalid cases). Both ways of running out now count as out of
    memory; anything else stays an error."""
    import fuser.fuzz.runner as runner

    def raise_it(*args: object, **kwargs: object) -> list[str]:
        raise error

    monkeypatch.setattr(runner, "compare", raise_it)
    out = check_case(LN_CASE, "cpu")
    assert out.status == status, out.problems


def test_a_poisoned_context_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Soak seed 18: after the driver ran out of memory loading a CUDA module, every later
    call in that worker failed with "CUDA error: unknown error" (205 cases counted as
    generator failures, 2 as fuser errors). After an out-of-memory such a failure counts
    with the out-of-memory ones and the worker stops; without one it is an error,
    reported as it is (not shrunk), and the worker stops too."""
    import fuser.fuzz.runner as runner

    unknown = "AcceleratorError: CUDA error: unknown error"
    # (statuses before, the out-of-memory skips counted, the failures reported)
    for first, oom, failures in (
        (["oom"], 2, []),  # right after an out-of-memory: counted with them
        ([], 0, ["error"]),  # out of the blue: a fuser error
        (["oom", "ok"], 1, ["error"]),  # an out-of-memory long before explains nothing
    ):
        outcomes = iter([Outcome(s, [unknown]) for s in first] + [Outcome("invalid", [unknown])])
        monkeypatch.setattr(runner, "check_case", lambda *a, it=outcomes, **k: next(it))
        stats = Stats()
        run_batch(1, 10, stats, "cpu")
        assert stats.cuda_lost and stats.invalid == 0, stats
        assert stats.out_of_memory == oom
        assert [f.kind for f in stats.failures] == failures
    # another CUDA error (a bad launch) is an error of its own: shrunk, the worker goes on
    launch = "FuserError: CUDA driver call k0 failed: <CUresult.CUDA_ERROR_INVALID_VALUE: 1>"
    monkeypatch.setattr(runner, "check_case", lambda *a, **k: Outcome("error", [launch]))
    stats = Stats()
    run_batch(2, 5, stats, "cpu")
    assert not stats.cuda_lost and [f.kind for f in stats.failures] == ["error"]
    # a kernel that faulted where nothing noticed: giving the memory back raises it
    monkeypatch.setattr(runner, "check_case", lambda *a, **k: Outcome("ok"))
    monkeypatch.setattr(runner, "_release_memory", lambda device: "illegal memory access")
    stats = Stats()
    run_batch(3, 5, stats, "cpu")
    assert stats.cuda_lost and [f.kind for f in stats.failures] == ["error"], stats
    assert "failed after this case" in stats.failures[0].message


# -- GPU soak, seed 15 (benchmarks/results/h100-2026-11-22-fuzz-seed15) ---------------------
def test_input_copied_for_one_kernel_only() -> None:
    """Soak seed 15: a [2, 2] input sliced out of wider rows (strides (5, 1)) fed two
    kernels: one broadcasting it over [2, 2, 5140], where its two dims must collapse into
    one row index and cannot, so the runtime passes a contiguous copy; and one reading it
    as a [2, 2] tile with its own strides. The copy was planned per tensor, not per
    kernel, so the second kernel read the 4-element copy with row stride 5 (0 and 28544
    where eager has 0.224 and -0.069). Copies are planned per kernel now."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1, -1])
        small = fd.define_tensor([-1, -1])
        wide = fd.ops.broadcast_in_dim(small, shape=x.shape, broadcast_dims=[0, 1])
        fd.add_output(fd.ops.gt(fd.ops.add(x, wide), 0.0))
        fd.add_output(fd.ops.cast(small, BF16))

    fd = define(build_fn)
    x = randn(2, 2, 5140)
    small = randn(2, 5, seed=1)[:, 1:3]
    assert small.stride() == (5, 1)
    assert_agrees(fd, [x, small])
    assert len(fd.kernels) == 2
    assert torch.equal(fd.execute([x, small])[1], small.to(BF16))


@pytest.mark.nonfinite
def test_rms_norm_of_a_row_holding_inf() -> None:
    """Soak seed 15 (four cases): CUDA ATen's fused rms_norm of a float16 row holding an
    infinity is NaN across the row; by its definition x * rsqrt(mean(x^2) + eps), which
    CPU ATen and fuser compute, the row's finite elements are 0 and its infinities NaN.
    The checker judges by the definition; this pins fuser's answer."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        w = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.rms_norm(fd.ops.neg(x), weight=w, eps=1e-6))

    fd = define(build_fn)
    x = randn(3, 511, dtype=F16)
    x[1, 7] = math.inf
    x[1, 300] = -math.inf
    w = randn(511, dtype=F16, seed=1)
    assert_agrees(fd, [x, w])
    (y,) = fd.execute([x, w])
    assert y[1, [7, 300]].isnan().all()
    finite = torch.ones(511, dtype=torch.bool, device=y.device)
    finite[[7, 300]] = False
    assert (y[1, finite] == 0).all() and y[[0, 2]].isfinite().all()


# -- GPU soak, seed 16 (benchmarks/results/h100-2026-11-22-fuzz-seed15-16) ------------------
def _sin_of_exp(fd: FusionDefinition) -> None:
    fd.add_output(fd.ops.sin(fd.ops.exp(fd.define_tensor([-1, -1], F32))))


def test_sin_of_an_approximate_exp() -> None:
    """Soak seed 16: the GPU's exp(5.7796) is 3 ulps below torch's 323.63718, and sin
    there moves 3e-5 an ulp: -0.053017 against eager's -0.053108. The perturbed runs
    moved exp up and then sin's result up by as much as its argument's move, which
    cancel where sin decreases; sin and cos now take their argument moved instead."""
    fd = define(_sin_of_exp)
    x = randn(4, 9)
    x[2, 5] = 5.779623031616211
    eager = fd.reference([x])[0]
    assert abs(eager[2, 5].item() - -0.053108197) < 1e-6
    got = eager.clone()
    got[2, 5] = -0.053016774  # sin of the float32 three below exp's
    assert not judge(fd, [x], [got])
    got[2, 5] = -0.055  # 60 ulps of the argument: not an approximate exp
    assert "out of tolerance" in "".join(judge(fd, [x], [got]))


def test_inf_where_float64_overflows_the_output() -> None:
    """Soak seed 16: a float32 pow at 3.409e38 in float64, past float32's largest value:
    fuser's more accurate row sum gave inf, eager's 3.08e38. The float64 evaluation is
    judged as the output dtype holds it (inf), so fuser's inf is right; an inf where
    float64 stays inside float32's range is still wrong."""
    eager = torch.tensor([3.0776e38, 1.0])
    ref64 = torch.tensor([3.4091e38, 1.0], dtype=torch.float64)
    got = torch.tensor([math.inf, 1.0])
    assert compare_output(0, got, eager, ref64, [ref64], 1) is None
    inside = torch.tensor([3.30e38, 1.0], dtype=torch.float64)
    assert "inf differs" in (compare_output(0, got, eager, inside, [inside], 1) or "")


# the soak's case (batch seed 17500013); `make_input` draws its data, infinities and NaNs
def _cancelled_gelu_compared(fd: FusionDefinition) -> None:
    t0 = fd.define_tensor(shape=[-1, -1], dtype=F32)
    t1 = fd.ops.gelu(t0, approximate="none")
    t2 = fd.ops.le(t1, t0)
    t3 = fd.ops.where(t2, t0, t1)
    t4 = fd.ops.cast(t3, dtype=BF16)
    t5 = fd.define_tensor(shape=[1, 31], dtype=F32)
    t6 = fd.ops.abs(t1)
    t7 = fd.define_scalar(0.01, dtype=F32)
    t8 = fd.ops.add(t6, t7)
    t9 = fd.ops.broadcast_in_dim(t5, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t10 = fd.ops.broadcast_in_dim(t8, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t11 = fd.ops.div(t9, t10)
    t12 = fd.define_tensor(shape=[1, -1], dtype=BF16)
    t13 = fd.ops.abs(t4)
    t14 = fd.define_scalar(1.0, dtype=F32)
    t15 = fd.ops.add(t13, t14)
    t16 = fd.ops.broadcast_in_dim(t12, shape=[t0.shape[0], t12.shape[1]], broadcast_dims=[0, 1])
    t17 = fd.ops.broadcast_in_dim(t15, shape=[t0.shape[0], t12.shape[1]], broadcast_dims=[0, 1])
    t18 = fd.ops.div(t16, t17)
    t19 = fd.ops.rms_norm(t4, eps=1e-06)
    t20 = fd.define_scalar(0.0, dtype=F32)
    fd.ops.minimum(t20, t13)  # unused, as in the soak's case
    t22 = fd.ops.ge(t6, t19)
    t23 = fd.ops.where(t22, t0, t4)
    t24 = fd.ops.broadcast_in_dim(t23, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t25 = fd.ops.add(t24, t11)
    t26 = fd.ops.max(t3, dims=[1], keepdim=False)
    t27 = fd.ops.broadcast_in_dim(t26, shape=[t0.shape[0], t0.shape[1]], broadcast_dims=[0])
    t28 = fd.ops.abs(t27)
    t29 = fd.define_scalar(1.0, dtype=F32)
    t30 = fd.ops.add(t28, t29)
    t31 = fd.ops.rsqrt(t30)
    t32 = fd.ops.mul(t3, t31)
    t33 = fd.ops.lt(t1, t23)
    t34 = fd.ops.where(t33, t32, t8)
    t35 = fd.ops.broadcast_in_dim(t18, shape=[t0.shape[0], t0.shape[1]], broadcast_dims=[0, 1])
    t36 = fd.ops.sub(t34, t35)
    fd.add_output(t1)
    fd.add_output(t4)
    fd.add_output(t8)
    fd.add_output(t15)
    fd.add_output(t25)
    fd.add_output(t26)
    fd.add_output(t34)
    fd.add_output(t36)


@pytest.mark.nonfinite
def test_comparison_of_a_cancelled_gelu() -> None:
    """Soak seed 16: where(lt(gelu(x), bf16(gelu(x))), NaN path, ...) at x = -4.555:
    fuser's gelu is below its bf16 rounding, float64's and the perturbed runs' above it
    (1 + erf(x / sqrt2) cancels: eager's float32 gelu is 1.5% off float64, fuser's
    0.35%). A checker limit: the perturbed runs move gelu and its rounding together. The
    checker now also runs the graph with every comparison whose operands lie within their
    own spread of each other turned the other way (`flip_uncertain`)."""
    fd = define(_cancelled_gelu_compared)
    specs = [
        InputSpec((1000, 31), "float32", "contiguous", symbolic=True),
        InputSpec((1, 31), "float32", "contiguous"),
        InputSpec((1, 31), "bfloat16", "offset", symbolic=True),
    ]
    seeds = (1386366, 1386367, 1386368)
    inputs = [make_input(s, i, 3.0, "nan_inf", device=DEVICE) for s, i in zip(specs, seeds)]
    assert_agrees(fd, inputs)

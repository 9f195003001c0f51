"""The fuzzer's own machinery: cases and their repros, the comparison and its excuses,
input layouts, the generator, the CLI's report, the known-bug list, and how a worker
counts out-of-memory and a lost CUDA context."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import shutil
import warnings

import pytest
import torch
from fuzz_helpers import BF16, DEVICE, F32, INTERP, assert_agrees, define, randn
from hypothesis import given, settings

from fuser import FusionDefinition
from fuser.config import config
from fuser.errors import FuserError
from fuser.fuzz import __main__ as fuzz_cli
from fuser.fuzz.case import FuzzCase, InputSpec, Ref, Step, build, make_input, repro, with_layout
from fuser.fuzz.check import compare_output, judge, perturbed_runs
from fuser.fuzz.generator import CPU, GPU, fuzz_cases
from fuser.fuzz.known import KNOWN
from fuser.fuzz.reference import reference
from fuser.fuzz.runner import Outcome, Stats, check_case, run_batch
from fuser.runtime import cuda_backend


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


def test_cos_of_an_argument_without_phase_may_be_anything() -> None:
    """cos(exp(16.11)): exp is 9945785.53, float32 ulp 1 (a rad), so eager's cos (of the
    correctly rounded 9945786) and a GPU's or the interpreter's (of 9945785) differ by
    0.43; the perturbed runs once sampled only a spread of 0.29 there (a fuzz mismatch
    of the layout campaign). Where the argument's 16-ulp range spans half a period, any
    value in [-1, 1] is fine; at an ordinary argument a wrong value is still wrong."""
    with FusionDefinition("phase") as fd:
        fd.add_output(fd.ops.cos(fd.ops.exp(fd.define_tensor([-1], F32))))
    x = torch.tensor([16.112659454345703, 0.5, -3.0, 2.5, 1.7], dtype=F32, device=DEVICE)
    got = torch.cos(torch.exp(x))
    one_ulp_off = torch.nextafter(torch.exp(x[0]), torch.tensor(0.0, device=DEVICE))
    got[0] = torch.cos(one_ulp_off)
    assert abs(got[0].item() - math.cos(9945786.0)) > 0.4
    assert judge(fd, [x], [got]) == []
    for j in range(1, 5):
        bad = got.clone()
        bad[j] += 0.01
        assert judge(fd, [x], [bad]), j


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


# the files holding a regression test for every bug the fuzzer found
FOUND = ("test_fuzz_found_codegen", "test_fuzz_found_soak")


def test_every_known_bug_has_its_xfail() -> None:
    tests = {
        f"tests/{module}.py::{name}": fn
        for module in FOUND
        for name, fn in inspect.getmembers(importlib.import_module(module), inspect.isfunction)
        if name.startswith("test_")
    }
    assert len(tests) >= 39  # both files found (27 + 12 tests)
    for k in KNOWN:
        assert k.test in tests, k
    known = {k.test for k in KNOWN}
    for test, fn in tests.items():
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "xfail"]
        assert not marks or test in known, f"{test} is xfailed but not in fuser/fuzz/known.py"


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

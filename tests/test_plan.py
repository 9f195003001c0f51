"""KernelPlan and the backend registry: the plan carries what the renderers print, and
backends are objects found by name in one place."""

from __future__ import annotations

import dataclasses
import inspect
import random
import re
from pathlib import Path

import pytest
import torch

from fuser.backends.base import Backend
from fuser.backends.registry import BACKENDS, get_backend
from fuser.errors import FuserError
from fuser.examples import seed_layernorm_fusion
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.plan.build import make_plan, tail_vector
from fuser.plan.kernel_plan import IGNORED_BY, KernelPlan
from fuser.schedulers.spec import access_width

FUSER = Path(__file__).resolve().parent.parent / "fuser"


def meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def seed_kernel(h: int, backend: str, rows: int = 8192):
    fd = seed_layernorm_fusion()
    (k,) = fd.compile([meta(h), meta(rows, h), meta(h), meta(h), meta(h)], "h100", backend)
    return k


# a backend (or its name) compared with a string or a tuple of them, either way round;
# "cuda" alone is also a device type, so only "triton" is caught without `backend` near
BACKEND_NAME_TESTS = [
    re.compile(r"""backend\w*(\.name)?\s*(==|!=|\bin\b|\bnot in\b)\s*[("'\[{]"""),
    re.compile(r"""["'](triton|cuda)["']\s*(==|!=|\bin\b|\bnot in\b)\s*\w*backend"""),
    re.compile(r"""(==|!=)\s*["']triton["']|["']triton["']\s*(==|!=)"""),
]
# fuser/fuzz maps its --backends names to the CPU stand-ins (the emulator, the
# interpreter) by name: fuzz/case.py and fuzz/__main__.py, not yet asking the Backend
NAME_COMPARING = ("backends", "fuzz")


def test_no_backend_name_compared_outside_the_registry():
    """Issue 17 item 2: nothing outside fuser/backends compares backend names (dynamo,
    profile and runtime included)."""
    bad = []
    for path in FUSER.rglob("*.py"):
        rel = path.relative_to(FUSER.parent)
        if rel.parts[1] in NAME_COMPARING:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if _compares_backend_name(line):
                bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def _compares_backend_name(line: str) -> bool:
    line = re.sub(r"\bfor\s+[\w, ()]+?\s+in\b", "", line)  # a loop's `in`, not a test
    return any(p.search(line) for p in BACKEND_NAME_TESTS)


@pytest.mark.parametrize(
    "line",
    [
        'if kernel.backend == "triton":',
        "if backend in ('cuda', 'triton'):",
        'fast = k._fast if b.backend.name != "cuda" else None',
        'if "cuda" in backends:',
        'use = kind == "triton"',
    ],
)
def test_the_backend_name_check_sees(line: str) -> None:
    assert _compares_backend_name(line), line
    assert not _compares_backend_name("for backend in [args.backend, args.compare]:")


def test_registry_gives_objects_and_names_the_known_ones():
    for name, b in BACKENDS.items():
        assert isinstance(b, Backend) and b.name == name and get_backend(name) is b
        assert get_backend(b) is b
    with pytest.raises(FuserError, match="triton"):
        get_backend("metal")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_chosen_schedule_is_estimated_by_its_backend(backend):
    rng = random.Random(17)
    for h in rng.sample(range(96, 9000), 6):
        k = seed_kernel(h, backend)
        assert k.schedule.estimate.registers == get_backend(backend).estimate(k.plan), h


def test_models_differ_where_the_backends_do():
    """The CUDA model is not Triton's under another name (issue 17: H=5142 est 49 vs 32)."""
    k = seed_kernel(5142, "cuda")
    assert get_backend("cuda").estimate(k.plan) != get_backend("triton").estimate(k.plan)


@pytest.mark.parametrize("h", [5140, 1600, 96, 3000])
def test_plan_tail_and_guards(h):
    k = seed_kernel(h, "cuda")
    p, s = k.plan, k.schedule
    assert p.tail_vector == tail_vector(s)
    assert (p.tail_vector > 0) == (s.tail > 0)
    covered = s.persistent_batch * s.chunk + s.threads_per_row * p.tail_vector
    assert covered >= h and p.col_guard == (covered > h)
    assert ("const bool col_ok" in k.source) == p.col_guard
    assert p.row_guard == (8192 % s.rows_per_block != 0)


def test_plan_packs_are_what_the_cuda_source_uses():
    """A misaligned row stride narrows one argument's accesses: the plan says so and the
    source uses exactly that pack width."""
    fd = seed_layernorm_fusion()
    x = torch.empty(64, 1601, dtype=torch.float16, device="meta")[:, :1600]
    (k,) = fd.compile([meta(1600), x, meta(1600), meta(1600), meta(1600)], "h100", "cuda")
    a = next(a for a in k.spec.inputs if a.row_stride == 1601)
    p = k.plan.pack(a, k.plan.vector)
    assert p == access_width(k.spec, a, k.plan.vector) == 1
    assert f"{a.name}_ptr[" in k.source and f"load_pack<8>({a.name}" not in k.source


def test_persistent_passes_keep_only_what_a_later_pass_reads():
    k = seed_kernel(1600, "cuda")
    p = k.plan
    assert len(p.passes) == k.spec.rounds + 1
    for vid, d in p.kept:
        later = [q for q in p.passes if q.index > d]
        assert any(vid in {x.id for n in q.nodes for x in n.inputs} for q in later), vid
    assert all(f"{n}[BATCH" in k.source or f"{n}[" in k.source for n in _kept_names(k))


def _kept_names(k) -> list[str]:
    names = {v.id: v.name for n in k.spec.nodes for v in n.outputs}
    return [names[vid] for vid, _ in k.plan.kept]


def test_explain_shows_the_plan():
    k = seed_kernel(5140, "triton")
    text = k.explain()
    assert "plan: inner_persistent" in text and "predicates:" in text
    assert f"a tail of {k.schedule.tail}" in text


def test_outer_plan_has_workspaces_and_finalize():
    with_ws = make_plan(*_outer(8192))
    assert with_ws.finalize and len(with_ws.workspaces) == 1
    assert with_ws.workspaces[0].dtype.value == "float32"


def _outer(rows: int):
    with FusionDefinition("colsum") as fd:
        x = fd.define_tensor([-1, -1], torch.bfloat16)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, torch.float32), dims=[0]))
    (k,) = fd.compile([meta(rows, 3072, dtype=torch.bfloat16)], "h100", "triton")
    assert k.schedule.split_rows > 1
    return k.spec, k.schedule


def _colsum() -> FusionDefinition:
    with FusionDefinition("colsum") as fd:
        x = fd.define_tensor([-1, -1], torch.bfloat16)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, torch.float32), dims=[0]))
    return fd


# split and unsplit, rows exact and not, fewer rows than a block's thread rows
OUTER_SHAPES = [(8192, 3072), (4096, 1024), (256, 512), (64, 256), (7, 4096), (3, 300), (1000, 96)]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_outer_row_loop_is_the_plans(backend: str) -> None:
    """Both renderers take the plan's row_steps trips and guard rows only where row_guard
    says (Triton: a row mask; its loop pipelined row_stages deep, see
    test_outer_steps.py). Triton's step is its [rows_per_block, chunk] tile: the plan's
    row_step wherever the loop takes more than one step (it differs only where the rows
    are fewer than the CUDA block's thread rows: one step either way)."""
    for rows, cols in OUTER_SHAPES:
        (k,) = _colsum().compile([meta(rows, cols, dtype=torch.bfloat16)], "h100", backend)
        p = k.plan
        assert p.row_steps == -(-rows // (p.rows_per_block * p.split_rows)), k.schedule.short()
        assert p.row_steps == 1 or p.row_step == p.rows_per_block, k.schedule.short()
        assert ("row_ok" in k.source) == p.row_guard, (rows, cols, k.schedule.short())
        staged = f", num_stages={p.row_stages}" if p.row_stages > 1 else ""
        trips = f"range({p.row_steps}{staged}):" if backend == "triton" else f"it < {p.row_steps};"
        assert trips in k.source, (rows, cols, k.schedule.short())


@pytest.mark.parametrize("rows,cols", [(64, 256), (256, 512), (7, 4096)])
def test_outer_rows_exact_or_not_sum_right(backend: str, rows: int, cols: int) -> None:
    """Row blocks that divide the rows run with no row mask, the others with one."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    fd = _colsum()
    (got,) = fd.execute([x])
    torch.testing.assert_close(got, x.float().sum(0), atol=1e-4 * rows, rtol=1e-5)
    assert fd.kernels[0].plan.row_guard == (rows == 7)


# where each backend reads a plan: its renderer, and the runtime that compiles and launches
# what it renders (launch sizes such as num_warps are read there)
READERS = {
    "cuda": [
        "codegen/cuda",
        "backends/cuda.py",
        "runtime/cuda_backend.py",
        "runtime/cuda_emulator.py",
    ],
    "triton": [
        "codegen/triton",
        "backends/triton.py",
        "runtime/triton_backend.py",
        "runtime/kernel.py",
    ],
}


def _reads_through(cls: type) -> dict[str, set[str]]:
    """Plan property or method -> the fields it reads (`self.x`), transitively."""
    direct = {
        name: set(re.findall(r"self\.(\w+)", inspect.getsource(getattr(member, "fget", member))))
        for name, member in vars(cls).items()
        if not name.startswith("_")
        and name != "text"  # text() prints them all
        and (isinstance(member, property) or inspect.isfunction(member))
    }
    changed = True
    while changed:
        changed = False
        for reads in direct.values():
            more = set().union(*(direct.get(r, set()) for r in reads)) - reads
            if more:
                reads |= more
                changed = True
    return direct


@pytest.mark.parametrize("backend", sorted(READERS))
def test_every_plan_field_is_read_or_said_ignored(backend: str) -> None:
    """Issue 17 item 4: every field of the plan is read by both backends (directly or
    through a plan property such as `chunk` or `chunks()`), or IGNORED_BY says why one
    does not read it."""
    files = []
    for where in READERS[backend]:
        path = FUSER / where
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    source = "\n".join(p.read_text() for p in files)
    read = {f for f in re.findall(r"\.(\w+)\b", source)}
    for prop, fields in _reads_through(KernelPlan).items():
        if prop in read:
            read |= fields
    ignored = IGNORED_BY.get(backend, {})
    for f in dataclasses.fields(KernelPlan):
        if f.name in ("spec", "schedule"):  # what the plan was made from
            continue
        assert f.name in read or f.name in ignored, f"{backend} never reads plan.{f.name}"
        assert not (f.name in read and f.name in ignored), f"{backend} reads plan.{f.name}"

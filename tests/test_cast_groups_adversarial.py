"""Cast groups (fuser/dynamo/program/casts.py, fuser/runtime/cast_group.py) on what a
model or a user may hand them beyond autocast's float weight casts: casts of integer and
bool inputs, float64 narrowed to 16 bits, a cast of a cast still waiting to be launched,
sources larger than their results, and the per-call checks of a backward program."""

from __future__ import annotations

import pytest
import torch

from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.program import casts
from fuser.dynamo.program.emit import emit_program
from fuser.dynamo.program.memory import plan_memory
from fuser.dynamo.program.step import Cast, Step
from fuser.dynamo.program.steps import Names
from fuser.runtime.cast_group import CastGroup

# fuser runs CPU tensors' kernels only under the interpreter, which a GPU host does not
# use: the tests that launch kernels put their tensors on the GPU where there is one
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(config, "cast_groups", True)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_twice(fn, *args: torch.Tensor) -> tuple[FuserBackend, tuple]:
    """fn compiled strictly (a failure to build its program raises), called twice: the
    program is built at the first call and runs at the second; its results."""
    backend = FuserBackend(strict=True)
    compiled = torch.compile(fn, backend=backend)
    compiled(*args)
    return backend, compiled(*args)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_casts_of_integer_and_bool_inputs(dtype: torch.dtype) -> None:
    """Two lone casts of integer (an attention mask, token counts) or bool inputs to
    float32: the group kernel takes float pairs only, so building the program raised
    ValueError (strict) or lost the call program of the whole graph (a warning, the old
    path at every call). They stay single launches; results are eager's."""
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        a, b = torch.rand(4, 6, generator=g) > 0.5, torch.rand(6, 3, generator=g) > 0.5
    else:
        a = torch.randint(-5, 6, (4, 6), generator=g, dtype=dtype)
        b = torch.randint(-5, 6, (6, 3), generator=g, dtype=dtype)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a.float(), b.float())

    backend, got = _compiled_twice(fn, a, b)
    torch.testing.assert_close(got, fn(a, b))
    program = backend.captures[0].graphs[0].program
    assert program.fn is not None and program.calls >= 1, program.note


# float64 values that round differently straight to 16 bits than through float32 (torch
# converts a double to float first, c10's Half and BFloat16 take floats): a tie once in
# float32, above it in float64
_DOUBLE_ROUNDING = [1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-8 + 2**-30, 3.0]


@pytest.mark.parametrize("dst", [torch.float16, torch.bfloat16])
def test_group_kernel_narrows_float64_as_torch(dst: torch.dtype) -> None:
    """float64 -> float16 / bfloat16 in a group equals torch's cast (through float32),
    as the single cast's kernel does (codegen/triton/render.py's cast)."""
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.tensor(_DOUBLE_ROUNDING, dtype=torch.float64),
                   torch.randn(1500, generator=g, dtype=torch.float64)]).to(DEVICE)  # fmt: skip
    y = torch.randn(37, generator=g).to(DEVICE)
    dx = torch.empty(x.shape, dtype=dst, device=DEVICE)
    dy = torch.empty(y.shape, dtype=dst, device=DEVICE)
    group = CastGroup((x.numel(), y.numel()), ((torch.float64, dst), (torch.float32, dst)))
    group.launch([x, dx, y, dy])
    assert torch.equal(dx, x.to(dst)), (dx[:4].tolist(), x.to(dst)[:4].tolist())
    assert torch.equal(dy, y.to(dst))


def test_compiled_float64_to_half_casts_match_eager() -> None:
    """The same through torch.compile: two float64 inputs cast to float16, grouped."""
    a = torch.tensor([_DOUBLE_ROUNDING] * 2, dtype=torch.float64, device=DEVICE)
    b = torch.tensor(_DOUBLE_ROUNDING[::-1], dtype=torch.float64, device=DEVICE).repeat(4, 1)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a.to(torch.float16), b.to(torch.float16)

    backend, got = _compiled_twice(fn, a, b)
    program = backend.captures[0].graphs[0].program
    assert "casts, one launch" in program.source, program.source
    for x, y in zip(got, fn(a, b)):
        assert torch.equal(x, y), (x, y)


def _value_cast(src: str, dst: str, numel: int = 10, pair=(torch.float32, torch.bfloat16)):
    alloc = Step("alloc", (dst,), (), alloc=((numel,), (1,), pair[1], "cpu"))
    cast = Cast(src, dst, numel, pair[0], pair[1], "value")
    launch = Step("launch", (), (src, dst), f"k({src}, {dst})", device="cpu", cast=cast)
    return [alloc, launch]


def test_a_cast_of_a_pending_cast_is_not_launched_with_it() -> None:
    """c1 = cast(m), then c2 = cast(c1): c1 is waiting to be launched late, and in one
    launch c2's programs would read c1 while c1's programs write it (no order between
    the programs of a grid). c1's group is launched before c2's cast is taken."""
    mm = Step("call", ("m",), (), "m = mm()", op="aten.mm")
    steps = [mm, *_value_cast("m", "c1"), *_value_cast("c1", "c2", pair=(torch.bfloat16,) * 2)]
    out = casts.group_casts(steps, Names(set()))
    results = {"c1", "c2"}
    written: set[str] = set()
    for s in out:
        if s.kind == "launch":
            reads, writes = set(s.uses[0::2]), set(s.uses[1::2])
            # a cast result it reads was written by an earlier launch
            assert reads & results <= written, (s.code, written)
            written |= writes


def test_sunk_casts_count_the_sources_they_hold() -> None:
    """Casts of computed values run late, so their sources live until then: a group is
    limited by what it holds (float32 sources of bfloat16 results: twice the results'
    bytes), not only by the results it makes."""
    numel = casts.MAX_BYTES * 3 // 4 // 4  # float32 sources of 3/4 MAX_BYTES, results 3/8
    steps = [
        Step("call", ("m0",), (), "m0 = mm()", op="aten.mm"),
        *_value_cast("m0", "c0", numel),
        Step("call", ("m1",), (), "m1 = mm()", op="aten.mm"),
        *_value_cast("m1", "c1", numel),
    ]
    out = casts.group_casts(steps, Names(set()))
    launches = [s for s in out if s.kind == "launch"]
    assert len(launches) == 2, [s.code for s in launches]


def test_a_cast_too_large_for_any_group_is_not_sunk() -> None:
    """A cast of a computed value whose source alone is over MAX_BYTES (logits cast to
    bfloat16) joins no group, so sinking it would only hold its source across the steps
    before its reader (a 2 GiB float32 source beside whatever they allocate): it stays
    where it is."""
    numel = casts.MAX_BYTES // 4 * 2  # float32 source of twice MAX_BYTES
    mm = Step("call", ("m",), (), "m = mm()", op="aten.mm")
    other = Step("call", ("o",), (), "o = mm()", op="aten.mm")
    reader = Step("call", ("r",), ("c",), "r = c + 1", op="aten.add")
    steps = [mm, *_value_cast("m", "c", numel), other, reader]
    out = casts.group_casts(steps, Names(set()))
    assert out == steps, [s.code or s.defines for s in out]


def test_a_grouped_backward_still_checks_its_inputs_devices(monkeypatch) -> None:
    """A backward's inputs have no Dynamo guard and its launches pass pointers, so its
    program sends an input on another device the old way (emit.py). Grouping the casts
    of the backward must not drop that test where they were its only direct launches."""
    # the program binds torch's raw-stream getter when it is built (a CPU torch has none;
    # nothing here calls the program)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    dev = torch.device("cuda", 0)
    steps: list[Step] = []
    for i in range(2):
        alloc = Step("alloc", (f"c{i}",), (), alloc=((10,), (1,), torch.float32, dev))
        cast = Cast(f"p{i}", f"c{i}", 10, torch.bfloat16, torch.float32, "input")
        code = f"k{i}(p{i}.data_ptr(), c{i}.data_ptr(), stream)"
        launch = Step("launch", (), (f"p{i}", f"c{i}"), code, on_stream=True, device=dev, cast=cast)
        steps += [alloc, launch]
    names = Names({"p0", "p1"})
    grouped = casts.group_casts(steps, names)
    assert any(s.op == "cast group" for s in grouped)
    memory = plan_memory(grouped, ["p0", "p1"], ["c0", "c1"])
    emitted = emit_program(
        "bw", grouped, memory, names, ["p0", "p1"], "(c0, c1)", {"p0": 0, "p1": 0}, dev,
        lambda args: None, {"p0": (1,), "p1": (1,)}, None,
    )  # fmt: skip
    assert "p0.get_device() != 0" in emitted.source, emitted.source


def test_casts_on_the_cuda_backend_are_not_grouped(backend: str) -> None:
    """A CUDA C++ kernel's cast is launched by its own driver launcher: only Triton's
    casts are grouped (regions.py _mark_cast); on either backend the results are eager's
    (on a machine without a GPU the CUDA kernels run in the g++ emulator)."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 6, generator=g).to(DEVICE), torch.randn(6, 3, generator=g).to(DEVICE)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a.to(torch.bfloat16), b.to(torch.bfloat16))

    compiled, got = _compiled_twice(fn, a, b)
    assert torch.equal(got, fn(a, b))
    program = compiled.captures[0].graphs[0].program
    assert ("casts, one launch" in program.source) == (backend == "triton"), program.source

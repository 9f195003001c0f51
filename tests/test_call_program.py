"""The generated call program (fuser/dynamo/program/): it computes what the old path (the
FX graph with a module per region) computes, bit for bit, and what eager computes; its
memory plan frees every buffer after its last use and never frees or reuses one that a
result or a live view shares; explain shows it. Kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

import fuser
from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.program.memory import NEVER, plan_memory
from fuser.dynamo.program.step import Step
from fuser.examples.gpt2 import GPT, GPTConfig

# odd sizes: 3 x 7 tokens, 40 wide, vocabulary 67
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=40, vocab_size=67, block_size=16)
B, T = 3, 7


# fuser runs a CPU tensor's kernels only under Triton's interpreter, which a GPU host does
# not use: there these CPU models' regions run as ATen and no program inlines them
cpu_tensors = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tensors: fuser's kernels need the interpreter"
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        idx = torch.randint(0, TINY.vocab_size, (B, T + 1), generator=g)
        out.append((idx[:, :-1], idx[:, 1:]))
    return out


def _train(model: torch.nn.Module, step_fn, batches) -> tuple[list[torch.Tensor], list[dict]]:
    """Losses and every parameter's gradient, per AdamW step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        _, loss = step_fn(x, y)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return losses, grads


def _compiled_run(init: dict, program: bool, batches) -> tuple[list, list, FuserBackend]:
    model = GPT(TINY)
    model.load_state_dict(init)
    backend = FuserBackend(strict=True)
    saved = config.call_program
    config.call_program = program
    try:
        losses, grads = _train(model, torch.compile(model, backend=backend), batches)
    finally:
        config.call_program = saved
    return losses, grads, backend


@cpu_tensors
def test_tiny_gpt2_program_matches_old_path_and_eager():
    torch.manual_seed(0)
    eager = GPT(TINY)
    init = {k: v.clone() for k, v in eager.state_dict().items()}
    batches = _batches(3)

    want_losses, want_grads = _train(eager, eager, batches)
    old_losses, old_grads, _ = _compiled_run(init, False, batches)
    new_losses, new_grads, backend = _compiled_run(init, True, batches)

    graphs = backend.captures[0].graphs
    assert [g.kind for g in graphs] == ["forward", "backward"]
    for g in graphs:
        p = g.program
        assert p.fn is not None, p.note
        assert p.calls == 2 and p.declined == 0  # the first call built it
        assert p.inlined, "no region's kernels are launched by the program"
        assert any(s.kind == "view" for s in p.steps)
    # the same kernels on the same data: the same bits as the old path
    for step, (a, b) in enumerate(zip(new_losses, old_losses)):
        assert torch.equal(a, b), f"step {step}: loss {a} vs old path {b}"
    for step, (a, b) in enumerate(zip(new_grads, old_grads)):
        for name in b:
            assert torch.equal(a[name], b[name]), f"step {step}: grad of {name}"
    for step, (a, w) in enumerate(zip(new_losses, want_losses)):
        torch.testing.assert_close(a, w, atol=1e-5, rtol=1e-5, msg=f"step {step}")
    for name, w in want_grads[-1].items():
        torch.testing.assert_close(new_grads[-1][name], w, atol=1e-5, rtol=1e-4, msg=name)


@cpu_tensors
def test_program_can_be_switched_off_at_any_call():
    torch.manual_seed(1)
    x = torch.randn(5, 33)
    w = torch.randn(33)

    def f(x, w):
        return torch.softmax(x * w, dim=-1).sum(0)

    backend = FuserBackend(strict=True)
    g = torch.compile(f, backend=backend)
    want = f(x, w)
    first, second = g(x, w), g(x, w)
    program = backend.captures[0].graphs[0].program
    assert program.calls == 1
    saved = config.call_program
    config.call_program = False
    try:
        third = g(x, w)
    finally:
        config.call_program = saved
    assert program.calls == 1  # the third call took the old path
    for got in (first, second, third):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(second, third)


@cpu_tensors
def test_another_input_alignment_goes_the_old_way():
    """Kernels are specialized to pointer alignment, which Dynamo does not guard: an input
    at another offset in its storage takes the old path, which plans for it."""
    torch.manual_seed(2)
    storage = torch.randn(7 * 24 + 1)
    aligned, shifted = storage[:-1].view(7, 24), storage[1:].view(7, 24)

    def f(x):
        return torch.nn.functional.gelu(x) * 2.0

    backend = FuserBackend(strict=True)
    g = torch.compile(f, backend=backend)
    g(aligned)
    g(aligned)
    got = g(shifted)
    program = backend.captures[0].graphs[0].program
    assert "data_ptr() & 15" in program.source
    assert program.declined == 1
    torch.testing.assert_close(got, f(shifted), atol=1e-6, rtol=1e-5)
    assert len(backend.captures) == 1  # no recompile: the program itself declined


@cpu_tensors
def test_explain_shows_the_program():
    x = torch.randn(6, 10)

    def f(x):
        return torch.relu(x + 1.0).sum(-1)

    backend = FuserBackend(strict=True)
    g = torch.compile(f, backend=backend)
    g(x)
    g(x)
    text = str(fuser.explain(backend, source=True))
    program = backend.captures[0].graphs[0].program
    assert "call program" in text and "1 kernel launches" in text
    assert f"def {program.name}(args):" in text
    assert "launch_unchecked" in program.source
    brief = str(fuser.explain(backend))
    assert "call program" in brief and "def " not in brief


# -- the memory plan, on steps written by hand -------------------------------------------


def _alloc(name: str, shape=(4, 8)) -> Step:
    cpu = torch.device("cpu")
    return Step("alloc", (name,), (), alloc=(shape, (shape[1], 1), torch.float32, cpu))


def _launch(*names: str) -> Step:
    return Step("launch", (), names, f"k({', '.join(names)})")


def _view(name: str, base: str) -> Step:
    return Step("view", (name,), (base,), f"{name} = v({base})", aliases=(base,))


def _freed_at(plan, name: str) -> int:
    return next(i for i, names in plan.free_after.items() if name in names)


def test_memory_plan_frees_after_last_use_and_reuses_a_dead_buffer():
    steps = [
        _alloc("a"),  # 0
        _launch("x", "a"),  # 1: last use of x
        _alloc("b"),  # 2
        _launch("a", "b"),  # 3: last use of a
        _alloc("c"),  # 4: may take a's memory
        _launch("b", "c"),  # 5
    ]
    plan = plan_memory(steps, ["x"], ["c"])
    assert _freed_at(plan, "x") == 1
    assert plan.reuse == {4: "a"}
    assert not any("a" in names for names in plan.free_after.values())  # taken, not freed
    assert _freed_at(plan, "b") == 5
    assert not any("c" in names for names in plan.free_after.values())  # returned
    assert plan_memory(steps, ["x"], ["c"], reuse=False).reuse == {}


def test_memory_plan_never_reuses_what_a_result_or_a_live_view_shares():
    steps = [
        _alloc("a"),  # 0
        _launch("x", "a"),  # 1
        _view("va", "a"),  # 2: a view of a, returned
        _alloc("b"),  # 3
        _launch("a", "b"),  # 4: last use of the name a
        _alloc("c"),  # 5: must not take a (va is returned)
        _view("vb", "b"),  # 6: keeps b's storage alive until step 8
        _launch("c"),  # 7: last use of c
        _alloc("d"),  # 8: takes c, not b (vb still read below)
        _launch("vb", "d"),  # 9: last use of vb: b's storage dies here
        _alloc("e"),  # 10: may take b
        _launch("d", "e"),  # 11
    ]
    plan = plan_memory(steps, ["x"], ["va", "e"])
    assert plan.reuse == {8: "c", 10: "b"}
    assert _freed_at(plan, "a") == 4  # the name goes, the storage stays with va
    assert _freed_at(plan, "vb") == 9
    # inputs are never taken over, however dead
    assert "x" not in plan.reuse.values()


@cpu_tensors
def test_program_frees_every_local_it_does_not_return():
    x = torch.randn(9, 21)

    def f(x):
        y = torch.tanh(x) * x
        z = y.t().contiguous() + 1.0
        return (z.sum(0), y.amax(-1))

    backend = FuserBackend(strict=True)
    g = torch.compile(f, backend=backend)
    g(x)
    got = g(x)
    want = f(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    p = backend.captures[0].graphs[0].program
    defined = {d for s in p.steps for d in s.defines}
    freed = {n for names in p.memory.free_after.values() for n in names}
    taken = set(p.memory.reuse.values())
    returned = set(p.returned)
    assert returned and returned <= defined
    assert defined - returned <= freed | taken
    assert not (freed & returned)
    assert NEVER > len(p.steps)


@pytest.mark.parametrize("way", ["static", "triton-c", "python"])
def test_a_compiled_triton_kernel_is_launched_as_its_launcher_takes_it(way):
    """On a GPU the program calls a launcher directly (runtime/launchers.py); no GPU
    here, so a stand-in launcher records what the emitted line passes: the argument
    order of torch's static launcher (constexprs dropped, two scratch pointers added),
    of Triton's C launcher and of Triton's Python launcher."""
    from types import SimpleNamespace

    from fuser.dynamo.program.regions import _launch
    from fuser.dynamo.program.steps import Names
    from fuser.runtime.launchers import DirectLaunch

    got = []

    def record(*a):
        got.append(a)

    keep = (0, 2, 3) if way == "static" else (0, 1, 2, 3)  # argument 1 a constexpr
    launch = DirectLaunch(
        way, record, "FN", (5, 1, 1), keep, types="OOiOO", packed="META", num_warps=4, shared=64
    )
    kernel = SimpleNamespace(
        name="fx_k0",
        backend="triton",
        _fast=[launch],
        workspace_dtypes=[torch.float32],
        plan=SimpleNamespace(split_rows=2),
        spec=SimpleNamespace(cols=3, rows=11, checks=()),
    )
    builder = SimpleNamespace(names=Names({"a", "b"}))
    alloc, step = _launch(kernel, ["a", "b"], builder, torch.device("cpu"))
    assert alloc.kind == "alloc"
    assert alloc.alloc == ((6,), (1,), torch.float32, torch.device("cpu"))
    ws = alloc.defines[0]
    assert step.uses == ("a", "b", ws) and step.on_stream
    # the program passes each tensor's pointer (its data_ptr), the row count as it is
    ptrs = {
        name: SimpleNamespace(data_ptr=lambda v=v: v)
        for name, v in zip(("a", "b", ws), (10, 20, 30))
    }  # noqa: E501
    scope = dict(builder.names.globals, stream=99, **ptrs)
    exec(step.code, scope)
    want = {
        "static": ("FN", 5, 1, 1, 4, 64, "OOiOO", (10, 30, 11, None, None), 99),
        "triton-c": (5, 1, 1, 99, "FN", 0, 0, None, None, "META", None, None, None, 10, 20, 30, 11),  # noqa: E501
        "python": (5, 1, 1, 99, "FN", "META", None, None, None, 10, 20, 30, 11),
    }[way]
    assert got == [want]
    got.clear()
    launch(99, [10, 20, 30, 11])  # the kernel's own fast path (kernel.py) passes the same
    assert got == [want]


def test_a_cuda_kernel_is_launched_through_its_prepared_launcher():
    """A CUDA C++ kernel launched once on a GPU has a prepared driver launch
    (runtime/cuda_backend.py _Launcher); the program calls it with the pointers of the
    tensors, the workspaces, then the error record and flag, as launch_cuda orders them.
    Before it launched (or on CPU) the program takes the kernel's general launch."""
    from types import SimpleNamespace

    from fuser.dynamo.program.regions import _launch
    from fuser.dynamo.program.steps import Names

    got = []
    kernel = SimpleNamespace(
        name="fx_k0",
        _fast=None,
        _cuda_launchers={0: lambda pointers, stream: got.append((pointers, stream))},
        workspace_dtypes=[torch.float32],
        plan=SimpleNamespace(split_rows=2),
        spec=SimpleNamespace(cols=3, rows=11, checks=()),
    )
    builder = SimpleNamespace(names=Names({"a", "b"}))
    alloc, step = _launch(kernel, ["a", "b"], builder, torch.device("cuda", 0))
    ws = alloc.defines[0]
    assert step.on_stream and step.uses == ("a", "b", ws)
    ptrs = {n: SimpleNamespace(data_ptr=lambda v=v: v) for n, v in (("a", 1), ("b", 2), (ws, 3))}
    exec(step.code, dict(builder.names.globals, stream=7, **ptrs))
    assert got == [([1, 2, 3], 7)]
    (general,) = _launch(kernel, ["a", "b"], builder, torch.device("cuda", 1))  # not launched there
    assert "launch_unchecked" in general.code and not general.on_stream
    (cpu,) = _launch(kernel, ["a", "b"], builder, torch.device("cpu"))
    assert "launch_unchecked" in cpu.code


def _compiled_kernel(signature: dict, **meta):
    from types import SimpleNamespace

    run = SimpleNamespace(launch=lambda *a: None)
    fields = dict(num_warps=4, shared=0, num_ctas=1, global_scratch_size=0, profile_scratch_size=0)
    fields.update(launch_cooperative_grid=False, launch_pdl=False)
    return SimpleNamespace(
        src=SimpleNamespace(signature=signature),
        metadata=SimpleNamespace(**{**fields, **meta}),
        run=run,
        function=7,
        packed_metadata=(4, 1, 0),
    )


def test_the_launcher_is_chosen_per_kernel(monkeypatch):
    """Triton's C launcher where the kernel needs nothing of Triton's Python launcher
    (scratch memory, cooperative, PDL or cluster launches), torch's static launcher where
    that C entry point is missing or FUSER_LAUNCHER asks for it, else Triton's own."""
    from types import SimpleNamespace

    from fuser.config import config
    from fuser.runtime import launchers

    sig = {"x": "*bf16", "BLOCK": "constexpr", "y": "*fp32", "rows": "i32"}
    static = SimpleNamespace(_launch_kernel=lambda *a: None)
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", static, raising=False)

    def way(kernel=None, **meta):
        return launchers.direct_launch(kernel or _compiled_kernel(sig, **meta), 4, (9,)).way

    d = launchers.direct_launch(_compiled_kernel(sig), 4, (9,))
    assert (d.way, d.keep, d.grid) == ("triton-c", (0, 1, 2, 3), (9, 1, 1))
    assert way(global_scratch_size=8) == "python"
    assert way(num_ctas=2) == "python"
    assert way(launch_pdl=True) == "python"
    monkeypatch.setattr(config, "launcher", "static")
    d = launchers.direct_launch(_compiled_kernel(sig), 4, (9,))
    assert (d.way, d.keep, d.types, d.num_warps) == ("static", (0, 2, 3), "OOiOO", 4)
    odd = {**sig, "rows": "nvTmaDesc"}  # a type the static launcher cannot pass
    assert way(_compiled_kernel(odd)) == "triton-c"
    monkeypatch.setattr(config, "launcher", "python")
    assert way() == "python"
    monkeypatch.setattr(config, "launcher", "bogus")
    with pytest.raises(ValueError, match="FUSER_LAUNCHER"):
        way()
    monkeypatch.setattr(config, "launcher", "")
    no_c = _compiled_kernel(sig)
    no_c.run = SimpleNamespace()  # a Triton whose launcher has no C entry point
    assert way(no_c) == "static"
    monkeypatch.delattr(torch._C, "_StaticCudaLauncher", raising=False)
    assert way(no_c) == "python"


@cpu_tensors
def test_two_region_outputs_of_one_value_each_get_their_tensor():
    """Two layer norms of one input with their own weights: their mean and rstd are one
    value in the fused region (found by gpt-neox's parallel residual, whose program
    returned a name it never defined). Both are saved for the backward."""

    def f(x, w1, b1, w2, b2):
        h = x.shape[-1]
        a = torch.nn.functional.layer_norm(x, (h,), w1, b1)
        c = torch.nn.functional.layer_norm(x, (h,), w2, b2)
        return (a * c).sum()

    g = torch.Generator().manual_seed(3)
    args = [torch.randn(5, 24, generator=g)] + [torch.randn(24, generator=g) for _ in range(4)]
    compiled = torch.compile(f, backend=FuserBackend(strict=True), dynamic=False)
    for _ in range(3):  # the program is built after the first call, then runs
        ours = [a.detach().clone().requires_grad_() for a in args]
        ref = [a.detach().clone().requires_grad_() for a in args]
        compiled(*ours).backward()
        f(*ref).backward()
        for a, r in zip(ours, ref):
            torch.testing.assert_close(a.grad, r.grad, atol=1e-5, rtol=1e-5)

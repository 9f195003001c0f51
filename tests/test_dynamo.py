"""torch.compile(backend="fuser"): lowering of each claimed ATen op (forward and backward
against eager), fallbacks with reasons, mutation/aliasing/non-contiguous inputs, explain,
FUSER_DEBUG, recompilation, and the partitioner's convexity.

Kernels run in Triton's interpreter on CPU, so shapes are tiny; every backend here runs
with check=True (each fused region is also run op by op in ATen and compared).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import fuser
from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.backend import fuser_backend
from fuser.dynamo.partition import form_regions
from fuser.errors import ScheduleError
from fuser.frontend.fusion_definition import FusionDefinition

F32_TOL = dict(atol=2e-5, rtol=2e-5)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape: int, seed: int = 0, grad: bool = True, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype).requires_grad_(grad)


def run_both(fn: Callable, args: list, **tol) -> tuple[FuserBackend, list]:
    """fn compiled with fuser vs eager: outputs and the grads of every float input."""
    backend = FuserBackend(strict=True, check=True)
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    results = []
    for f in (fn, compiled):
        xs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out = f(*xs)
        outs = list(out) if isinstance(out, tuple) else [out]
        diff = [o for o in outs if o.requires_grad]
        if diff:
            cot = [torch.randn(o.shape, generator=_gen(7)) for o in diff]
            torch.autograd.backward(diff, cot)
        results.append((outs, [x.grad for x in xs if x.requires_grad]))
    (eo, eg), (co, cg) = results
    tol = tol or F32_TOL
    for i, (a, b) in enumerate(zip(co, eo)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, i=i: f"output {i}: {m}")
    for i, (a, b) in enumerate(zip(cg, eg)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, i=i: f"grad of input {i}: {m}")
    return backend, results


def fused_ops(backend: FuserBackend) -> set[str]:
    """The ATen ops (base names) inside fused regions, over every compiled graph."""
    ops = set()
    for c in backend.captures:
        for g in c.graphs:
            for r in g.fused:
                assert r.kernels, f"{r.name} is fused but has no kernels"
                ops |= {part.split(" x")[0].split(".")[0] for part in r.ops.split(", ")}
    return ops


def aten_segments(backend: FuserBackend) -> list[str]:
    """Parts of fused regions that fuser's segmenter left to ATen, with the reason."""
    out = []
    for c in backend.captures:
        for g in c.graphs:
            for r in g.fused:
                plan = r.fd._runtime().last
                out += [f"{r.name}: {s.reason}" for s in plan.segments if not s.fused]
    return out


# -- registration -----------------------------------------------------------------
def test_backend_is_registered():
    from torch._dynamo.backends.registry import lookup_backend

    assert "fuser" in torch._dynamo.list_backends()
    assert lookup_backend("fuser") is fuser_backend


def test_entry_point_names_the_backend():
    eps = [ep for ep in entry_points(group="torch_dynamo_backends") if ep.name == "fuser"]
    if not eps:
        pytest.skip("fuser is not pip-installed here (no entry-point metadata)")
    assert eps[0].load() is fuser_backend


# -- each claimed op, forward and backward ---------------------------------------------
def _pointwise(x, y):
    a = torch.where(x > 0.1, (x * 2 - y / 3).exp(), torch.sqrt(y.abs() + 1))
    b = torch.sigmoid(x).tanh() * torch.rsqrt(y * y + 1) - torch.clamp(x, -0.5, 0.5)
    return a + b + x.pow(2) + torch.maximum(x, y) - torch.log1p(y.abs()) * torch.erf(x)


def _reductions(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True)
    return (
        x.sum(-1),
        x.sum((0, 1)),
        x.mean(-1, keepdim=True) * var + mean,
        x.amax(-1) - x.amin(-1),
        x.sum(),
    )


def _cross_entropy(logits, target):
    return F.cross_entropy(logits, target), F.cross_entropy(logits, target, reduction="sum")


CASES = {
    "pointwise": (_pointwise, lambda: [rand(3, 7), rand(3, 7, seed=1)], {"where", "exp", "mul"}),
    "reductions": (_reductions, lambda: [rand(2, 3, 5)], {"sum", "var_mean", "amax", "amin"}),
    "layer_norm": (
        lambda x, w, b: (F.layer_norm(x, (6,), w, b), F.layer_norm(x * 2, (6,))),
        lambda: [rand(2, 3, 6), rand(6, seed=1), rand(6, seed=2)],
        {"native_layer_norm", "native_layer_norm_backward"},
    ),
    "gelu": (
        lambda x: F.gelu(x) + F.gelu(x * 3, approximate="tanh"),
        lambda: [rand(4, 9)],
        {"gelu", "gelu_backward"},
    ),
    "softmax": (
        lambda x: (torch.softmax(x, -1), torch.log_softmax(x * 2, -1)),
        lambda: [rand(3, 11)],
        # log_softmax is decomposed (the backward recomputes it): amax, exp, sum, log
        {"_softmax", "_softmax_backward_data", "amax", "exp", "log"},
    ),
    "cross_entropy": (
        _cross_entropy,
        lambda: [rand(6, 10), torch.tensor([1, 9, -100, 0, 4, -100])],
        # one kernel for loss and gradient (fuser/dynamo/ce_op.py); the old path is below
        {"fuser"},
    ),
    "compare_and_mask": (
        lambda x, y: (
            x.masked_fill(x < -0.2, 0.5) * (y >= 0.3) + ((x != y) & (x <= 1.0)).float(),
            torch.where(x.isnan(), 0.0, x) / y.clamp_min(0.5),
        ),
        lambda: [rand(5, 4), rand(5, 4, seed=1)],
        {"masked_fill", "lt", "ge", "where"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_eager(name):
    fn, make, expected = CASES[name]
    backend, _ = run_both(fn, make())
    got = fused_ops(backend)
    missing = expected - got
    assert not missing, f"{name}: {sorted(missing)} not fused; fused: {sorted(got)}"
    assert not aten_segments(backend), aten_segments(backend)
    kinds = {g.kind for c in backend.captures for g in c.graphs}
    assert kinds == {"forward", "backward"}, kinds


def test_half_casts_round_like_eager():
    def f(x):
        h = (x.half() * 3).float()  # fp16 rounding in the middle, as ATen does
        return (h + 1).half(), h.sum(-1)

    backend, _ = run_both(f, [rand(4, 8, grad=False)], atol=1e-3, rtol=1e-3)
    assert "_to_copy" in fused_ops(backend)


# -- fallbacks and their reasons -----------------------------------------------------
def _reasons(backend: FuserBackend) -> dict[str, str]:
    return {f.op: f.reason for c in backend.captures for g in c.graphs for f in g.fallbacks}


def test_fallbacks_are_reported_with_reasons():
    def f(x, w, idx, logits, target, cw):
        h = (x @ w).relu()
        return h[idx].cumsum(0), h.t().exp(), F.cross_entropy(logits, target, weight=cw)

    args = [rand(4, 5), rand(5, 3, seed=1), torch.tensor([2, 0]), rand(3, 4, seed=2)]
    args += [torch.tensor([0, 3, 1]), torch.rand(4, generator=_gen(3))]
    backend, _ = run_both(f, args)
    reasons = _reasons(backend)
    assert "matmul" in reasons["aten.mm"]
    assert "indexing" in reasons["aten.index.Tensor"]
    assert "no fuser lowering for aten.cumsum" in reasons["aten.cumsum"]
    assert "transpose" in reasons["aten.t"]
    assert reasons["aten.nll_loss_forward"] == "nll_loss with class weights"
    text = fuser.explain(backend)
    assert "aten.mm" in text and "nll_loss with class weights" in text


def test_region_that_cannot_be_planned_falls_back_visibly(monkeypatch):
    def refuse(self, inputs, device=None, backend=None):
        raise ScheduleError("vector 8 does not divide 5 (forced by the test)")

    monkeypatch.setattr(FusionDefinition, "compile", refuse)
    backend = FuserBackend(strict=False)
    f = torch.compile(lambda x: (x * 2).exp().sum(-1), backend=backend, dynamic=False)
    x = rand(3, 5, grad=False)
    torch.testing.assert_close(f(x), (x * 2).exp().sum(-1))
    (region,) = backend.captures[0].graphs[0].regions
    assert not region.fused and "vector 8 does not divide 5" in region.fallback
    assert "runs as ATen ops: ScheduleError" in fuser.explain(backend)


def test_run_time_failure_falls_back_with_a_warning(monkeypatch):
    def broken(self, inputs, backend=None):
        raise fuser.FuserError("forced failure")

    backend = FuserBackend(strict=False)
    f = torch.compile(lambda x: torch.tanh(x) * 3, backend=backend, dynamic=False)
    x = rand(2, 6, grad=False)
    monkeypatch.setattr(FusionDefinition, "execute", broken)
    with pytest.warns(UserWarning, match="runs as ATen ops from now on"):
        out = f(x)
    torch.testing.assert_close(out, torch.tanh(x) * 3)
    (region,) = backend.captures[0].graphs[0].regions
    assert "at run time: FuserError: forced failure" in region.fallback
    torch.testing.assert_close(f(x), torch.tanh(x) * 3)  # stays on ATen, no second warning


# -- mutation, aliasing, layouts -----------------------------------------------------
def test_in_place_op_on_an_input():
    def f(x, y):
        x.mul_(2)
        y.add_(x)
        return (x + y).exp()

    x, y = rand(3, 4, grad=False), rand(3, 4, seed=1, grad=False)
    xe, ye, xc, yc = x.clone(), y.clone(), x.clone(), y.clone()
    want = f(xe, ye)
    got = torch.compile(f, backend=FuserBackend(strict=True, check=True))(xc, yc)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(xc, xe)  # the mutations of the inputs happened, in order
    torch.testing.assert_close(yc, ye)


def test_output_aliasing_an_input_and_in_place_on_intermediate():
    def f(x):
        t = x * 2
        t.add_(1)  # in place on an intermediate: functionalized
        return x.view(-1), t.sigmoid(), x.unsqueeze(0)

    x = rand(3, 4, grad=False)
    flat, s, u = torch.compile(f, backend=FuserBackend(strict=True, check=True))(x)
    assert flat.data_ptr() == x.data_ptr() and u.data_ptr() == x.data_ptr()  # still views
    torch.testing.assert_close(s, (x * 2 + 1).sigmoid())
    x.add_(1)
    torch.testing.assert_close(flat, x.view(-1))


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous_inputs(layout):
    def f(x, p):
        y = (x + p).exp()  # p broadcasts over part of the rows of x
        return y.sum(0) * 2, y.sum(-1), F.layer_norm(x, (4,))

    if layout == "transposed":
        x = torch.randn(5, 3, 4, generator=_gen(0)).transpose(0, 1)
    else:
        x = torch.randn(3, 5, 8, generator=_gen(0))[:, :, ::2]
    assert not x.is_contiguous()
    backend, _ = run_both(f, [x.requires_grad_(), rand(5, 4, seed=1)])
    assert {"add", "exp", "native_layer_norm"} <= fused_ops(backend)


def test_random_ops_keep_their_order():
    def f(x):
        a = F.dropout(x.exp(), 0.5, training=True)
        b = F.dropout(x * 3, 0.5, training=True)
        return a + b.sin()

    x = rand(4, 6, grad=False)
    torch.manual_seed(123)
    want = f(x)
    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    torch.manual_seed(123)
    got = compiled(x)
    torch.testing.assert_close(got, want)
    assert "random op" in _reasons(backend)["aten.native_dropout"]


# -- inspection ------------------------------------------------------------------------
def _block(x, w, b):
    h = F.layer_norm(x, (8,), w, b)
    return x + F.gelu(h * 2, approximate="tanh")


def test_trace_and_explain():
    x, w, b = rand(2, 3, 8), rand(8, seed=1), rand(8, seed=2)
    t = fuser.trace(_block, x, w, b, strict=True)
    assert [g.kind for g in t.graphs] == ["forward", "backward"]
    assert t.kernels and all(k.source for k in t.kernels)
    assert not [f for f in t.fallbacks if "layer_norm" in f.op or "gelu" in f.op]
    assert x.grad is None and w.grad is None  # trace does not touch .grad
    torch.testing.assert_close(t.outputs, _block(x, w, b))
    text = t.explain()
    for part in ("forward graph", "backward graph", "region", "kernel", "schedule:"):
        assert part in text, part
    assert "@triton.jit" in t.explain(source=True)
    assert "@triton.jit" not in text


def test_explain_a_compiled_module():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(8)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return x + F.gelu(self.fc(self.ln(x)))

    model = Block()
    compiled = torch.compile(model, backend="fuser")
    assert "nothing compiled" in fuser.explain(compiled)
    with torch.no_grad():
        compiled(rand(3, 8, grad=False))
    text = fuser.explain(compiled)
    assert "inference graph" in text and "native_layer_norm" in text and "aten.addmm" in text


def test_explain_finds_models_compiled_by_name():
    """backend="fuser" (the string): explain finds a compiled nn.Sequential's regions
    through the compiled module or the module itself (Dynamo's frame for it is torch's
    wrapper, not the model's forward), and not another model's."""

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))

    a, b = model(), model()
    ca, cb = torch.compile(a, backend="fuser"), torch.compile(b, backend="fuser")
    ca(rand(4, 8, grad=False)).sum().backward()
    for obj in (ca, a):
        text = fuser.explain(obj)
        assert "forward graph" in text and "backward graph" in text, text
        assert "native_layer_norm" in text and "gelu" in text, text
    assert "nothing compiled" in fuser.explain(cb)
    with torch.no_grad():
        cb(rand(4, 8, grad=False))
    text = fuser.explain(b)
    assert "-- inference" in text and "forward graph" not in text, text
    assert "-- inference" not in fuser.explain(a)


def test_explain_finds_functions_compiled_by_name():
    def f(x):
        return torch.softmax(x * 2, -1)

    compiled = torch.compile(f, backend="fuser")
    compiled(rand(3, 5, grad=False))
    for obj in (compiled, f):
        text = fuser.explain(obj)
        assert "1 fused regions" in text and "_softmax" in text, text


def test_every_explain_returns_its_report_and_prints_nothing(capsys):
    """One convention: explain() returns the report, a str whose repr is the text (a REPL
    shows it once, laid out), and prints nothing."""
    x = rand(3, 8, grad=False)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], torch.float32), -1))
    fd.execute([x])
    f = torch.compile(lambda x: torch.tanh(x) * 2, backend="fuser")
    f(x)
    t = fuser.trace(lambda x: torch.sigmoid(x) + 1, x)
    reports = [
        fd.explain(),
        fuser.explain(fd),
        fd.kernels[0].explain(),
        fd.kernels[0].schedule.explain(),
        fuser.explain(f),
        fuser.explain(f, brief=True),
        t.explain(),
        fuser.explain(t, source=True),
    ]
    assert capsys.readouterr().out == ""
    for text in reports:
        assert isinstance(text, str) and "\n" in text
        assert repr(text) == str(text)
    assert "schedule:" in reports[0] and "@triton.jit" in reports[-1]


def test_fuser_debug_prints_while_running(monkeypatch, capsys):
    monkeypatch.setattr(config, "debug", 2)
    f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend=FuserBackend(strict=True))
    f(rand(2, 5, grad=False))
    out = capsys.readouterr().out
    assert "[fuser.dynamo] inference graph" in out and "fused regions" in out
    assert "kernel" in out and "schedule:" in out


# -- recompilation -----------------------------------------------------------------------
def test_new_batch_size_recompiles_visibly():
    backend = FuserBackend(strict=True, check=True)
    f = torch.compile(lambda x: F.gelu(x).sum(-1), backend=backend, dynamic=False)
    for rows in (2, 3, 3):
        x = rand(rows, 5, grad=False)
        torch.testing.assert_close(f(x), F.gelu(x).sum(-1))
    assert [c.recompile for c in backend.captures] == [False, True]
    assert "1 recompile(s)" in fuser.explain(backend)


def test_dynamic_shapes_are_specialized_per_size():
    def f(x, w):
        return torch.softmax(F.layer_norm(x, (5,), w) * 2, -1)

    backend = FuserBackend(strict=True, check=True)
    compiled = torch.compile(f, backend=backend)  # automatic dynamic: sizes turn symbolic
    w = rand(5, seed=9)
    for rows in (2, 3, 4):
        x = rand(rows, 5, seed=rows)
        got, want = compiled(x, w), f(x, w)
        torch.testing.assert_close(got, want)
        cot = torch.randn(rows, 5, generator=_gen(rows))
        gx, gw = torch.autograd.grad(got, (x, w), cot)
        ex, ew = torch.autograd.grad(want, (x, w), cot)
        torch.testing.assert_close((gx, gw), (ex, ew))
    kinds = [g.kind for c in backend.captures for g in c.graphs]
    assert kinds[:2] == ["forward", "backward"] and len(kinds) == 6, kinds
    assert all("specialized for sizes" in k for k in kinds[2:]), kinds
    assert all(g.fused for c in backend.captures for g in c.graphs)


def test_a_mean_loss_of_a_new_batch_size():
    """F.mse_loss, mean: its backward divides by the element count, scalars made from the
    sizes. Once the run-time specialization makes the sizes constants those are a region
    without a tensor input, which the executor had no kernel for (found by
    fuser.fuzz.programs, a batch one larger); it stays ATen's."""

    def f(x, w):
        y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
        return F.mse_loss(y, torch.sigmoid(x))

    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend)
    w = rand(7, seed=3)
    for rows in (4, 4, 5):
        x = rand(rows, 7, seed=rows)
        got, want = compiled(x, w), f(x, w)
        torch.testing.assert_close(got, want)
        gx, gw = torch.autograd.grad(got, (x, w))
        ex, ew = torch.autograd.grad(want, (x, w))
        torch.testing.assert_close((gx, gw), (ex, ew))
    kinds = [g.kind for c in backend.captures for g in c.graphs]
    assert any("specialized for sizes" in k for k in kinds), kinds


# -- the partitioner ------------------------------------------------------------------
def test_regions_stay_convex():
    """a = exp(x); b = mm(a, w); c = a + b: c must not join a's region (a cycle through
    the matmul), but d = a * 2 may."""

    def f(x, w):
        a = torch.exp(x)
        b = torch.mm(a, w)
        return a + b, a * 2

    gm = fx.symbolic_trace(f)
    fusible = {n for n in gm.graph.nodes if n.op == "call_function" and n.target != torch.mm}
    regions = form_regions(gm.graph, fusible.__contains__, lambda n: False)
    names = [[n.name for n in r] for r in regions]
    assert names == [["exp", "mul"], ["add"]], names


def test_side_effects_are_never_reordered_across_a_region():
    """A region's two halves straddle a chain of side effects: it must be split."""
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.exp, (x,))
    s1 = g.call_function(torch.Tensor.add_, (a, 1.0))  # mutation reads a
    s2 = g.call_function(torch.rand, ((3,),))  # RNG after it
    c = g.call_function(torch.add, (a, s2))  # would join a's region without the chain
    g.output((s1, c))
    effects = {s1, s2}
    regions = form_regions(g, lambda n: n in (a, c), effects.__contains__)
    assert [[n.name for n in r] for r in regions] == [["exp"], ["add"]]


def test_outputs_keep_eager_strides():
    def f(x):
        return (x.t() * 2).exp()  # eager keeps the transposed layout

    x = rand(3, 5, grad=False)
    backend = FuserBackend(strict=True, check=True)
    got = torch.compile(f, backend=backend, dynamic=False)(x)
    want = f(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride() == (1, 5)
    (region,) = backend.captures[0].graphs[0].regions
    # the kernel writes the transposed layout itself (fd.output_strides): no copy after it
    assert not region.restrided and region.fd.output_strides == {0: (1, 5)}
    (out,) = region.fd.kernels[0].spec.outputs
    assert (out.row_stride, out.col_stride) == (1, 5)


def test_check_mode_reports_a_wrong_lowering(monkeypatch):
    from fuser.dynamo.context import LOWERINGS

    aten = torch.ops.aten

    def wrong_exp(ctx, node):  # exp2 instead of exp: a lowering bug check mode must catch
        return ctx.finish(node, [ctx.ops.exp2(ctx.tensor(node.args[0]))])

    monkeypatch.setitem(LOWERINGS, aten.exp.default, wrong_exp)
    backend = FuserBackend(check=True)
    f = torch.compile(lambda x: x.exp() + 1, backend=backend, dynamic=False)
    x = rand(2, 3, grad=False)
    with pytest.warns(UserWarning, match="fuser check: .* differs from ATen"):
        out = f(x)
    torch.testing.assert_close(out, x.exp() + 1)  # the ATen result is the one returned
    (region,) = backend.captures[0].graphs[0].regions
    assert region.mismatches
    assert "CHECK FAILED" in fuser.explain(backend)


def test_backend_name_works_without_importing_fuser_first():
    """The entry point registers "fuser" on lookup and imports fuser after Dynamo imported
    Triton (and with it triton.language's jit functions, in compiled mode: no
    TRITON_INTERPRET is set). The regions still fuse and run, on CPU in the interpreter
    (reductions included: tl.sum, tl.max), as when fuser is imported first; importing
    fuser afterwards must not register the backend twice."""
    import os
    import subprocess
    import sys

    if not [ep for ep in entry_points(group="torch_dynamo_backends") if ep.name == "fuser"]:
        pytest.skip("fuser is not pip-installed here (no entry-point metadata)")
    script = (
        "import sys, torch, triton\n"
        "assert 'fuser' in torch._dynamo.list_backends()\n"
        "assert 'fuser' not in sys.modules\n"
        "def g(x):\n"
        "    return torch.softmax(torch.tanh(x) * 2, -1), x.amax(-1)\n"
        "f = torch.compile(g, backend='fuser')\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "x = torch.randn(3, 5, device=device)\n"
        "torch.testing.assert_close(f(x), g(x))\n"
        "import fuser\n"
        "text = fuser.explain(f)\n"
        "assert '2 fused regions' in text and 'ATen calls (0)' in text, text\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_cpu_tensors_in_a_gpu_process_fall_back_with_a_warning(monkeypatch):
    """Where fuser compiles Triton for a GPU, CPU tensors cannot run: the graph stays ATen,
    with a warning that says why (not only a line in explain)."""
    import fuser.dynamo.context as context

    monkeypatch.setattr(context, "use_interpreter", lambda: False)  # as with a GPU
    backend = FuserBackend()
    f = torch.compile(lambda x: torch.tanh(x) * 2, backend=backend, dynamic=False)
    x = rand(3, 4, grad=False)
    with pytest.warns(UserWarning, match="this one has a GPU"):
        torch.testing.assert_close(f(x), torch.tanh(x) * 2)
    assert "0 fused regions" in fuser.explain(backend)


def test_row_views_do_not_split_regions():
    """view -> elementwise -> view back, and a sum over the rows of a view, fuse with
    their neighbours (views.py moves the views out of the way)."""

    def f(a, b, x):
        h = torch.tanh(a.view(2, 3, 8) * b.view(2, 3, 8))  # a, b: [6, 8]
        z = h.view(6, 8)
        return z.sum(0), z * 2, (x.exp() + 1).view(6, 8).sum(0, keepdim=True)

    args = [rand(6, 8), rand(6, 8, seed=1), rand(2, 3, 8, seed=2)]
    backend, _ = run_both(f, args)
    forward = backend.captures[0].graphs[0]
    assert forward.views_moved >= 2
    assert len(forward.fused) == 2, [r.ops for r in forward.fused]
    others = [fb for fb in forward.fallbacks if fb.op not in ("aten.reshape", "aten.detach")]
    assert not others, others


@pytest.mark.parametrize("rows", [(2, 5), (3, 1), (1, 2, 3)])
def test_row_views_do_not_split_a_written_out_rms_norm(rows):
    """transformers' RMSNorm (pow, mean over the last dim kept, rsqrt) after a linear and a
    residual add, with its weight: the mean of a row view split the forward in two
    regions (the squares written and read back), and the saved [B, T, C] activations
    split the backward in three. One region for the forward now, one for dx."""

    def f(x, r, w1, g, w2):
        h = r + torch.nn.functional.linear(x, w1)
        var = h.pow(2).mean(-1, keepdim=True)
        return torch.nn.functional.linear(g * (h * torch.rsqrt(var + 1e-6)), w2), h

    c = 24
    args = [rand(*rows, 16), rand(*rows, c, seed=1), rand(c, 16, seed=2), rand(c, seed=3)]
    args.append(rand(8, c, seed=4))
    backend, _ = run_both(f, args)
    forward, backward = backend.captures[0].graphs
    norm = [r for r in forward.fused if "mean" in r.ops]
    assert len(norm) == 1 and "pow" in norm[0].ops and "add" in norm[0].ops, [
        r.ops for r in forward.fused
    ]
    assert not [r for r in forward.fused if "pow" in r.ops and "mean" not in r.ops]
    # dx in one region: the row sum, the rsqrt's powers, the broadcast back; the weight's
    # column sum reads other operands (here the mm's result, not a cast of it as under
    # autocast, where it joins the same inner-outer kernel) and may have its own
    dx = [r for r in backward.fused if "pow" in r.ops]
    assert len(dx) == 1 and all(op in dx[0].ops for op in ("sum", "expand", "div")), [
        r.ops for r in backward.fused
    ]
    assert len(backward.fused) <= 2, [r.ops for r in backward.fused]


def test_row_views_do_not_split_a_written_out_gelu():
    """transformers' NewGELU (0.5 x (1 + tanh(c (x + 0.044715 x^3)))) between two linears of
    a [B, T, C] input: its backward was split at every row view into five kernels (pow,
    rsub, alias and mul.Scalar were not known as elementwise). One region a pass now."""

    def f(x, w1, b1, w2):
        h = torch.nn.functional.linear(x, w1, b1)
        g = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))
        return torch.nn.functional.linear(g, w2)

    args = [rand(2, 5, 8), rand(24, 8, seed=1), rand(24, seed=2), rand(8, 24, seed=3)]
    backend, _ = run_both(f, args)
    for graph in backend.captures[0].graphs:
        tanh = [r.ops for r in graph.fused if "tanh" in r.ops or "pow" in r.ops]
        assert len(tanh) == 1, (graph.kind, [r.ops for r in graph.fused])


def test_a_lowering_crash_leaves_the_graph_to_aten(monkeypatch):
    import fuser.dynamo.lower as lower

    def crash(*args, **kwargs):
        raise RuntimeError("partitioner bug (forced by the test)")

    monkeypatch.setattr(lower, "form_regions", crash)
    backend = FuserBackend()
    f = torch.compile(lambda x: torch.sigmoid(x) * x, backend=backend, dynamic=False)
    x = rand(3, 4, grad=False)
    with pytest.warns(UserWarning, match="runs as ATen ops: RuntimeError: partitioner bug"):
        torch.testing.assert_close(f(x), torch.sigmoid(x) * x)
    assert "LOWERING FAILED" in fuser.explain(backend)
    with pytest.raises(Exception, match="partitioner bug"):
        torch.compile(lambda x: x.cos() + 1, backend=FuserBackend(strict=True))(x)


# -- found by python -m fuser.opdb (PyTorch's op_db samples) --------------------------
def test_logical_ops_take_floats_as_nonzero():
    # the lowering handed float operands to and/or (Triton: invalid operands float32)
    def f(x, y):
        return torch.logical_and(x, y), torch.logical_or(x, y * 0)

    x = torch.tensor([[0.0, 1.5, float("nan"), -2.0]])
    y = torch.tensor([[3.0, 0.0, 1.0, float("nan")]])
    backend, _ = run_both(f, [x, y])
    assert {"logical_and", "logical_or"} <= fused_ops(backend)


def test_clamp_with_tensor_bounds():
    def f(x, lo, hi):
        return torch.clamp(x, lo, hi), torch.clamp_min(x, lo), torch.clamp_max(x, hi) * 2

    args = [rand(4, 6), rand(4, 6, seed=1) - 0.5, rand(6, seed=2) + 0.5]
    backend, _ = run_both(f, args)
    assert {"clamp", "clamp_min", "clamp_max"} <= fused_ops(backend)


def test_reductions_and_softmax_of_a_0d_tensor():
    # mean(x, dim=0) of a 0-d x raised IndexError in the lowering; the softmax backward
    # took dim % 0
    def f(x):
        return x.mean(0, keepdim=True) * 2, torch.softmax(x, 0), torch.log_softmax(x * 3, -1)

    backend, _ = run_both(f, [torch.tensor(0.7, requires_grad=True)])
    assert {"mean", "_softmax_backward_data", "exp", "log"} <= fused_ops(backend)


def test_empty_tensors_stay_aten_with_a_reason():
    # fuser's ATen evaluation of an empty softmax raised in amax; var of nothing gave -0.0
    def f(x, y):
        return torch.softmax(x, -1) * 2, torch.var(y)

    backend = FuserBackend(strict=True)
    args = [torch.randn(5, 0, 0), torch.randn(0)]
    with pytest.warns(UserWarning, match="degrees of freedom"):
        got, want = torch.compile(f, backend=backend)(*args), f(*args)
    torch.testing.assert_close(got, want, equal_nan=True)
    reasons = _reasons(backend)
    assert "is empty: no work for a kernel" in reasons["aten._softmax"]
    assert "is empty" in reasons["aten.var.correction"]


def test_float64_softmax_and_a_cast_to_bfloat16():
    # the Triton renderer's tl.div_rn takes float32 only (softmax(dtype=float64) did not
    # compile), and the interpreter cast float64 to bf16 by copying bits (NaN grads)
    def f(x):
        return torch.log_softmax(x, 0, dtype=torch.float64), torch.softmax(x * 2, 0, torch.float64)

    backend, _ = run_both(f, [rand(7).bfloat16()], atol=1e-2, rtol=1e-2)
    assert {"_softmax", "amax", "log"} <= fused_ops(backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_addcdiv_addcmul_lerp_round_once(dtype):
    # torch's decompositions of these round every step to the half type (addcdiv in bf16
    # was 0.17 off eager); lowered directly they round once, as ATen's kernels
    def f(x, a, b, w):
        return torch.addcdiv(x, a, b), torch.addcmul(x, a, b), torch.lerp(x, a, w), x.lerp(a, 0.7)

    t = [rand(5, 8, seed=s, grad=False).to(dtype) * 4 for s in range(3)]
    w = torch.rand(5, 8, generator=_gen(3)).to(dtype)
    ulp = torch.finfo(dtype).eps  # one ulp: ATen's CPU lerp uses an FMA
    backend, _ = run_both(f, [t[0], t[1], t[2] + 9, w], atol=0, rtol=ulp)
    assert {"addcdiv", "addcmul", "lerp"} <= fused_ops(backend)


# -- what the backward keeps ----------------------------------------------------------
def _saved_by(fn: Callable, args: list) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return saved


def test_cross_entropy_backward_keeps_the_logits_not_the_log_probabilities(monkeypatch):
    """nll_loss_backward reads only the shape of the log-probabilities: fuser gives it a
    stand-in, so the backward recomputes them from the half-precision logits and two
    per-row values instead of keeping a float32 [rows, classes] tensor (GPT-2's: 3.3 GB).
    (The old path: the calls one-pass cross-entropy does not take, class weights, say.)"""
    monkeypatch.setattr(config, "one_pass_cross_entropy", False)

    def f(logits, target):
        return F.cross_entropy(logits.float(), target)

    logits = rand(6, 37).bfloat16().detach().requires_grad_()
    target = torch.tensor([1, 36, 0, -100, 5, 20])
    eager = _saved_by(f, [logits, target])
    assert ((6, 37), torch.float32) in eager  # eager keeps log_softmax's output
    backend, _ = run_both(f, [logits, target], atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=FuserBackend(strict=True))
    saved = _saved_by(compiled, [logits, target])
    assert ((6, 37), torch.float32) not in saved, saved
    assert ((6, 37), torch.bfloat16) in saved and saved.count(((6, 1), torch.float32)) == 2
    assert {"nll_loss_backward", "exp", "sum"} <= fused_ops(backend)


def test_nll_loss_backward_in_aten_gets_a_stand_in_of_the_right_shape():
    # class weights keep nll_loss in ATen; its backward runs on the expanded stand-in
    def f(x, target, w):
        return F.cross_entropy(x * 2, target, weight=w), F.nll_loss(x.log_softmax(-1), target)

    args = [rand(5, 7), torch.tensor([0, 6, 2, 2, -100]), torch.rand(7, generator=_gen(4))]
    backend, _ = run_both(f, args)
    assert _reasons(backend)["aten.nll_loss_backward"] == "nll_loss with class weights"

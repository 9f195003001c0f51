"""GEMM template calls join the graph's precompile (runtime/precompile.py): a graph
lowered with FUSER_GEMM=template lists one warm-up per template call, each warm-up hands
Triton the arguments its call's launch will (the same JIT cache key for sm_90, computed
by Triton's own binder with no GPU), and precompile runs them beside the fused kernels
and reports them in the first-step ledger. The warm-up's compile itself needs a GPU:
benchmarks/gemm_bench.py's fuser-template rows show each GEMM kernel's first-launch
origin ("warmed up")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import MockTensor, create_function_from_signature

from fuser.config import config
from fuser.dynamo.backend import FuserBackend
from fuser.dynamo.gemm_call import GemmCall, template_warmups
from fuser.runtime import gemm as gemm_runtime
from fuser.runtime import precompile, timing
from fuser.runtime.triton_backend import WARMED

SM90 = make_backend(GPUTarget("cuda", 90, 32))


class Block(torch.nn.Module):
    """Linear -> GELU -> Linear + residual (GPT-2's MLP at toy, odd sizes)."""

    def __init__(self, c: int = 29, hidden: int = 45):
        super().__init__()
        self.fc = torch.nn.Linear(c, hidden)
        self.proj = torch.nn.Linear(hidden, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(F.gelu(self.fc(x), approximate="tanh"))


@pytest.fixture(scope="module")
def records() -> list:
    """The forward and backward graphs of the block, compiled with the template."""
    saved = config.gemm
    config.gemm = "template"
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        backend = FuserBackend()
        cm = torch.compile(Block(), backend=backend)
        cm(torch.randn(3, 13, 29, requires_grad=True)).sum().backward()
        return [g for c in backend.captures for g in c.graphs]
    finally:
        config.gemm = saved
        torch._dynamo.reset()


def _calls(records: list) -> list[Any]:
    return [n for r in records for n in r.module.graph.nodes if isinstance(n.target, GemmCall)]


def test_each_template_call_has_a_warmup(records: list) -> None:
    calls = _calls(records)
    warmups = [w for r in records for w in template_warmups(r.module)]
    # fc (bias + GELU, pre-activation kept), proj (bias + residual); dX of proj with the
    # GELU backward, dX of fc plus the residual's gradient, both dW with the bias gradient
    assert len(calls) == len(warmups) == 6
    names = sorted(w.name for w in warmups)
    assert [n.split("_fp32")[0] for n in names] == [
        "gemm_bias_gelu_tanh_aux", "gemm_bias_res", "gemm_dgelu_tanh", "gemm_res",
        "gemm_rowsum", "gemm_rowsum",
    ]  # fmt: skip
    assert len({(w.source, w.key) for w in warmups}) == 6  # two dW shapes: two sources
    empty = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    assert template_warmups(empty) == []


class _KeyModule:
    """The plan's real @triton.jit kernels, but a warm-up or a launch only records the
    specialization Triton's binder makes for sm_90 (its JIT cache key's parts)."""

    def __init__(self, source: str, folder: Path, seen: list):
        path = folder / f"k{abs(hash(source))}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        self._mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self._mod)
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._mod, name)
        binder = create_function_from_signature(fn.signature, fn.params, SM90)
        seen = self._seen

        class Recorder:
            def warmup(self, *args: Any, grid: Any, **kw: Any) -> None:
                _, spec, opts = binder(*map(MockTensor.wrap_dtype, args), **kw)
                seen.append(("warm", name, grid, repr(spec), repr(opts)))

            def __getitem__(self, grid: Any) -> Any:
                def launch(*args: Any, **kw: Any) -> None:
                    _, spec, opts = binder(*args, **kw)
                    seen.append(("launch", name, grid, repr(spec), repr(opts)))

                return launch

        return Recorder()


def _real(v: Any) -> Any:
    """Random data in the fake value's size, strides and dtype."""
    if not isinstance(v, torch.Tensor):
        return v
    size = 1 + sum((s - 1) * st for s, st in zip(v.shape, v.stride()) if s > 0)
    return torch.randn(size).to(v.dtype).as_strided(v.shape, v.stride())


def test_warmup_specializes_as_the_launch(records: list, tmp_path: Path, monkeypatch) -> None:
    """Each call's warm-up and its launch with real tensors of the same layouts give
    Triton's binder the same specialization and options, kernel by kernel."""
    seen: list = []
    modules: dict[str, _KeyModule] = {}

    def load(source: str, interpret: bool) -> _KeyModule:
        return modules.setdefault(source, _KeyModule(source, tmp_path, seen))

    monkeypatch.setattr(gemm_runtime, "load_module", load)
    for node in _calls(records):
        seen.clear()
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args]
        node.target.warmup(*vals)
        node.target(*map(_real, vals))
        warm = [s[1:] for s in seen if s[0] == "warm"]
        launch = [s[1:] for s in seen if s[0] == "launch"]
        assert warm and warm == launch, (node.target, seen)


def test_precompile_runs_the_warmups_and_times_them(records: list, monkeypatch) -> None:
    """precompile on a GPU graph: the template warm-ups run in the Triton warm-up pass
    (the fused kernels' own warm-up stubbed: no GPU here), their sources are marked
    warmed, and the ledger names each."""
    ran: list[str] = []
    warmups = []
    for r in records:
        for w in template_warmups(r.module):
            warmups.append(
                precompile.TemplateWarmup(
                    w.name, w.source, lambda w=w: (ran.append(w.name), WARMED.add(w.source)), w.key
                )
            )
    ledger = timing.Ledger()
    with timing.collecting(ledger):
        results = precompile.precompile([], "cuda", n=2, templates=warmups)
    assert results == [None] * 6 and sorted(ran) == sorted(w.name for w in warmups)
    assert all(w.source in WARMED for w in warmups)
    assert sorted(k.name for k in ledger.kernels) == sorted(w.name for w in warmups)
    assert {k.origin for k in ledger.kernels} == {"warmed up (pool)"}
    assert precompile.precompile([], "cpu", templates=warmups) == []  # interpreted: nothing

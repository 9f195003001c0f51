"""The model suite's tiny configurations train with backend="fuser" as they do eagerly.

Twelve families from `transformers` (2 layers, hidden 64; fuser.suite.models), two
training steps on CPU: the loss of each step and the gradients of the first within fp32
tolerance of eager's, and fuser fused something in each (it did not stand aside).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")  # in the test extra, pinned to the GPU image's version

from fuser.suite.models import FAMILIES  # noqa: E402
from fuser.suite.run import Result, judge, train  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# T5's relative-position buckets take log(0) (eager computes -inf there too, and a where
# drops it): its data is nonfinite on purpose (tests/conftest.py)
NAMES = [pytest.param(n, marks=pytest.mark.nonfinite) if n == "t5" else n for n in sorted(FAMILIES)]


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_trains_as_eager(name: str) -> None:
    eager, eager_grads = train(name, "tiny", "eager", "cpu", steps=2, warmup=1)
    assert not eager.error, eager.error
    fused, grads = train(name, "tiny", "fuser", "cpu", steps=2, warmup=1)
    assert not fused.error, fused.error
    judge(fused, grads, eager, eager_grads)
    assert fused.parity, (fused.max_loss_diff, fused.max_grad_err, fused.grad_err_param)
    assert fused.fused_ops > 0, fused.unfused_top
    assert not fused.fell_back, fused.fell_back  # every fused region ran fused


@pytest.mark.parametrize("name", ["llama"])
def test_fuser_causes_no_graph_break(name: str) -> None:
    """Graph breaks are Dynamo's: fuser compiles the graphs and breaks that aot_eager (the
    same graphs run by ATen) gets, and the suite counts both for every implementation."""
    ref, _ = train(name, "tiny", "aot_eager", "cpu", steps=1, warmup=0)
    fused, _ = train(name, "tiny", "fuser", "cpu", steps=1, warmup=0)
    assert not ref.error and not fused.error, (ref.error, fused.error)
    assert ref.graphs >= 1
    assert (fused.graphs, fused.graph_breaks) == (ref.graphs, ref.graph_breaks)


def test_judge_sees_a_wrong_gradient_and_a_wrong_loss() -> None:
    g = torch.Generator().manual_seed(0)
    want = {"w": torch.randn(8, 8, generator=g), "tiny": torch.randn(4, generator=g) * 1e-12}
    eager = Result("m", "tiny", "eager", "cpu", losses=[2.0, 1.5])

    def judged(grads: dict, losses: list[float]) -> Result:
        r = Result("m", "tiny", "fuser", "cpu", losses=losses)
        judge(r, grads, eager, want)
        return r

    assert judged(dict(want), [2.0, 1.5]).parity
    # rounding noise on a gradient that is zero in exact arithmetic is not an error
    noisy = dict(want, tiny=want["tiny"] * -3)
    assert judged(noisy, [2.0, 1.5]).parity
    wrong = dict(want, w=want["w"] * 1.01)
    assert not judged(wrong, [2.0, 1.5]).parity
    assert judged(wrong, [2.0, 1.5]).grad_err_param == "w"
    assert not judged(dict(want), [2.0, 1.6]).parity
    assert not judged({"w": want["w"]}, [2.0, 1.5]).parity  # a gradient missing


def test_judge_against_an_fp32_reference() -> None:
    """On a GPU eager runs under bf16 autocast: a gradient that is bf16 noise for eager too
    passes if fuser's error against the fp32 step is within twice eager's own; a larger
    one fails, however close the tolerance would call it."""
    g = torch.Generator().manual_seed(1)
    ref_grads = {"w": torch.randn(64, generator=g), "b": torch.randn(64, generator=g)}
    reference = Result("m", "full", "eager", "cuda", losses=[3.0, 2.5])
    noise = torch.randn(64, generator=g)
    eager_grads = {"w": ref_grads["w"] + 0.2 * noise, "b": ref_grads["b"]}  # 20% off, as bf16
    eager = Result("m", "full", "eager", "cuda", losses=[3.001, 2.502])

    def judged(grads: dict, losses: list[float]) -> Result:
        r = Result("m", "full", "fuser", "cuda", losses=losses)
        judge(r, grads, eager, eager_grads, reference, ref_grads)
        return r

    other_noise = torch.randn(64, generator=g)
    similar = {"w": ref_grads["w"] + 0.2 * other_noise, "b": ref_grads["b"]}
    assert judged(similar, [3.002, 2.503]).parity  # ~0.28 off eager, as far as eager is
    assert not judged(similar, [3.002, 2.503]).max_grad_err < 0.08  # the plain rule fails it
    far = {"w": ref_grads["w"] + 0.6 * other_noise, "b": ref_grads["b"]}
    assert not judged(far, [3.002, 2.503]).parity  # three times eager's noise
    wrong_b = dict(similar, b=ref_grads["b"] * 1.05)  # exact for eager: 5% is an error
    assert not judged(wrong_b, [3.002, 2.503]).parity
    assert not judged(similar, [3.05, 2.503]).parity  # a loss 0.05 off, eager's 0.002
    # bf16 eager exact at one step by chance: that step is held to eager's noise elsewhere
    lucky = Result("m", "full", "eager", "cuda", losses=[3.0, 2.52])
    r = Result("m", "full", "fuser", "cuda", losses=[3.01, 2.51])
    judge(r, similar, lucky, eager_grads, reference, ref_grads)
    assert r.parity


def test_profiled_step_fills_the_result(tmp_path) -> None:
    """--profile's hook: one more step under the step profiler, its report written beside
    the table; on a CPU the profile has structure and no times (coverage NaN)."""
    from fuser.suite.profiled import profiled
    from fuser.suite.run import Result

    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters())
    compiled = torch.compile(lin, backend="fuser")
    x = torch.randn(4, 8)

    def step() -> None:
        compiled(x).relu().sum().backward()
        opt.step()
        opt.zero_grad()

    res = Result("lin", "tiny", "fuser", "cpu")
    profiled(step, res, tmp_path)
    assert set(res.gpu_ms) >= {"GEMM", "fused memory-bound"}
    assert res.gpu_coverage != res.gpu_coverage  # NaN: no GPU times
    report = (tmp_path / "lin-fuser" / "profile.txt").read_text()
    assert "fused memory-bound" in report
    assert (tmp_path / "lin-fuser" / "profile.json").exists()


def test_an_unknown_model_is_its_run_error() -> None:
    """A misspelt --models name fails its own run (res.error), not the whole suite."""
    res, grads = train("no-such-model", "tiny", "eager", "cpu", steps=1, warmup=0, batch_size=4)
    assert "unknown model" in res.error and not grads

"""The CUDA backend on a GPU: every scheduler kind against the ATen reference.

Skipped on machines without a CUDA GPU (the emulated tier of test_cuda_backend.py runs
the same kernels on the CPU there). Run on a GPU with:
    PYTHONPATH=. python -m pytest -q tests/test_cuda_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from fuser import FusionDefinition
from fuser.runtime import cuda_backend

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: backend='cuda' launches NVRTC-compiled kernels",
)

F32, F16 = torch.float32, torch.float16


def _cases():
    from test_cuda_cases import GPU_CASES

    return GPU_CASES


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name)
def test_case_matches_reference(case):
    from test_cuda_cases import run_case

    err, fd = run_case(case, "cuda")
    assert not err, f"{case.name}: {err}"
    assert fd.kernels and all(k.backend == "cuda" for k in fd.kernels)


@pytest.mark.parametrize("launcher", ["core", "bindings"])
def test_both_launchers(monkeypatch, launcher):
    """cuda.core and the plain cuda.bindings driver path launch the same kernels."""
    from test_cuda_cases import CASES, run_case

    if launcher == "core":
        pytest.importorskip("cuda.core")
    monkeypatch.setattr(cuda_backend, "LAUNCHER", launcher)
    cuda_backend.clear_memory_cache()
    for name in ("seed_3x5140", "column_sum_f32_split", "softmax_f16_50257", "pointwise_f16_odd"):
        case = next(c for c in CASES if c.name == name)
        err, _ = run_case(case, "cuda")
        assert not err, f"{launcher}: {name}: {err}"


def test_split_column_sum_is_deterministic():
    with FusionDefinition("det") as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1]), dims=[0]))
    x = torch.randn(100000, 333, device="cuda")
    (first,) = fd.execute([x], backend="cuda")
    assert fd.kernels[0].schedule.split_rows > 1, fd.kernels[0].schedule.short()
    for _ in range(3):
        assert torch.equal(fd.execute([x], backend="cuda")[0], first)


def test_runs_on_the_current_stream():
    """The input is written late on a side stream; a kernel launched anywhere but on that
    stream would read it before it is written."""
    from fuser.examples import seed_inputs, seed_layernorm_fusion

    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep is not available")
    fd = seed_layernorm_fusion()
    inputs = seed_inputs(4096, 4096, device="cuda")
    fd.execute(inputs, backend="cuda")  # compile and load outside the timed window
    ref = fd.reference(inputs)[0]
    late = [t.clone() for t in inputs]
    late[1].zero_()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning before the input is ready
        late[1].copy_(inputs[1])
        out = fd.execute(late, backend="cuda")[0]
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-3)


def test_empty_rows():
    with FusionDefinition("empty") as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], F16)))
    (out,) = fd.execute([torch.empty(0, 64, dtype=F16, device="cuda")], backend="cuda")
    assert out.shape == (0, 64)


@pytest.mark.parametrize("op", ["exp", "colsum"])
def test_64bit_indexing(op):
    """Over 2**31 elements: the rows past 2**31 land where they should."""
    need = 300000 * 8192 * 2 * 2 + 2**30
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    with FusionDefinition("big_" + op) as fd:
        x = fd.define_tensor([-1, -1], F16)
        y = fd.ops.sum(fd.ops.cast(x, F32), dims=[0]) if op == "colsum" else fd.ops.exp(x)
        fd.add_output(y)
    x = torch.rand(300000, 8192, dtype=F16, device="cuda")
    (out,) = fd.execute([x], backend="cuda")
    assert fd.kernels[0].schedule.index_bits == 64
    if op == "exp":
        for rows in (slice(0, 2), slice(262140, 262150), slice(-2, None)):
            torch.testing.assert_close(out[rows], torch.exp(x[rows].float()).half())
    else:
        ref = sum(x[i : i + 50000].float().sum(0) for i in range(0, x.shape[0], 50000))
        torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-4)


@pytest.mark.parametrize("hidden,programs", [(20480, 132), (5140, 132), (768, 7)])
def test_prefetching_row_loop(hidden, programs):
    """Resident blocks walking the rows `programs` apart, each loading its next row while
    it reduces this one (what the heuristics pick for 8192 x 20480 on an H100)."""
    from test_cuda_cases import run_replaced

    from fuser.examples import seed_inputs, seed_layernorm_fusion

    inputs = seed_inputs(1000, hidden, device="cuda")
    err = run_replaced(seed_layernorm_fusion(), inputs, programs=programs)
    assert not err, err

"""The chosen schedules compile for sm_90 without a GPU: no spills, and the register
estimate tracks ptxas (compiled through Triton for GPUTarget("cuda", 90, 32))."""

from __future__ import annotations

import pytest
import torch

from fuser.examples import seed_layernorm_fusion
from fuser.runtime.resources import many_resources

SWEEP = [768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480]
# Sizes where the estimate still misses ptxas by more than max(15%, 8 registers). Strict:
# the test fails once the model is fixed, so an entry must then be removed (768, a one-warp
# block, was one until the model priced the registers ptxas spends there: now 60 vs 62;
# 5140, v4 x5 + a tail, until chunks were priced by their access width: now 54 vs 48).
ESTIMATE_MISSES: set[int] = set()


def _meta(rows: int, h: int) -> list[torch.Tensor]:
    def m(*s):
        return torch.empty(*s, dtype=torch.float16, device="meta")

    return [m(h), m(rows, h), m(h), m(h), m(h)]


@pytest.fixture(scope="module")
def sweep_resources():
    fd = seed_layernorm_fusion()
    kernels = []
    for h in SWEEP:
        (k,) = fd.compile(_meta(8192, h), device="h100")
        kernels.append(k)
    return list(zip(SWEEP, kernels, many_resources(kernels)))


def test_sweep_is_one_kernel_without_spills(sweep_resources):
    for h, k, r in sweep_resources:
        assert k.schedule.kind == "inner_persistent", (h, k.schedule.short())
        assert r["spill_bytes"] == 0, f"H={h} {k.schedule.short()} spills {r}"
        assert 0 < r["registers"] <= 255


@pytest.mark.parametrize("h", SWEEP)
def test_register_estimate_tracks_ptxas(sweep_resources, h):
    _, k, r = next(x for x in sweep_resources if x[0] == h)
    est, real = k.schedule.estimate.registers, r["registers"]
    close = abs(est - real) <= max(0.15 * real, 8)
    if h in ESTIMATE_MISSES:
        assert not close, f"H={h} is estimated well now: remove it from ESTIMATE_MISSES"
        pytest.xfail(f"known estimate miss at H={h}: est {est}, ptxas {real}")
    assert close, f"H={h} {k.schedule.short()}: est {est}, ptxas {real}"


def test_every_sweep_candidate_compiles_without_spills():
    """The benchmark's --sweep times these; each must compile for sm_90 and not spill
    (looped kernels with a tail chunk, prefetching row loops, half vectors)."""
    from fuser.runtime.executor import render_kernel
    from fuser.schedulers.device import get_device
    from fuser.schedulers.heuristics import candidate_schedules

    fd = seed_layernorm_fusion()
    (k,) = fd.compile(_meta(8192, 2560), device="h100")
    cands = candidate_schedules(k.spec, get_device("h100"))
    kinds = {s.kind for s in cands}
    assert {"inner_persistent", "inner_looped"} <= kinds
    assert any(s.programs for s in cands)
    kernels = [render_kernel(k.spec, s, "triton") for s in cands]
    for s, r in zip(cands, many_resources(kernels)):
        assert r["spill_bytes"] == 0, f"{s.short()} spills {r}"


@pytest.mark.parametrize(
    "backend,compiler", [("triton", None), ("cuda", "core"), ("cuda", "bindings")]
)
def test_no_multiply_add_contraction_in_machine_code(backend, compiler, monkeypatch, tmp_path):
    """Every compile path keeps eager's rounding after each op: no FFMA in the SASS of
    x * y + z (the GPU soak's seed 12 found x*y - x*y contracted into an FMA, giving the
    product's rounding error instead of 0). cuda.core's NVRTC path, the default where
    cuda-core is installed, contracted until it was given fma=False."""
    from fuser import FusionDefinition
    from fuser.backends.registry import get_backend
    from fuser.config import config
    from fuser.runtime import cuda_backend

    if backend == "cuda":
        pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC through cuda-python")
        if compiler == "core":
            pytest.importorskip("cuda.core", reason="cuda.core")
        monkeypatch.setattr(cuda_backend, "COMPILER", compiler)
        monkeypatch.setattr(config, "cache_dir", tmp_path)  # compiled here, not read back
        cuda_backend.clear_memory_cache()
    with FusionDefinition("fma") as fd:
        x, y, z = (fd.define_tensor([-1, -1], torch.float32) for _ in range(3))
        fd.add_output(fd.ops.add(fd.ops.mul(x, y), z))
    meta = [torch.empty(64, 1024, device="meta") for _ in range(3)]
    (k,) = fd.compile(meta, device="h100", backend=backend)
    code = get_backend(k.backend).sass(k)
    assert "FMUL" in code, "the multiply is missing from the machine code"
    assert "FFMA" not in code, "a multiply and an add were contracted into one FFMA"

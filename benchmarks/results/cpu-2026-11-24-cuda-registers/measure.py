"""NVRTC registers (sm_90, no GPU) of the CUDA backend's persistent kernels, with and
without multiply-add contraction, against the CUDA register estimate. From the repo root:
PYTHONPATH=. python benchmarks/results/cpu-2026-11-24-cuda-registers/measure.py"""

import statistics
import sys

sys.path.insert(0, "tests")
import test_cuda_backend as T  # noqa: E402  (the test's own fusions and sizes)

from fuser.examples import seed_layernorm_fusion  # noqa: E402
from fuser.runtime import cuda_backend  # noqa: E402
from fuser.runtime.resources import cuda_resources  # noqa: E402
from fuser.schedulers.registers import estimate_for  # noqa: E402

kernels = []
for name, build, inputs, _ in T.OTHERS:
    kernels += [(name, k) for k in T.define(build, name).compile(inputs, "h100", "cuda")]
fd = seed_layernorm_fusion()
for h in T.SWEEP:
    (k,) = fd.compile([T.meta(h), T.meta(8192, h), T.meta(h), T.meta(h), T.meta(h)], "h100", "cuda")
    kernels.append((f"seed{h}", k))
kernels = [(n, k) for n, k in kernels if k.schedule.kind == "inner_persistent"]

core_options = cuda_backend._core_options
cuda_backend.COMPILER = "core"
regs = {}
for fma in (True, False):  # cuda.core's default, then what the backend now passes
    cuda_backend._core_options = lambda a, m, fma=fma: {**core_options(a, m), "fma": fma}
    regs[fma] = [cuda_resources(k)["registers"] for _, k in kernels]

print(f"{'kernel':28} {'schedule':52} est  with-FMA  no-FMA  est-noFMA")
saved, errors = [], []
for (name, k), with_fma, without in zip(kernels, regs[True], regs[False]):
    est = estimate_for(k.spec, k.schedule, "cuda")
    row = f"{name:28} {k.schedule.short():52} {est:3}  {with_fma:8}  {without:6}"
    print(f"{row}  {est - without:+9}")
    saved.append(with_fma - without)
    errors.append(est - without)
print(
    f"NVRTC registers saved without contraction: min {min(saved)}, max {max(saved)}, "
    f"mean {statistics.mean(saved):.1f}"
)
print(f"mean estimate error without contraction: {statistics.mean(errors):+.1f}")

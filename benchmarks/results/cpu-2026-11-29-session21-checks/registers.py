"""Register estimate against ptxas for the golden kernels and the rotary bench cases."""

import torch

from fuser.bench.cases import gelu_bwd_case, gelu_fwd_case, rope_case
from tests.golden.cases import GOLDENS, gpu_variant

rows = []


def kernels_of(fd, inputs, backend):
    with gpu_variant():
        return fd.compile(inputs, device="h200", backend=backend)


cases = [(g.name, *g.build()) for g in GOLDENS]
for name, c in (
    ("rope_fwd_bf16", rope_case(16384, 128, torch.bfloat16)),
    ("rope_bwd_bf16", rope_case(16384, 128, torch.bfloat16, True)),
    ("gelu_fwd_fp32", gelu_fwd_case(8192, 3072, torch.float32)),
    ("gelu_bwd_fp32", gelu_bwd_case(8192, 3072, torch.float32)),
):
    ins = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in c.inputs("cpu")]
    cases.append((name, c.fusions[0], ins))
for name, fd, ins in cases:
    for backend in ("triton", "cuda"):
        try:
            ks = kernels_of(fd, ins, backend)
        except Exception as e:
            print(name, backend, "compile error", str(e)[:100])
            continue
        for k in ks:
            try:
                r = k.resources("sm_90")
            except Exception as e:
                print(name, backend, k.name, "resources error", str(e)[:120])
                continue
            est = k.schedule.estimate.registers if k.schedule.estimate else None
            spill = r.get("spill_bytes", r.get("spills"))
            line = f"{name:32s} {backend:6s} {k.name[-3:]:4s} {k.schedule.short():42s}"
            print(f"{line} est {est} ptxas {r.get('registers')} spill {spill}", flush=True)

"""Benchmark fuser's kernels against eager, torch.compile and a device-to-device copy.

Protocol (../shared/DESIGN.md): correctness first against eager; median of
triton.testing.do_bench (L2 flushed between repeats); GB/s from the minimal bytes (inputs
read once, outputs written once); the copy ceiling measured in the same run.

    PYTHONPATH=. python benchmarks/bench_kernels.py --out results/ [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import fuser
from fuser.examples import seed_layernorm_fusion

SWEEP = [768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480]


def copy_gbps() -> float:
    x = torch.empty(2**29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * x.numel() * 2 / ms / 1e6


def seed_eager(t0, t1, t2, t3, t4):
    t13 = (t1.float() + t0.float()).half().float() + t2.float()
    return (F.layer_norm(t13, t13.shape[-1:]) * t4.float() + t3.float()).half()


def ln_eager(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def res_ln_eager(x, r, w, b):
    return F.layer_norm(x + r, x.shape[-1:], w, b)


def softmax_eager(x):
    return torch.softmax(x, -1)


def colsum_eager(x):
    return x.float().sum(0)


def fd_ln(dtype):
    with fuser.FusionDefinition("layernorm") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(x, w, b))
    return fd


def fd_res_ln(dtype):
    with fuser.FusionDefinition("residual_layernorm") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        r = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(fd.ops.add(x, r), w, b))
    return fd


def fd_softmax(dtype):
    with fuser.FusionDefinition("softmax") as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], dtype)))
    return fd


def fd_colsum(dtype):
    with fuser.FusionDefinition("colsum") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, torch.float32), dims=[0]))
    return fd


def cases(quick: bool):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s, dtype):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=g)

    f16, bf16 = torch.float16, torch.bfloat16
    seed = seed_layernorm_fusion()
    for h in SWEEP[:3] if quick else SWEEP:
        ins = [rnd(h, dtype=f16), rnd(8192, h, dtype=f16)] + [rnd(h, dtype=f16) for _ in range(3)]
        yield (
            "ln_fused_fp16",
            f"8192x{h}",
            "float16",
            seed,
            seed_eager,
            ins,
            2 * 8192 * h * 2 + 4 * h * 2,
        )
    for h in (768, 1600, 5140):
        ins = [rnd(8192, h, dtype=bf16), rnd(h, dtype=bf16), rnd(h, dtype=bf16)]
        yield (
            "layernorm_fwd",
            f"8192x{h}",
            "bfloat16",
            fd_ln(bf16),
            ln_eager,
            ins,
            2 * 8192 * h * 2 + 2 * h * 2,
        )
        ins = [
            rnd(8192, h, dtype=bf16),
            rnd(8192, h, dtype=bf16),
            rnd(h, dtype=bf16),
            rnd(h, dtype=bf16),
        ]
        yield (
            "residual_layernorm_fwd",
            f"8192x{h}",
            "bfloat16",
            fd_res_ln(bf16),
            res_ln_eager,
            ins,
            3 * 8192 * h * 2 + 2 * h * 2,
        )
    ins = [rnd(98304, 1024, dtype=bf16)]
    yield (
        "softmax",
        "98304x1024",
        "bfloat16",
        fd_softmax(bf16),
        softmax_eager,
        ins,
        2 * 98304 * 1024 * 2,
    )
    for h in (3072, 6400):
        ins = [rnd(8192, h, dtype=bf16)]
        yield (
            "bias_grad_colsum",
            f"8192x{h}",
            "bfloat16",
            fd_colsum(bf16),
            colsum_eager,
            ins,
            8192 * h * 2 + h * 4,
        )


def host_overhead_us(fd, ins) -> float:
    fd.execute(ins)
    torch.cuda.synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        fd.execute(ins)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/latest")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }
    ceiling = copy_gbps()
    rows = []
    for op, shape, dtype, fd, eager, ins, nbytes in cases(args.quick):
        ref = eager(*ins)
        t0 = time.perf_counter()
        got = fd.execute(ins)[0]
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        tol = 2e-2 if dtype != "float32" else 1e-4
        ok = torch.allclose(got.float(), ref.float(), atol=tol, rtol=tol)
        compiled = torch.compile(eager)
        compiled(*ins)
        impls = {
            "fuser-triton": lambda fd=fd, ins=ins: fd.execute(ins),
            "eager": lambda eager=eager, ins=ins: eager(*ins),
            "compile": lambda compiled=compiled, ins=ins: compiled(*ins),
        }
        k = fd.kernels
        res = []
        try:
            res = [kk.resources() for kk in k]
        except Exception as e:  # resources are a report, not a gate for timing
            res = [{"error": str(e)[:200]}]
        for impl, fn in impls.items():
            if impl == "fuser-triton" and not ok:
                ms = float("nan")
            else:
                ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            row = {
                "op": op,
                "shape": shape,
                "dtype": dtype,
                "impl": impl,
                "ms": ms,
                "gbps": nbytes / ms / 1e6,
                "copy_gbps": ceiling,
                **meta,
            }
            if impl == "fuser-triton":
                row.update(
                    {
                        "correct": bool(ok),
                        "schedule": "; ".join(kk.schedule.short() for kk in k),
                        "est_registers": [kk.schedule.estimate.registers for kk in k],
                        "registers": [r.get("registers") for r in res],
                        "spill_bytes": [r.get("spill_bytes") for r in res],
                        "first_call_s": compile_s,
                    }
                )
            rows.append(row)
            print(
                f"{op:24s} {shape:12s} {impl:13s} {ms:8.4f} ms {row['gbps']:7.0f} GB/s "
                f"({row['gbps'] / ceiling:5.1%} of copy) {row.get('schedule', '')} "
                f"{row.get('registers', '')}",
                flush=True,
            )
    seed = seed_layernorm_fusion()
    ins = [
        torch.randn(768, device="cuda", dtype=torch.float16),
        torch.randn(8192, 768, device="cuda", dtype=torch.float16),
    ] + [torch.randn(768, device="cuda", dtype=torch.float16) for _ in range(3)]
    overhead = host_overhead_us(seed, ins)
    print(f"host overhead of a cached fd.execute (seed, 8192x768): {overhead:.1f} us")
    rows.append(
        {
            "op": "host_overhead",
            "shape": "8192x768",
            "dtype": "float16",
            "impl": "fuser-triton",
            "us": overhead,
            **meta,
        }
    )
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    plot(rows, ceiling, out / "ln_fused_fp16.png")


def plot(rows, ceiling, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    for impl in ("fuser-triton", "compile", "eager"):
        pts = [
            (int(r["shape"].split("x")[1]), r["gbps"])
            for r in rows
            if r.get("op") == "ln_fused_fp16" and r["impl"] == impl
        ]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=impl)
    ax.axhline(ceiling, color="gray", ls="--", label=f"copy {ceiling:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hidden size H (8192 rows, fp16)")
    ax.set_ylabel("GB/s (minimal bytes)")
    ax.set_title(f"seed LayerNormFusedOp on {rows[0]['device']}")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    os.environ.setdefault("FUSER_CACHE_DIR", "/tmp/fuser_cache")
    main()

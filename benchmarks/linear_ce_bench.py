"""The chunked linear + cross-entropy (issue 22 item 4, fuser/dynamo/linear_ce.py) on a GPU,
beside its peers, in one run; JSON out.

    PYTHONPATH=. python benchmarks/linear_ce_bench.py --out $OUT/linear_ce.json

Part 1, GPT-2 124M's lm head alone: N = B*T = 16384 rows, H = 768, V = 50257, bf16 x and W,
int64 targets with 1% ignored. Forward + backward (torch.autograd.grad into x and W), the
median of --reps with the L2 flushed (a read of 256 MB) between repeats, CUDA events; peak
memory above what was allocated before the call; errors against float32 math on the same
values (loss: absolute; dx, dW: the largest error over the largest |value|). For

  eager            F.cross_entropy(F.linear(x, w).float(), t)
  inductor         torch.compile(the same)
  fuser-unchunked  torch.compile(the same, backend="fuser"), FUSER_LINEAR_CE=0 (one-pass
                   cross-entropy over whole logits, padded matmuls)
  fuser            the same with the rewrite (FUSER_LINEAR_CE=auto takes it here)
  fuser-op-R       fuser.dynamo.linear_ce.linear_cross_entropy called directly with R rows a
                   chunk (R = 1024, 2048, 4096, 8192): the chunk rule's sweep
  liger            LigerFusedLinearCrossEntropyLoss, where liger_kernel imports

Part 2, a GPT-2 124M training step (examples/train_gpt2.py's run_training: B=16, T=1024,
bf16 autocast, fused AdamW, --steps steps): fuser with FUSER_LINEAR_CE=0 and =auto, the
model wrapped so that the step's graph returns the loss only (a loop that drops the
logits; GPT.forward returns them, which would keep them whole): ms/step, peak memory,
every step's loss side by side, the rewrite's notes; the explain report of the chunked
run goes beside the JSON. ~3-4 minutes on an H100, compiles included.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuser  # noqa: E402
from examples.train_gpt2 import fresh_model, make_batches, run_training  # noqa: E402
from fuser.config import config  # noqa: E402
from fuser.dynamo.explain import captures_of  # noqa: E402
from fuser.dynamo.linear_ce import linear_cross_entropy_op, plan_chunks  # noqa: E402
from fuser.examples.gpt2 import get_config  # noqa: E402

SWEEP = (1024, 2048, 4096, 8192)


def environment(device: str) -> dict[str, Any]:
    import triton

    cuda = device.startswith("cuda")
    return {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fuser": fuser.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _loss(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(x, w).float(), t)


def _liger() -> Any:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as e:
        return f"liger_kernel does not import: {e}"
    loss = LigerFusedLinearCrossEntropyLoss()
    return lambda x, w, t: loss(w, x, t)


def _compiled(backend: str, mode: str) -> Any:
    def make() -> Any:
        torch._dynamo.reset()
        config.linear_cross_entropy = mode
        return torch.compile(_loss, backend=backend)

    return make


def _op(rows: int) -> Any:
    """The op itself, R rows a chunk, its loss float32 like the others' (.float())."""

    def fn(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy_op(x, w, None, t, 1, -100, 0.0, x.dtype, True, rows)[0]

    return fn


def implementations() -> dict[str, Any]:
    """name -> a function (x, w, t) -> loss, or a maker of one, or why there is none."""
    impls: dict[str, Any] = {
        "eager": _loss,
        "inductor": _compiled("inductor", "0"),
        "fuser-unchunked": _compiled("fuser", "0"),
        "fuser": _compiled("fuser", "auto"),
    }
    for rows in SWEEP:
        impls[f"fuser-op-{rows}"] = _op(rows)
    impls["liger"] = _liger()
    return impls


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step(fn: Any, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> list[torch.Tensor]:
    loss = fn(x, w, t)
    return [loss.detach(), *torch.autograd.grad(loss, [x, w])]


def _errors(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    out = {"loss_abs_err": abs(got[0].float().item() - ref[0].item())}
    for name, g, r in zip(("dx", "dw"), got[1:], ref[1:]):
        scale = r.abs().max().item()
        out[f"{name}_err_over_max"] = (g.float() - r).abs().max().item() / scale
    return out


def bench_head(args: argparse.Namespace) -> list[dict[str, Any]]:
    n, h, v, dev = args.rows, args.hidden, args.vocab, args.device
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, h, device=dev, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device=dev, generator=g) * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device=dev, generator=g)
    t[torch.rand(n, device=dev, generator=g) < 0.01] = -100
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = [r.detach() for r in _step(_loss, xr, wr, t)]
    del xr, wr
    # the L2 flush: a read of 256 MB between repeats
    flush = torch.empty(64 * 2**20 if dev.startswith("cuda") else 1, dtype=torch.int32, device=dev)
    rows = []
    for name, impl in implementations().items():
        if args.impls and name not in args.impls:
            continue
        row: dict[str, Any] = {"part": "lm_head", "impl": name, "N": n, "H": h, "V": v}
        if isinstance(impl, str):
            row["error"] = impl
            rows.append(row)
            print(f"{name:18s} skipped: {impl}", flush=True)
            continue
        try:
            row.update(_time_one(name, impl, (x, w, t), ref, flush, args.reps))
        except Exception:
            row["error"] = traceback.format_exc()[-3000:]
            print(f"{name} FAILED:\n{row['error']}", flush=True)
        rows.append(row)
    config.linear_cross_entropy = "auto"
    torch._dynamo.reset()
    return rows


def _time_one(name: str, impl: Any, xwt: tuple, ref: list, flush: Any, reps: int) -> dict:
    x = xwt[0]
    cuda = x.is_cuda
    t0 = time.perf_counter()
    fn = impl() if name in ("inductor", "fuser-unchunked", "fuser") else impl
    got = _step(fn, *xwt)  # the first call: compiles
    first = time.perf_counter() - t0
    errors = _errors(got, ref)
    del got
    for _ in range(2):
        _step(fn, *xwt)
    gc.collect()
    peak = float("nan")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _step(fn, *xwt)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []
    for _ in range(reps):
        flush.sum()
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            _step(fn, *xwt)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            c0 = time.perf_counter()
            _step(fn, *xwt)
            times.append((time.perf_counter() - c0) * 1e3)
    ms = statistics.median(times)
    print(
        f"{name:18s} {ms:8.3f} ms fwd+bwd  peak +{peak:8.0f} MiB  first call {first:5.1f} s  "
        f"loss err {errors['loss_abs_err']:.2e}  dx {errors['dx_err_over_max']:.2e}  "
        f"dW {errors['dw_err_over_max']:.2e}",
        flush=True,
    )
    return {"ms": ms, "peak_mib": peak, "first_call_s": first, **errors}


class LossOnly(torch.nn.Module):
    """The model with the loss as the step's only output, as a loop that drops the logits
    sees it; (None, loss), as run_training unpacks."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, self.model(idx, targets)[1]


def bench_step(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    cfg = get_config(args.config)
    seq = args.seq or cfg.block_size
    batches = make_batches(cfg.vocab_size, args.batch, seq, args.steps, args.device)
    rows = []
    on = "auto" if args.device.startswith("cuda") else "1"  # auto takes CUDA logits only
    for mode in ("0", on):
        torch._dynamo.reset()
        config.linear_cross_entropy = mode
        model = LossOnly(fresh_model(args.config, args.device, None, 0))
        row: dict[str, Any] = {"part": "gpt2_step", "impl": f"fuser FUSER_LINEAR_CE={mode}"}
        try:
            res = run_training(model, "fuser", batches, config=args.config, log=False)
            row.update(
                ms_per_step=res.ms_per_step,
                peak_mem_gib=res.peak_mem_gib,
                first_step_s=res.first_step_s,
                losses=res.losses,
                step_ms=res.step_ms,
                notes=[n for c in captures_of(model) for n in c.linear_ce],
            )
            print(
                f"GPT-2 step, FUSER_LINEAR_CE={mode}: {res.ms_per_step:.1f} ms/step, peak "
                f"{res.peak_mem_gib:.2f} GiB, first step {res.first_step_s:.1f} s, final loss "
                f"{res.losses[-1]:.4f}",
                flush=True,
            )
            if mode != "0":
                out.with_name(out.stem + "_step_explain.txt").write_text(
                    str(fuser.explain(model)) + "\n"
                )
        except Exception:
            row["error"] = traceback.format_exc()[-3000:]
            print(f"step {mode} FAILED:\n{row['error']}", flush=True)
        rows.append(row)
        del model
    config.linear_cross_entropy = "auto"
    if len(rows) == 2 and all("losses" in r for r in rows):
        diffs = [abs(a - b) for a, b in zip(rows[0]["losses"], rows[1]["losses"])]
        print("losses (off | on):")
        for i, (a, b) in enumerate(zip(rows[0]["losses"], rows[1]["losses"])):
            print(f"  step {i:2d}  {a:.5f} | {b:.5f}")
        rows.append({"part": "gpt2_step", "impl": "parity", "max_loss_diff": max(diffs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("linear_ce.json"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=None, help="default: the config's block size")
    ap.add_argument("--config", default="124m", help="part 2's GPT-2 (tiny for a CPU smoke run)")
    ap.add_argument("--rows", type=int, default=16 * 1024, help="part 1's N")
    ap.add_argument("--hidden", type=int, default=768, help="part 1's H")
    ap.add_argument("--vocab", type=int, default=50257, help="part 1's V")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    ap.add_argument("--impls", nargs="*", default=None, help="part 1's implementations")
    ap.add_argument("--skip-head", action="store_true")
    ap.add_argument("--skip-step", action="store_true")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("linear_ce_bench.py measures on a GPU; none is visible")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plan = plan_chunks(args.rows, args.vocab, torch.bfloat16)
    result: dict[str, Any] = {
        "env": environment(args.device),
        "plan": {"rows": plan.rows, "chunks": plan.chunks, "padded": plan.padded},
        "rows": [],
    }
    print(f"{result['env']}\nchunk plan at N={args.rows}, V={args.vocab}: {plan.line()}")
    if not args.skip_head:
        result["rows"] += bench_head(args)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not args.skip_step:
        result["rows"] += bench_step(args, args.out)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

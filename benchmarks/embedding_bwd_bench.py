"""Embedding backward and rotary embeddings (issue 21) on a GPU, one command, JSON out.

    python benchmarks/embedding_bwd_bench.py --out $OUT/embedding_rotary.json

Embedding backward: weight 50257 x 768, 16384 tokens (random ids, as GPT-2's batches),
bf16 gradient: fuser's sorted kernel (deterministic, the default), fuser's atomic kernel
(FUSER_SCATTER=atomic), fuser through torch.compile(backend="fuser") (the path a model
takes), ATen eager and torch.compile (Inductor). Minimal bytes: the gradient and the ids
read once, the [50257, 768] weight gradient written once. Each result is checked against
ATen in float64 first; `deterministic` says whether two runs gave the same bits.

Rotary forward+backward: q [8, 32, 2048, 128], k [8, 8, 2048, 128] bf16 (transformers'
layout after the head transpose), cos/sin [8, 2048, 128]: q * cos + rotate_half(q) * sin
for q and k, then the backward of both, against torch.compile (Inductor), eager and
Liger's liger_rotary_pos_emb when it imports; q/k as transformers makes them (the
[B, T, H, D] projections transposed) and contiguous. "apply": cos/sin given (as transformers
passes them to each layer); "from positions": cos/sin computed in the same compiled
function from inv_freq and position ids (Liger gets them from eager). Bytes: 8 tensor
passes (q and k read and written forward, their gradients read and written backward),
and % of a 1 GiB device copy measured in the same run. Medians, L2 flushed between
repeats (fuser.bench.measure.bench_ms).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import fuser  # noqa: F401  (registers backend="fuser")
from fuser.bench.measure import bench_ms, copy_gbps
from fuser.runtime.scatter import embedding_backward

aten = torch.ops.aten
BF16 = torch.bfloat16
DEV = "cuda"
TIME = bench_ms  # --cpu-smoke: one call timed on the host (checks the script, not speed)


def _once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _record(op: str, impl: str, ms: float, nbytes: int, copy: float, **extra) -> dict:
    gbps = nbytes / ms / 1e6
    return {"op": op, "impl": impl, "ms": round(ms, 4), "gbps": round(gbps, 1),
            "pct_copy": round(100 * gbps / copy, 1), **extra}  # fmt: skip


def embedding(args: argparse.Namespace, copy: float) -> list[dict]:
    v, h, n = args.vocab, args.hidden, args.tokens
    g = torch.Generator(device=DEV).manual_seed(0)
    grad = torch.randn(n, h, device=DEV, dtype=BF16, generator=g)
    ids = torch.randint(0, v, (n,), device=DEV, generator=g)
    want = aten.embedding_dense_backward(grad.double(), ids, v, -1, False)
    nbytes = grad.numel() * 2 + ids.numel() * 8 + v * h * 2

    def compiled(backend: str):
        torch._dynamo.reset()
        return torch.compile(
            lambda gr, i: aten.embedding_dense_backward(gr, i, v, -1, False), backend=backend
        )

    impls = {
        "fuser sorted": lambda: embedding_backward(grad, ids, v, how="sorted"),
        "fuser atomic": lambda: embedding_backward(grad, ids, v, how="atomic"),
        "aten eager": lambda: aten.embedding_dense_backward(grad, ids, v, -1, False),
    }
    out = []
    for name, make in (("fuser torch.compile", "fuser"), ("torch.compile", "inductor")):
        t0 = time.perf_counter()
        fn = compiled(make)
        fn(grad, ids)
        _sync()
        impls[name] = (lambda f: lambda: f(grad, ids))(fn)
        print(f"  {name}: compiled in {time.perf_counter() - t0:.1f}s", flush=True)
    for name, fn in impls.items():
        a, b = fn(), fn()
        _sync()
        err = (a.double() - want).abs().max().item()
        same = bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))
        ms = TIME(fn)
        rec = _record("embedding_backward", name, ms, nbytes, copy, max_err=err,
                      deterministic=same, shape=[v, h], tokens=n)  # fmt: skip
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _cos_sin(inv_freq, pos, dtype):
    # transformers' LlamaRotaryEmbedding: freqs = inv_freq x positions, cat, cos and sin
    freqs = (inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _liger():
    for where in ("liger_kernel.transformers.rope", "liger_kernel.transformers"):
        try:
            module = __import__(where, fromlist=["liger_rotary_pos_emb"])
            return module.liger_rotary_pos_emb
        except (ImportError, AttributeError):
            continue
    return None


def rotary(args: argparse.Namespace, copy: float, layout: str) -> list[dict]:
    b, hq, hk, t, d = args.batch, args.heads, args.kv_heads, args.seq, args.head_dim
    g = torch.Generator(device=DEV).manual_seed(1)
    # transformers' layout: [B, T, H, D] projections seen as [B, H, T, D]
    q = torch.randn(b, t, hq, d, device=DEV, dtype=BF16, generator=g).transpose(1, 2)
    k = torch.randn(b, t, hk, d, device=DEV, dtype=BF16, generator=g).transpose(1, 2)
    if layout == "contiguous":
        q, k = q.contiguous(), k.contiguous()
    q.requires_grad_(True)
    k.requires_grad_(True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    pos = torch.arange(t, device=DEV)[None].expand(b, t)
    cos, sin = _cos_sin(inv_freq, pos, BF16)
    nbytes = 4 * (q.numel() + k.numel()) * 2
    want = _apply(q.detach().float(), k.detach().float(), cos.float(), sin.float())

    def from_positions(q, k, inv_freq, pos):
        c, s = _cos_sin(inv_freq, pos, q.dtype)
        return _apply(q, k, c, s)

    liger = _liger()
    variants = {"apply": (_apply, (cos, sin)), "from positions": (from_positions, (inv_freq, pos))}
    out = []
    for variant, (fn, extra) in variants.items():
        impls = {"eager": fn}
        for name, backend in (("fuser", "fuser"), ("torch.compile", "inductor")):
            torch._dynamo.reset()
            impls[name] = torch.compile(fn, backend=backend)
        if liger is not None and variant == "apply":
            impls["liger"] = lambda q, k, c, s: liger(q, k, c, s)
        elif liger is not None:
            impls["liger"] = lambda q, k, inv, p: liger(q, k, *_cos_sin(inv, p, q.dtype))
        for name, f in impls.items():
            t0 = time.perf_counter()

            def step(f=f, extra=extra):
                qo, ko = f(q, k, *extra)
                return torch.autograd.grad((qo, ko), (q, k), (gq, gk)), (qo, ko)

            try:
                _, (qo, ko) = step()
            except Exception as e:  # a peer that cannot run this shape: reported, not timed
                rec = {"op": f"rotary {variant}, {layout}", "impl": name, "error": str(e)[:300]}
                print(json.dumps(rec), flush=True)
                continue
            _sync()
            first = time.perf_counter() - t0
            err = max((qo.float() - want[0]).abs().max().item(),
                      (ko.float() - want[1]).abs().max().item())  # fmt: skip
            ms = TIME(step)
            rec = _record(f"rotary fwd+bwd ({variant}, {layout} q/k)", name, ms, nbytes, copy,
                          max_err=err,
                          first_call_s=round(first, 2), q=list(q.shape), k=list(k.shape),
                          q_stride=list(q.stride()))  # fmt: skip
            print(json.dumps(rec), flush=True)
            out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON here too")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--layouts", nargs="+", default=["transposed", "contiguous"],
        help="q/k as transformers makes them ([B, T, H, D] transposed) and/or contiguous",
    )  # fmt: skip
    ap.add_argument("--only", choices=("embedding", "rotary"), default=None)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, no timing")
    args = ap.parse_args()
    global DEV, TIME
    if args.cpu_smoke:
        DEV, TIME = "cpu", _once
        args.vocab, args.hidden, args.tokens = 37, 24, 53
        args.batch, args.heads, args.kv_heads, args.seq, args.head_dim = 2, 4, 2, 8, 16
    elif not torch.cuda.is_available():
        raise SystemExit("needs a GPU (or --cpu-smoke)")
    copy = copy_gbps() if DEV == "cuda" else 1.0
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    print(f"copy ceiling {copy:.0f} GB/s on {name}", flush=True)
    results = []
    if args.only in (None, "embedding"):
        results += embedding(args, copy)
    if args.only in (None, "rotary"):
        for layout in args.layouts:
            results += rotary(args, copy, layout)
    report = {
        "device": name,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "copy_gbps": round(copy, 1),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

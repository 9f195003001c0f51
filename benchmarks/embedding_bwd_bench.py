"""Embedding backward and rotary embeddings (issue 21) on a GPU, one command, JSON out.

    python benchmarks/embedding_bwd_bench.py --out $OUT/embedding_rotary.json

Embedding backward, one case each (--cases picks by a word of the name):
  gpt2 wte        50257 x 768, 16384 tokens (random ids, as GPT-2's batches), bf16
  t5 relative bias  32 buckets x 12 heads read at T5's [512, 512] bucket matrix (262144
                  tokens, shared by the batch): fp32 in T5's layout (the gradient a
                  [q, k, heads] view of [heads, q, k]: tokens stride 1) and bf16 contiguous
  bert token types  2 x 768, 4096 tokens (batch 8 x 512, half of each sequence type 1), fp32
  bert positions  512 x 768, the same 4096 tokens' positions, fp32
each by fuser's default (the kind its plan takes: runs, split or table; deterministic),
fuser's runs kernel forced (the sorted kernel, the only deterministic one before the
table and split kinds), fuser split (where the default is a table and split can take the
shape), fuser atomic (FUSER_SCATTER=atomic), fuser through torch.compile(backend="fuser")
(the path a model takes), ATen eager, torch.compile (Inductor), and the runs kernel's
prologue alone (ATen's stable sort and searchsorted of the ids). Minimal bytes: the
gradient and the ids read once, the weight gradient written once. Each result is checked
against ATen in float64 first; `deterministic` says whether two runs gave the same bits.
Only the embedding cases: --only embedding.

Rotary forward+backward: q [8, 32, 2048, 128], k [8, 8, 2048, 128] bf16 (transformers'
layout after the head transpose), cos/sin [8, 2048, 128]: q * cos + rotate_half(q) * sin
for q and k, then the backward of both, against torch.compile (Inductor), eager and
Liger's liger_rotary_pos_emb when it imports; q/k as transformers makes them (the
[B, T, H, D] projections transposed) and contiguous. "apply": cos/sin given (as transformers
passes them to each layer); "from positions": cos/sin computed in the same compiled
function from inv_freq and position ids (Liger gets them from eager). Bytes: 8 tensor
passes (q and k read and written forward, their gradients read and written backward),
and % of a 1 GiB device copy measured in the same run. Medians, L2 flushed between
repeats (fuser.bench.measure.bench_ms). The rotary rows' `ms` is GPU time, as issue 20's
training bench takes it (fuser.bench.training_measure.gpu_ms: the host's launches queued
behind a GPU spin); `wall_ms` is the events-only figure, host included.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import fuser  # noqa: F401  (registers backend="fuser")
from fuser.bench.measure import bench_ms, copy_gbps
from fuser.bench.training_measure import gpu_ms
from fuser.runtime.scatter import embedding_backward, plan_for

aten = torch.ops.aten
BF16 = torch.bfloat16
DEV = "cuda"
TIME = bench_ms  # --cpu-smoke: one call timed on the host (checks the script, not speed)


def _gpu_time(fn) -> tuple[float, float]:
    """(GPU ms, host ms) of a rotary step: the training bench's protocol (a GPU spin long
    enough for the host to enqueue the whole step, so the events time the GPU's work).
    The step is ~0.2 ms of GPU work behind more host time than that: timed by events
    alone (`wall_ms`), it measures Python and moved up to 2.4x between runs. On the CPU
    (--cpu-smoke), one call on the host."""
    return (_once(fn), 0.0) if DEV == "cpu" else gpu_ms(fn, reps=60)


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


def _t5_buckets(q: int, k: int, buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bidirectional relative-position buckets [q, k]: half the buckets for keys to
    the right; within a half, distances below a quarter of the buckets exact, the rest
    log-spaced up to max_distance (the last bucket takes everything beyond)."""
    rel = torch.arange(k, device=DEV)[None, :] - torch.arange(q, device=DEV)[:, None]
    half = buckets // 2
    exact = half // 2
    dist = rel.abs()
    far = exact + (
        torch.log(dist.float().clamp(min=1) / exact) / math.log(max_distance / exact)
        * (half - exact)
    ).long()  # fmt: skip
    return (rel > 0).long() * half + torch.where(dist < exact, dist, far.clamp(max=half - 1))


def _cases(args: argparse.Namespace) -> dict[str, tuple]:
    """name -> (rows, grad [..., H], ids [...]) of each embedding backward measured."""
    g = torch.Generator(device=DEV).manual_seed(0)
    v, h, n = args.vocab, args.hidden, args.tokens
    q = args.t5_seq
    b, t, hb = args.bert_batch, args.bert_seq, args.bert_hidden

    def randn(*shape, dtype=BF16):
        return torch.randn(*shape, device=DEV, dtype=dtype, generator=g)

    # T5's relative_attention_bias: [32 buckets, 12 heads] read at a [q, k] bucket matrix
    # shared by the batch; its gradient arrives as [q, k, heads] seen from [heads, q, k]
    # (the bias is permuted to [1, heads, q, k] before the scores add it)
    buckets = _t5_buckets(q, q)
    token_types = (torch.arange(t, device=DEV) >= t // 2).long().expand(b, t)
    positions = torch.arange(t, device=DEV).expand(b, t)
    return {
        "gpt2 wte": (v, randn(n, h), torch.randint(0, v, (n,), device=DEV, generator=g)),
        "t5 relative bias (T5's [heads, q, k] layout, fp32)": (
            32, randn(12, q, q, dtype=torch.float32).permute(1, 2, 0), buckets),
        "t5 relative bias (contiguous, bf16)": (32, randn(q, q, 12), buckets),
        "bert token types (fp32)": (2, randn(b, t, hb, dtype=torch.float32), token_types),
        "bert positions (fp32)": (t, randn(b, t, hb, dtype=torch.float32), positions),
    }  # fmt: skip


def embedding(args: argparse.Namespace, copy: float) -> list[dict]:
    out = []
    wanted = args.cases or None
    for case, (v, grad, ids) in _cases(args).items():
        if wanted and not any(w in case for w in wanted):
            continue
        print(f"{case}: [{v}, {grad.shape[-1]}] from {ids.numel()} tokens", flush=True)
        out += _embedding_case(case, v, grad, ids, copy)
    return out


def _embedding_case(case: str, v: int, grad: torch.Tensor, ids: torch.Tensor, copy: float):
    want = aten.embedding_dense_backward(grad.double(), ids, v, -1, False)
    h = grad.shape[-1]
    size = grad.element_size()
    nbytes = grad.numel() * size + ids.numel() * 8 + v * h * size
    plan = plan_for(grad, ids, v, grad.dtype)

    def compiled(backend: str):
        torch._dynamo.reset()
        return torch.compile(
            lambda gr, i: aten.embedding_dense_backward(gr, i, v, -1, False), backend=backend
        )

    flat = ids.reshape(-1)
    rows = torch.arange(v + 1, device=DEV)
    impls = {
        f"fuser ({plan.kind}, the default)": lambda: embedding_backward(grad, ids, v),
        "fuser runs (the sorted kernel)": lambda: embedding_backward(grad, ids, v, how="runs"),
        "fuser atomic": lambda: embedding_backward(grad, ids, v, how="atomic"),
        "aten eager": lambda: aten.embedding_dense_backward(grad, ids, v, -1, False),
        "aten sort + searchsorted (the runs kernel's prologue)": lambda: torch.searchsorted(
            torch.sort(flat, stable=True)[0], rows
        ),
    }  # fmt: skip
    if plan.kind != "runs" and plan.kind != "split":
        split = plan_for(grad, ids, v, grad.dtype, how="split")
        if split.kind == "split":
            impls["fuser split"] = lambda: embedding_backward(grad, ids, v, how="split")
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
        extra = {}
        if a.shape == want.shape:
            ints = torch.int16 if a.element_size() == 2 else torch.int32
            extra = {
                "max_err": (a.double() - want).abs().max().item(),
                "deterministic": bool(torch.equal(a.view(ints), b.view(ints))),
            }
        ms = TIME(fn)
        rec = _record("embedding_backward", name, ms, nbytes, copy, case=case, **extra,
                      shape=[v, h], tokens=ids.numel(), dtype=str(grad.dtype),
                      grad_stride=list(grad.stride()))  # fmt: skip
        if name.startswith("fuser ("):
            rec["plan"] = plan.line()
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
            wall = TIME(step)
            ms, host = _gpu_time(step)
            rec = _record(f"rotary fwd+bwd ({variant}, {layout} q/k)", name, ms, nbytes, copy,
                          max_err=err, wall_ms=round(wall, 4), host_ms=round(host, 4),
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
    ap.add_argument("--t5-seq", type=int, default=512, help="T5's bucket matrix is [seq, seq]")
    ap.add_argument("--bert-batch", type=int, default=8)
    ap.add_argument("--bert-seq", type=int, default=512)
    ap.add_argument("--bert-hidden", type=int, default=768)
    ap.add_argument(
        "--cases", nargs="*", default=None,
        help="embedding cases whose name holds one of these words (default: all)",
    )  # fmt: skip
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
        args.t5_seq, args.bert_batch, args.bert_seq, args.bert_hidden = 24, 2, 40, 24
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

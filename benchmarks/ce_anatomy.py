"""Where the cross-entropy row kernel's time goes: hand-written Triton variants of the
one-pass cross-entropy (loss and bf16 gradient of `F.cross_entropy(logits.float(), t)`,
mean, ignore_index -100) that switch one of fuser's choices at a time, timed beside
fuser's own kernel, eager and torch.compile, each checked against eager.

    PYTHONPATH=. python benchmarks/ce_anatomy.py --out $OUT/ce_anatomy.jsonl   # GPU

The looped variants walk a row `chunk` columns at a time, twice (an online max-and-sum
pass, then the gradient pass), as fuser's inner_looped plan does. Switches:
  gather  the target's logit by one scalar load, not a masked sum over the whole row
  i32     the one-hot compare in int32 (cols against the target narrowed once a row)
  lse     the gradient as exp(x - lse) * scale: no division per element
  evict   the first pass's loads kept in L2 (evict_last), the second's let go (evict_first)
The `resident` variants hold the row in registers (1024 threads, read once). `floor2` and
`floor1` are memory-only walks (two reads and a write; one read and a write) with the same
loop shape: the roofline of each form.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fuser.bench.measure import bench_ms, copy_gbps

BF16 = torch.bfloat16


@triton.jit
def _widen(x, ALT: tl.constexpr):
    # bf16 -> fp32; ALT spells it as a shift so that the compiler does not merge it with
    # the first pass's conversion (the row stays live as bf16, not as fp32)
    if ALT:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _load(ptrs, mask, other, EVICT: tl.constexpr, POLICY: tl.constexpr):
    # a walk's load, with the L2 hint POLICY where EVICT
    if EVICT:
        x = tl.load(ptrs, mask=mask, other=other, eviction_policy=POLICY)
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x


@triton.jit
def _online(m, s, x):
    # one step of the running max m and the running sum s of exp(x - m), rescaled when
    # m grows (exp of -|x - m| either way: nothing overflows)
    up = x > m
    fin = tl.where(m > float("-inf"), m, 0.0)
    e = tl.exp(-tl.abs(x - fin))
    return tl.maximum(m, x), tl.where(up, s * e + 1.0, s + e)


@triton.jit
def ce_looped(x_ptr, t_ptr, loss_ptr, g_ptr, count_ptr, V, XS, GS,
              CHUNK: tl.constexpr, GATHER: tl.constexpr, I32: tl.constexpr,
              LSE: tl.constexpr, EVICT: tl.constexpr, FLOOR: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    valid = t != -100
    tc = tl.where(valid, t, 0)
    tt = tc.to(tl.int32) if I32 else tc
    xrow = x_ptr + row * XS
    grow = g_ptr + row * GS
    m = tl.full((CHUNK,), float("-inf"), tl.float32)
    s = tl.zeros((CHUNK,), tl.float32)
    acc = tl.zeros((CHUNK,), tl.float32)
    ar = tl.arange(0, CHUNK)
    if FLOOR != 1:
        for off in range(0, V, CHUNK):
            cols = off + ar
            ok = cols < V
            xb = _load(xrow + cols, ok, float("-inf"), EVICT, "evict_last")
            x = xb.to(tl.float32)
            if FLOOR == 2:
                m = tl.maximum(m, x)
            else:
                if not GATHER:
                    ci = cols if I32 else cols.to(tl.int64)
                    acc += tl.where(ci == tt, x, 0.0)
                m, s = _online(m, s, x)
    mx = tl.max(m, 0)
    ssum = tl.sum(s * tl.exp(m - mx), 0)
    lse = mx + tl.log(ssum)
    if GATHER:
        picked = tl.load(xrow + tc).to(tl.float32)
    else:
        picked = tl.sum(acc, 0)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
    count = tl.load(count_ptr)
    scale = tl.where(valid, 1.0 / count, 0.0)
    for off in range(0, V, CHUNK):
        cols = off + ar
        ok = cols < V
        xb = _load(xrow + cols, ok, 0.0, EVICT, "evict_first")
        x = xb.to(tl.float32)
        if FLOOR != 0:
            g = x * scale
        else:
            ci = cols if I32 else cols.to(tl.int64)
            hit = (ci == tt).to(tl.float32)
            if LSE:
                g = (tl.exp(x - lse) - hit) * scale
            else:
                g = tl.where(valid, (tl.exp(x - mx) / ssum - hit) / count, 0.0)
        tl.store(grow + cols, g.to(tl.bfloat16), mask=ok)


@triton.jit
def ce_resident(x_ptr, t_ptr, loss_ptr, g_ptr, count_ptr, V, XS, GS,
                BLOCK: tl.constexpr, ALT: tl.constexpr):  # fmt: skip
    # the whole row in registers, read once; the target by a scalar load, the one-hot
    # subtracted by a second store of that one element after a barrier
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    valid = t != -100
    tc = tl.where(valid, t, 0)
    cols = tl.arange(0, BLOCK)
    ok = cols < V
    xb = tl.load(x_ptr + row * XS + cols, mask=ok, other=float("-inf"))
    mx = tl.max(xb.to(tl.float32), 0)
    ssum = tl.sum(tl.exp(_widen(xb, False) - mx), 0)
    lse = mx + tl.log(ssum)
    picked = tl.load(x_ptr + row * XS + tc).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
    scale = tl.where(valid, 1.0 / tl.load(count_ptr), 0.0)
    g = tl.exp(_widen(xb, ALT) - lse) * scale
    tl.store(g_ptr + row * GS + cols, g.to(tl.bfloat16), mask=ok)
    tl.debug_barrier()
    pt = tl.exp(picked - lse)
    tl.store(g_ptr + row * GS + tc, ((pt - 1.0) * scale).to(tl.bfloat16), mask=valid)


@triton.jit
def ce_peeled(x_ptr, t_ptr, loss_ptr, g_ptr, count_ptr, n_rows, V, XS, GS,
              CHUNK: tl.constexpr, SAME: tl.constexpr, EVICT: tl.constexpr,
              PERSIST: tl.constexpr):  # fmt: skip
    # the lean looped form with each row's body walked from its first 16-byte boundary
    # (8 bf16 columns): a row of odd length starts anywhere, so without this every access
    # is 2 bytes wide. The <= 7 columns before the boundary and the <= 7 after the last full
    # group of 8 are one 16-wide masked "edge" load. SAME: the gradient's rows share the
    # logits' stride, so its stores take the same boundary. PERSIST: a grid of fewer
    # programs than rows, each walking rows pid, pid + grid, ... (fewer rows in flight,
    # so the second pass finds its row in L2)
    ar = tl.arange(0, CHUNK)
    e16 = tl.arange(0, 16)
    count = tl.load(count_ptr)
    step = tl.num_programs(0) if PERSIST else 1
    stop = n_rows if PERSIST else tl.program_id(0) + 1
    for r in range(tl.program_id(0), stop, step):
        row = tl.cast(r, tl.int64)
        t = tl.load(t_ptr + row)
        valid = t != -100
        tc = tl.where(valid, t, 0)
        tt = tc.to(tl.int32)
        base = row * XS
        head = tl.minimum((8 - base % 8) % 8, V).to(tl.int32)
        nbody = (V - head) // 8 * 8
        nbody = tl.multiple_of(nbody, 8)
        xbody = x_ptr + tl.multiple_of(base + head, 8)
        ecol = tl.where(e16 < 8, e16, head + nbody + e16 - 8)
        eok = tl.where(e16 < 8, e16 < head, ecol < V)
        xe = tl.load(x_ptr + base + ecol, mask=eok, other=float("-inf")).to(tl.float32)
        m = tl.full((CHUNK,), float("-inf"), tl.float32)
        s = tl.zeros((CHUNK,), tl.float32)
        for off in range(0, nbody, CHUNK):
            cols = off + ar
            ok = cols < nbody
            xb = _load(xbody + cols, ok, float("-inf"), EVICT, "evict_last")
            m, s = _online(m, s, xb.to(tl.float32))
        mx = tl.maximum(tl.max(m, 0), tl.max(xe, 0))
        ssum = tl.sum(s * tl.exp(m - mx), 0) + tl.sum(tl.exp(xe - mx), 0)
        lse = mx + tl.log(ssum)
        picked = tl.load(x_ptr + base + tc).to(tl.float32)
        tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
        scale = tl.where(valid, 1.0 / count, 0.0)
        ge = (tl.exp(xe - lse) - (ecol == tt).to(tl.float32)) * scale
        tl.store(g_ptr + row * GS + ecol, ge.to(tl.bfloat16), mask=eok)
        if SAME:
            gbody = g_ptr + tl.multiple_of(row * GS + head, 8)
        else:
            gbody = g_ptr + row * GS + head
        for off in range(0, nbody, CHUNK):
            cols = off + ar
            ok = cols < nbody
            xb = _load(xbody + cols, ok, 0.0, EVICT, "evict_first")
            hit = ((cols + head) == tt).to(tl.float32)
            g = (tl.exp(xb.to(tl.float32) - lse) - hit) * scale
            tl.store(gbody + cols, g.to(tl.bfloat16), mask=ok)


@dataclass(frozen=True)
class Var:
    name: str
    kind: str  # looped | peeled | resident | fuser | eager | compile
    chunk: int = 4096
    warps: int = 8
    gather: bool = False
    i32: bool = False
    lse: bool = False
    evict: bool = False
    floor: int = 0
    alt: bool = False
    persist: int = 0  # peeled: programs a SM (0: one program a row)
    same: bool = False  # the gradient's rows take the logits' stride


ALL = dict(gather=True, i32=True, lse=True)
VARS = [
    Var("fuser", "fuser"),
    Var("fuser-same", "fuser", same=True),
    Var("base", "looped"),  # fuser's form, hand-written: 8 warps, 4096 columns a step
    Var("gather", "looped", gather=True),
    Var("i32", "looped", i32=True),
    Var("lse", "looped", lse=True),
    Var("evict", "looped", evict=True),
    Var("lean", "looped", **ALL),
    Var("lean+evict", "looped", evict=True, **ALL),
    Var("lean-w4c2048", "looped", chunk=2048, warps=4, **ALL),
    Var("lean-w4c1024", "looped", chunk=1024, warps=4, **ALL),
    Var("lean-w16c4096", "looped", chunk=4096, warps=16, **ALL),
    Var("lean-w8c2048", "looped", chunk=2048, warps=8, **ALL),
    Var("lean+evict-w4c2048", "looped", chunk=2048, warps=4, evict=True, **ALL),
    Var("floor2", "looped", floor=2),
    Var("floor1", "looped", floor=1),
    Var("resident", "resident", warps=32),
    Var("resident-alt", "resident", warps=32, alt=True),
    Var("resident-w16-alt", "resident", warps=16, alt=True),
    Var("peeled-w8c2048", "peeled", chunk=2048, warps=8, evict=True),
    Var("peeled-w4c2048", "peeled", chunk=2048, warps=4, evict=True),
    Var("peeled-w16c4096", "peeled", chunk=4096, warps=16, evict=True),
    Var("peeled-w32c8192", "peeled", chunk=8192, warps=32, evict=True),
    Var("peeled-same-w8c2048", "peeled", chunk=2048, warps=8, evict=True, same=True),
    Var("peeled-same-w16c4096", "peeled", chunk=4096, warps=16, evict=True, same=True),
    Var("peeled-p2-w16c4096", "peeled", chunk=4096, warps=16, evict=True, persist=2),
    Var("peeled-p4-w8c2048", "peeled", chunk=2048, warps=8, evict=True, persist=4),
    Var("peeled-p1-w32c8192", "peeled", chunk=8192, warps=32, evict=True, persist=1),
    Var("peeled-p2-w32c8192", "peeled", chunk=8192, warps=32, evict=True, persist=2),
    Var("lean+evict-w32c8192", "looped", chunk=8192, warps=32, evict=True, **ALL),
    Var("lean+evict-w16c8192", "looped", chunk=8192, warps=16, evict=True, **ALL),
    Var("eager", "eager"),
    Var("torch.compile", "compile"),
]


def make_inputs(rows: int, cols: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows + cols)
    base = (torch.randn(rows, stride, generator=g) * 2).to(BF16).cuda()
    t = torch.randint(0, cols, (rows,), generator=g)
    t[::61] = -100
    return base[:, :cols], t.cuda()


def run_variant(v: Var, x: torch.Tensor, t: torch.Tensor, gs: int):
    rows, V = x.shape
    if v.kind in ("eager", "compile"):
        fn = lambda a, b: F.cross_entropy(a.float(), b)  # noqa: E731
        if v.kind == "compile":
            torch._dynamo.reset()
            fn = torch.compile(fn, dynamic=False)

        def ref():
            xr = x.detach().requires_grad_(True)
            loss = fn(xr, t)
            return loss.detach(), torch.autograd.grad(loss, xr)[0]

        return ref
    if v.kind == "fuser":
        from fuser.dynamo.ce_region import one_pass_fusion

        # same: the gradient's rows as the logits' (what torch.compile gives logits that
        # are a graph input), else 16-byte aligned (logits made in the graph)
        fd = one_pass_fusion(x, t, aligned=not v.same)

        def fus():
            outs = fd.execute([x, t], backend="triton")
            return outs[0], outs[1]

        return fus

    def hand():
        count = (t != -100).sum().float()
        loss_rows = torch.empty(rows, dtype=torch.float32, device=x.device)
        g_stride = x.stride(0) if v.same else gs
        g = torch.empty_strided((rows, V), (g_stride, 1), dtype=BF16, device=x.device)
        args = (x, t, loss_rows, g, count, V, x.stride(0), g_stride)
        if v.kind == "peeled":
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            grid = min(rows, sms * v.persist) if v.persist else rows
            ce_peeled[(grid,)](x, t, loss_rows, g, count, rows, *args[5:], CHUNK=v.chunk,
                               SAME=v.same, EVICT=v.evict, PERSIST=bool(v.persist),
                               num_warps=v.warps)  # fmt: skip
        elif v.kind == "resident":
            ce_resident[(rows,)](*args, BLOCK=triton.next_power_of_2(V), ALT=v.alt,
                                 num_warps=v.warps)  # fmt: skip
        else:
            ce_looped[(rows,)](*args, CHUNK=v.chunk, GATHER=v.gather, I32=v.i32, LSE=v.lse,
                               EVICT=v.evict, FLOOR=v.floor, num_warps=v.warps)  # fmt: skip
        return loss_rows.sum() / count, g

    return hand


def check(got, ref) -> str | None:
    loss, g = got
    if not torch.allclose(loss.float(), ref[0].float(), rtol=1e-4, atol=1e-4):
        return f"loss {loss.item():.6f} vs {ref[0].item():.6f}"
    err = (g.float() - ref[1].float()).abs().max().item()
    tol = 3 * 2**-8 * ref[1].float().abs().max().item() + 1e-9
    return None if err <= tol else f"grad max err {err:.3g} (tol {tol:.3g})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x50257x50304,16384x32000x32000,8192x50257x50257")
    ap.add_argument("--variants", default=",".join(v.name for v in VARS))
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--aligned-walk",
        choices=["default", "on", "off"],
        default="default",
        help="the Triton backend's aligned-start walk (Limits.aligned_walk) for fuser's rows, "
        "set before anything is planned (plans are kept per process)",
    )
    a = ap.parse_args()
    if a.aligned_walk != "default":
        import dataclasses

        from fuser.backends.registry import get_backend

        be = get_backend("triton")
        limits = dataclasses.replace(be.limits, aligned_walk=a.aligned_walk == "on")
        object.__setattr__(be, "limits", limits)
    names = a.variants.split(",")
    ceiling = copy_gbps()
    rows_out = []
    print(f"{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; L2 flushed; "
          f"GB/s count one read of the logits and one write of the gradient")  # fmt: skip
    for shape in a.shapes.split(","):
        rows, V, XS = (int(s) for s in shape.split("x"))
        x, t = make_inputs(rows, V, XS)
        gs = (V + 7) // 8 * 8
        ref = run_variant(Var("eager", "eager"), x, t, gs)()
        nbytes = 2 * rows * V * 2
        for v in VARS:
            if v.name not in names:
                continue
            try:
                fn = run_variant(v, x, t, gs)
                bad = check(fn(), ref)
                ms = bench_ms(fn)
            except Exception as e:  # a variant that fails to compile is reported
                print(f"| {shape} | {v.name} | error {type(e).__name__}: {str(e)[:200]}")
                continue
            r = dict(shape=shape, variant=v.name, ms=ms, gbps=nbytes / ms / 1e6,
                     copy_gbps=ceiling, ok=bad is None, error=bad)  # fmt: skip
            rows_out.append(r)
            pct = 100 * r["gbps"] / ceiling
            verdict = "ok" if bad is None else bad
            gbps = r["gbps"]
            print(f"| {shape} | {v.name} | {ms:.4f} ms | {gbps:.0f} GB/s | {pct:.0f}% | {verdict}")
            sys.stdout.flush()
    if a.out:
        with open(a.out, "w") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The GEMM template against cuBLAS + a separate pointwise kernel and Inductor (issue 22).

    python benchmarks/gemm_bench.py --out $OUT/gemm.json [--sweep] [--no-inductor]

At GPT-2 124M's shapes (M = B·T = 16384 rows, bf16), each GEMM with the pointwise work
around it in training:
  fc      X[M,768] @ W[3072,768]ᵀ + b -> GELU(tanh), the pre-activation kept (saved)
  proj    H[M,3072] @ W[768,3072]ᵀ + b + residual
  qkv     X[M,768] @ W[2304,768]ᵀ + b
  dx_fc   (dY[M,768] @ W_proj[768,3072]) * GELU'(pre)     the MLP's dX with GELU backward
  dw_fc   dPreᵀ @ X -> [3072, 768] (K = M), db = colsum(dPre)    dW with the bias gradient
  dw_proj dYᵀ @ H -> [768, 3072] (K = M), db = colsum(dY)
  dw_attn dYᵀ @ Y -> [768, 768] (K = M), db = colsum(dY)  the attention projection's dW
it times (median by triton.testing.do_bench, L2 flushed between runs):
  template         fuser's Triton GEMM template (fuser/runtime/gemm.py), planner tiles
  template unsplit the planner's best tiles without split-K (dW rows where it splits K:
                   the split's deterministic fp32 partials + finalize against one pass)
  cublas+eager     torch.addmm/mm and the pointwise work as separate eager ops
  cublas+fuser     the same function under torch.compile(backend="fuser"), FUSER_GEMM=aten:
                   cuBLAS and fuser's fused pointwise kernel
  fuser-template   the same under torch.compile(backend="fuser"), FUSER_GEMM=template
                   (its row lists each GEMM kernel's first launch: "warmed up" when the
                   graph's precompile compiled it, runtime/precompile.py)
  fuser-auto       the same with FUSER_GEMM=auto: the choice (measured on first use, the
                   explain lines in the row)
  inductor-max-autotune  torch.compile(mode="max-autotune-no-cudagraphs")
and reports ms, TFLOP/s (2·M·N·K) and % of the H100's 989 dense bf16 TFLOP/s, the
roofline estimate the heuristic uses (schedulers/gemm_choice.estimate) beside it, and each
result's max error against an fp64 reference of the same bf16 inputs, checked before
timing. --sweep also times the template at every candidate tile (the heuristic's table).
One JSON document (meta and rows) in --out; a table on stdout. --smoke runs it all at
tiny fp32 shapes on CPU (Triton's interpreter, no Inductor), untimed: a check of the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import triton

from fuser.config import config
from fuser.dynamo.backend import FuserBackend
from fuser.runtime.gemm import gemm, plan_for, shape_of
from fuser.schedulers import device as devices
from fuser.schedulers.gemm import GPU_TILES, Epilogue, plan_gemm, retile
from fuser.schedulers.gemm_choice import estimate

PEAK_TFLOPS = 989.0  # H100 SXM dense bf16
GPT2_DIMS = (16384, 768, 3072, 2304)  # M = B*T rows, C, the MLP's hidden size, QKV's width
SMOKE_DIMS = (37, 29, 45, 23)  # --smoke: the script end to end on CPU, interpreted
BF16 = torch.bfloat16
aten = torch.ops.aten
SUMS = Epilogue(reduce="a_rows")  # dW with db: the row sums of dYᵀ (its columns' sums)


def _gelu_bw(g: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    return aten.gelu_backward(g, pre, approximate="tanh")


def _cases(device: str, dims: tuple[int, int, int, int]) -> dict[str, dict]:
    """Per case: inputs, the function (torch ops), the template call, FLOPs."""
    M, C, HID, QKV = dims  # noqa: N806
    g = torch.Generator(device=device).manual_seed(0)
    dtype = BF16 if device == "cuda" else torch.float32  # the interpreter's smoke run: fp32

    def r(*s: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*s, device=device, generator=g) * scale).to(dtype)

    x, h = r(M, C), r(M, HID)
    w_fc, w_proj, w_qkv = r(HID, C, scale=C**-0.5), r(C, HID, scale=HID**-0.5), r(QKV, C)
    b_fc, b_proj, b_qkv = r(HID), r(C), r(QKV)
    res, dy, pre, dpre, y = r(M, C), r(M, C), r(M, HID), r(M, HID), r(M, C)
    gelu = Epilogue(bias=True, activation="gelu_tanh", aux=True)
    return {
        "fc": dict(
            inputs=(x, w_fc, b_fc),
            fn=_fc,
            template=lambda x, w, b, plan=None: gemm(x, w.t(), gelu, bias=b, plan=plan)[:2],
            epilogue=gelu, mnk=(M, HID, C), ab=(x, w_fc.t()),
        ),
        "proj": dict(
            inputs=(h, w_proj, b_proj, res),
            fn=lambda h, w, b, r: r + F.linear(h, w, b),
            template=lambda h, w, b, r, plan=None: gemm(
                h, w.t(), Epilogue(bias=True, residual=True), bias=b, residual=r, plan=plan
            )[0],
            epilogue=Epilogue(bias=True, residual=True), mnk=(M, C, HID), ab=(h, w_proj.t()),
        ),
        "qkv": dict(
            inputs=(x, w_qkv, b_qkv),
            fn=lambda x, w, b: F.linear(x, w, b),
            template=lambda x, w, b, plan=None: gemm(
                x, w.t(), Epilogue(bias=True), bias=b, plan=plan
            )[0],
            epilogue=Epilogue(bias=True), mnk=(M, QKV, C), ab=(x, w_qkv.t()),
        ),
        "dx_fc": dict(
            inputs=(dy, w_proj, pre),
            fn=lambda dy, w, pre: _gelu_bw(dy @ w, pre),
            template=lambda dy, w, pre, plan=None: gemm(
                dy, w, Epilogue(gelu_grad="gelu_tanh"), pre=pre, plan=plan
            )[0],
            epilogue=Epilogue(gelu_grad="gelu_tanh"), mnk=(M, HID, C), ab=(dy, w_proj),
        ),
        "dw_fc": dict(
            inputs=(dpre, x),
            fn=lambda d, x: (d.t() @ x, d.sum(0)),
            template=lambda d, x, plan=None: gemm(d.t(), x, SUMS, plan=plan)[::2],
            epilogue=Epilogue(reduce="a_rows"), mnk=(HID, C, M), ab=(dpre.t(), x),
        ),
        "dw_proj": dict(
            inputs=(dy, h),
            fn=lambda d, h: (d.t() @ h, d.sum(0)),
            template=lambda d, h, plan=None: gemm(d.t(), h, SUMS, plan=plan)[::2],
            epilogue=Epilogue(reduce="a_rows"), mnk=(C, HID, M), ab=(dy.t(), h),
        ),
        "dw_attn": dict(
            inputs=(dy, y),
            fn=lambda d, y: (d.t() @ y, d.sum(0)),
            template=lambda d, y, plan=None: gemm(d.t(), y, SUMS, plan=plan)[::2],
            epilogue=Epilogue(reduce="a_rows"), mnk=(C, C, M), ab=(dy.t(), y),
        ),
    }  # fmt: skip


def _fc(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pre = F.linear(x, w, b)
    return F.gelu(pre, approximate="tanh"), pre


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _reference(case: dict) -> list[torch.Tensor]:
    """The case's function in fp64 on the same (bf16-valued) inputs."""
    return _flat(case["fn"](*(t.double() for t in case["inputs"])))


def _error(got: Any, ref: list[torch.Tensor]) -> float:
    """The largest error over the results, relative to each reference's largest value."""
    return max(
        ((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        for g, r in zip(_flat(got), ref, strict=True)
    )


def _time(fn: Callable[[], Any]) -> float:
    if not torch.cuda.is_available():  # --smoke: only that the timing runs
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _compiled(fn: Callable, **kw: Any) -> Callable:
    torch._dynamo.reset()  # a fresh compile for each backend and mode (the choice is made then)
    return torch.compile(fn, **kw)


def _impls(case: dict, inductor: bool) -> list[tuple[str, Callable[[], Callable]]]:
    """(name, a maker of the callable): compiled ones are made, with their mode set, when
    their turn comes."""

    def fuser_with(mode: str) -> Callable:
        config.gemm = mode
        backend = FuserBackend()  # its own captures: the row's explain lines
        fn = _compiled(case["fn"], backend=backend)
        fn.fuser_notes = lambda: [n for c in backend.captures for g in c.graphs for n in g.gemm]
        fn.fuser_first_launches = lambda: {
            k.name: k.origin
            for c in backend.captures
            for k in c.timings.kernels
            if k.name.startswith("gemm_")
        }
        return fn

    impls = [
        ("template", lambda: case["template"]),
        ("cublas+eager", lambda: case["fn"]),
        ("cublas+fuser", lambda: fuser_with("aten")),
        ("fuser-template", lambda: fuser_with("template")),
        ("fuser-auto", lambda: fuser_with("auto")),  # the choice, measured on first use
    ]
    if inductor:
        impls.append(
            ("inductor-max-autotune",
             lambda: _compiled(case["fn"], mode="max-autotune-no-cudagraphs"))
        )  # fmt: skip
    return impls


def _case_rows(name: str, case: dict, meta: dict, inductor: bool, sweep: bool) -> list[dict]:
    m, n, k = case["mnk"]
    flops = 2.0 * m * n * k
    e = case["epilogue"]
    shape = shape_of(*case["ab"], e)
    plan = plan_for(shape, e)
    device = devices.current()
    est = estimate(shape, e, device, plan)
    ref = _reference(case)
    impls = _impls(case, inductor)
    if plan.split:  # the split-K row's baseline: the best plan that does not split K
        one = plan_gemm(shape, e, device.sms, device, allow_split=False)
        impls.insert(1, ("template unsplit", lambda: partial(case["template"], plan=one)))
    if sweep:
        for tiles, _eff in GPU_TILES:
            p = retile(plan, tiles, "sweep")
            impls.append(
                (f"template {tiles.line()}", lambda p=p: partial(case["template"], plan=p))
            )
    rows = []
    for impl, make in impls:
        row = {"case": name, "M": m, "N": n, "K": k, "fused": e.ops(), "impl": impl} | meta
        if impl == "template":
            row |= {"plan": plan.name, "tiles": plan.tiles.line(), "why": list(plan.reasons)}
        elif impl == "template unsplit":
            row |= {"plan": one.name, "tiles": one.tiles.line(), "why": list(one.reasons)}
        row |= {"estimate_template_us": est.template_us, "estimate_aten_us": est.aten_us}
        t0 = time.perf_counter()
        try:
            fn = make()
            got = fn(*case["inputs"])  # compiles (Triton, Dynamo, Inductor's autotune)
            got = fn(*case["inputs"])  # fuser's call program is built at the first call
            row["first_calls_s"] = time.perf_counter() - t0
            row["max_rel_err"] = _error(got, ref)
            if hasattr(fn, "fuser_notes"):  # what fuser chose for each matmul, and why
                row["explain"] = fn.fuser_notes()
                row["first_launches"] = fn.fuser_first_launches()
            ms = _time(lambda fn=fn: fn(*case["inputs"]))
            row |= {"ms": ms, "tflops": flops / ms / 1e9}
            row["pct_peak"] = 100 * row["tflops"] / PEAK_TFLOPS
        except Exception as ex:  # an implementation that fails: a row that says so
            row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        rows.append(row)
        _print(row)
    config.gemm = "aten"
    torch.cuda.empty_cache()
    return rows


def _print(r: dict) -> None:
    head = f"{r['case']:8} {r['impl'][:70]:70}"
    if "error" in r:
        print(f"{head} {r['error']}", flush=True)
        return
    print(
        f"{head} {r['ms']:7.3f} ms {r['tflops']:6.1f} TF/s ({r['pct_peak']:4.1f}% of peak) "
        f"err {r['max_rel_err']:.1e}  [first calls {r['first_calls_s']:.1f}s; estimate "
        f"template {r['estimate_template_us']:.0f} us, cuBLAS+separate "
        f"{r['estimate_aten_us']:.0f} us]",
        flush=True,
    )


def _summary(rows: list[dict]) -> None:
    """Issue 22's targets: the template faster than cuBLAS + the best separate kernel, and
    at least as fast as Inductor's max-autotune, at each shape."""
    for case in dict.fromkeys(r["case"] for r in rows):
        ok = {r["impl"]: r["ms"] for r in rows if r["case"] == case and "ms" in r}
        if "template" not in ok:
            continue
        t = ok["template"]
        sep = min((ok[i] for i in ("cublas+eager", "cublas+fuser") if i in ok), default=None)
        ind = ok.get("inductor-max-autotune")
        parts = [f"{case}: template {t:.3f} ms"]
        if sep is not None:
            parts.append(f"{sep / t:.2f}x of cuBLAS + best separate ({sep:.3f} ms)")
        if ind is not None:
            parts.append(f"{ind / t:.2f}x of Inductor max-autotune ({ind:.3f} ms)")
        if "template unsplit" in ok:
            one = ok["template unsplit"]
            parts.append(f"split-K {one / t:.2f}x of the unsplit template ({one:.3f} ms)")
        print(", ".join(parts), flush=True)


def run(
    out_path: str | None, inductor: bool, sweep: bool, only: list[str], smoke: bool = False
) -> list[dict]:
    import torch._inductor.config as inductor_config

    # the default search space (not EXHAUSTIVE) keeps max-autotune's compiles to minutes
    inductor_config.max_autotune_gemm_search_space = "DEFAULT"
    meta = {
        "device": "cpu (smoke run)" if smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.node(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    t0 = time.perf_counter()
    rows = []
    cases = _cases("cpu", SMOKE_DIMS) if smoke else _cases("cuda", GPT2_DIMS)
    for name, case in cases.items():
        if not only or name in only:
            print(f"-- {name} ({time.perf_counter() - t0:.0f}s so far)", flush=True)
            rows += _case_rows(name, case, meta, inductor, sweep)
    _summary(rows)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"done in {time.perf_counter() - t0:.0f}s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON results to this file")
    p.add_argument("--sweep", action="store_true", help="also time every candidate tile")
    p.add_argument("--no-inductor", action="store_true", help="skip max-autotune (slow)")
    p.add_argument("--case", action="append", default=[], help="only these cases")
    p.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on CPU: no timing")
    a = p.parse_args()
    if not a.smoke and not torch.cuda.is_available():
        raise SystemExit("gemm_bench needs a CUDA GPU (--smoke runs it on CPU, untimed)")
    run(a.out, not a.no_inductor and not a.smoke, a.sweep, a.case, a.smoke)


if __name__ == "__main__":
    main()

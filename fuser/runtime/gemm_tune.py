"""The GEMM choice with its measurement: FUSER_GEMM=auto on a GPU times, on first use, the
template at its planned tiles and at up to two other candidate tiles against cuBLAS plus
the separate pointwise op (random data of the shape), and caches the result on disk
(runtime/cache: one JSON entry per shape, fused work and GPU), so a later process decides
without timing again. explain shows the measurement beside the roofline estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fuser.config import config
from fuser.runtime.cache import digest, load_entry, store_entry
from fuser.runtime.gemm import aten_gemm, gemm, plan_for
from fuser.runtime.timing import median_ms
from fuser.schedulers import device as devices
from fuser.schedulers.gemm import GPU_TILES, TORCH_DTYPES, Epilogue, GemmShape, retile, unsupported
from fuser.schedulers.gemm_choice import GemmChoice, choose

_measured: dict[tuple, dict] = {}
TUNE_CANDIDATES = 3  # tile configurations timed on first use (the planned one first)


def decide(
    shape: GemmShape,
    epilogue: Epilogue,
    mode: str | None = None,
    template_backend: bool = True,
) -> GemmChoice:
    """Template or cuBLAS for one matmul (runtime/gemm.shape_of) with `epilogue`, with
    the reasons; FUSER_GEMM=auto on a GPU measures it on first use."""
    mode = config.gemm if mode is None else mode
    why = unsupported(shape, epilogue)
    measured = None
    if mode == "auto" and why is None and template_backend and not epilogue.empty:
        if shape.device == "cuda":
            measured = measurement(shape, epilogue)
    return choose(shape, epilogue, why, mode, devices.current(), template_backend, measured)


def measurement(shape: GemmShape, epilogue: Epilogue) -> dict:
    """The cached timing of template vs cuBLAS + separate op on this GPU, timed if missing."""
    name = torch.cuda.get_device_name()
    key = (shape, epilogue, name)
    if key in _measured:
        return _measured[key]
    entry_key = digest("gemm", dataclasses.astuple(shape), dataclasses.astuple(epilogue), name)
    body = load_entry("gemm", entry_key)
    if body is None:
        with unset_fake_temporarily():
            body = _time(shape, epilogue)
        body["device"] = name
        store_entry("gemm", entry_key, body)
    _measured[key] = body
    return body


def _inputs(shape: GemmShape, e: Epilogue) -> tuple[torch.Tensor, torch.Tensor, dict]:
    s = shape
    dt, a_dt = TORCH_DTYPES[s.dtype], TORCH_DTYPES[s.a_dtype]
    a = torch.randn(s.m, s.k, device="cuda", dtype=a_dt)
    b = torch.randn(s.k, s.n, device="cuda", dtype=dt) / s.k**0.5
    kw: dict[str, Any] = {"out_dtype": TORCH_DTYPES[s.out_dtype]}
    if e.bias:
        kw["bias"] = torch.randn(s.n, device="cuda", dtype=dt)
    if e.residual:
        kw["residual"] = torch.randn(s.m, s.n, device="cuda", dtype=kw["out_dtype"])
    if e.gelu_grad != "none":
        kw["pre"] = torch.randn(s.m, s.n, device="cuda", dtype=dt)
    if e.a_scale:
        kw["scale"] = 0.5
    if e.mask:
        kw["mask"] = torch.rand(s.m, s.n, device="cuda") > 0.1
        kw["mask_scale"] = 1 / 0.9
    return a, b, kw


def _time(shape: GemmShape, e: Epilogue, reps: int = 10) -> dict:
    """Median ms of the template (best of the candidate tiles) and of cuBLAS + ATen ops."""
    a, b, kw = _inputs(shape, e)
    base = plan_for(shape, e)
    plans = [base]
    for tiles, _eff in GPU_TILES:
        if len(plans) >= TUNE_CANDIDATES:
            break
        if tiles != base.tiles and tiles.block_m <= shape.m and tiles.block_n <= shape.n:
            plans.append(retile(base, tiles, "autotune candidate"))
    timed, wrong = [], []
    want = aten_gemm(a, b, e, **kw)
    for p in plans:
        try:
            if not agrees(gemm(a, b, e, plan=p, **kw), want):
                wrong.append(list(dataclasses.astuple(p.tiles)))
                continue  # never chosen: a wrong result is worse than a slow one
            timed.append((median_ms(lambda p=p: gemm(a, b, e, plan=p, **kw), reps), p))
        except Exception:  # a candidate that fails to compile (shared memory) is skipped
            continue
    aten_ms = median_ms(lambda: aten_gemm(a, b, e, **kw), reps)
    if not timed:
        return {"template_ms": float("inf"), "aten_ms": aten_ms, "tiles": None, "wrong": wrong}
    ms, best = min(timed, key=lambda x: x[0])
    tiles = list(dataclasses.astuple(best.tiles))
    return {"template_ms": ms, "aten_ms": aten_ms, "tiles": tiles, "wrong": wrong}


def agrees(got: Any, want: Any) -> bool:
    """Whether the template's outputs match cuBLAS + ATen's on the timing inputs: each
    within 2% of the reference's largest magnitude (bf16 rounding over a long K stays far
    inside it; a wrong tile, as measured at 128x256 with a sum, is off by the values)."""
    for g, w in zip(got, want):
        if (g is None) != (w is None):
            return False
        if g is None:
            continue
        if g.shape != w.shape:
            return False
        ref = w.float()
        scale = ref.abs().max().item() if ref.numel() else 0.0
        if ref.numel() and (g.float() - ref).abs().max().item() > 0.02 * scale + 1e-3:
            return False
    return True

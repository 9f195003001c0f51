"""Tiny transformers families through torch.compile: eager, aot_eager and fuser side by side.

    python benchmarks/families.py                          # all ~100 families (hours on a CPU)
    python benchmarks/families.py --only mamba bart resnet # a few
    python benchmarks/families.py --only mobilevit --phases train --dtype float64
    python benchmarks/families.py --only bloom codegen --amp  # under bf16 autocast: the
        # noise is then eager's own distance from its fp32 step
    python benchmarks/families.py --out benchmarks/results/<dir>   # + results.jsonl, table.md
    python benchmarks/families.py --list
    python benchmarks/families.py --render benchmarks/results/<dir>/results.jsonl  # its table

Each family (benchmarks/family_configs.py: random weights, no download) runs up to three
phases from the same weights and inputs:

- train: two AdamW steps; err is the larger of the losses' difference (relative, absolute
  below 1) and the worst parameter gradient's relative error after the first step (by its
  norm, with fuser.suite's floor of 1e-4 of the largest gradient's, since a gradient that
  is zero in exact arithmetic, an attention key's bias, is rounding noise for every
  backend);
- eval: a forward in eval mode; err is the relative error of the logits (by their norm);
- gen: greedy generate, 4 new tokens, with the model's forward compiled (decoders,
  seq2seq); err is the relative error of the scores, inf where the tokens differ.

Eager is the reference. aot_eager (Dynamo and AOTAutograd, no compiler) shows what capture
alone does: a failure it shares is not fuser's (a Dynamo error, a model whose output
depends on ties). "1-ulp noise" is eager's own error when every weight moves by one
rounding step: how far rounding alone can move this model (with --amp, bf16 autocast on
every phase: eager's distance from its own fp32 run). A phase passes within 1e-3
(train) or 1e-4 (eval, gen); beyond that, within twice the noise plus a tenth of the
tolerance is "ok~" (rounding; --dtype float64 then shows whether fuser matches), and
within twice aot_eager's error "as aot_eager" (Dynamo or transformers' compiled path
computes something else than eager: not fuser's). captures: graphs Dynamo compiled,
breaks: graph breaks (both from torch._dynamo's counters, fuser's run). Models run on the
GPU where there is one (not yet tried there); on a CPU Triton's interpreter runs the
kernels (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from family_configs import BY_NAME, SPECS, Spec  # noqa: E402

from fuser.dynamo import FuserBackend  # noqa: E402
from fuser.suite.run import Result, _grad_errors, coverage  # noqa: E402

PHASES = ("train", "eval", "gen")
TOL = {"train": 1e-3, "eval": 1e-4, "gen": 1e-4}
GENERATES = ("decoder", "seq2seq", "whisper")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# --amp: every phase under bf16 autocast (mixed dtypes: fp32 weights and norms, bf16
# matmuls), for eager, aot_eager and fuser alike
AMP = {"on": False}


def build(spec: Spec, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """The family's tiny model with the seed's random weights and its dropouts off."""
    import transformers

    transformers.logging.set_verbosity_error()
    fields = dict(spec.fields)
    if spec.attn is not None:
        fields["attn_implementation"] = spec.attn
    for attempt in range(2):
        cfg = getattr(transformers, spec.config)(**fields)
        _zero_dropouts(cfg)
        torch.manual_seed(seed)
        try:
            return getattr(transformers, spec.cls)(cfg).to(DEVICE, dtype)
        except ValueError as e:  # no SDPA in this family: its own attention
            if attempt or "scaled_dot_product_attention" not in str(e):
                raise
            fields.pop("attn_implementation")
    raise AssertionError("unreachable")


def _zero_dropouts(cfg: Any) -> None:
    for k, v in list(vars(cfg).items()):
        if isinstance(v, float) and "drop" in k:
            setattr(cfg, k, 0.0)
        elif hasattr(v, "to_dict") and hasattr(v, "__dict__"):  # a sub-configuration
            _zero_dropouts(v)
        elif isinstance(v, dict) and k == "attn_config":  # MPT's
            for kk in v:
                if "pdrop" in kk:
                    v[kk] = 0.0


def inputs(spec: Spec, model: torch.nn.Module, seed: int, labels: bool, n: int = 16) -> dict:
    """One batch of 2 of the family's kind on the model's device: token ids (n of them),
    32x32 images, 800 audio samples or mel features; labels for the training phase."""
    out = _batch(spec, model, seed, labels, 2, n)
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def _batch(spec: Spec, model: torch.nn.Module, seed: int, labels: bool, b: int, n: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    cfg, dtype = model.config, next(model.parameters()).dtype

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    def ids(vocab: int) -> torch.Tensor:
        return torch.randint(3, vocab, (b, n), generator=g)

    if spec.kind == "vision":
        out = {"pixel_values": randn(b, 3, 32, 32)}
        if labels:
            out["labels"] = torch.randint(0, cfg.num_labels, (b,), generator=g)
        return out
    if spec.kind == "mae":
        return {"pixel_values": randn(b, 3, 32, 32), "noise": randn(b, 16).abs()}
    if spec.kind == "audio":
        out = {"input_values": randn(b, 800)}
        if labels:
            out["labels"] = torch.randint(1, cfg.vocab_size, (b, 6), generator=g)
        return out
    if spec.kind == "clip":
        out = {"input_ids": ids(cfg.text_config.vocab_size), "pixel_values": randn(b, 3, 32, 32)}
        if labels:
            out["return_loss"] = True
        return out
    if spec.kind == "whisper":
        out = {"input_features": randn(b, cfg.num_mel_bins, 2 * cfg.max_source_positions)}
        out["labels" if labels else "decoder_input_ids"] = ids(cfg.vocab_size)
        return out
    out = {"input_ids": ids(cfg.vocab_size)}
    if spec.kind == "seq2seq":
        out["labels" if labels else "decoder_input_ids"] = ids(cfg.vocab_size)
    elif labels:
        out["labels"] = out["input_ids"].clone()
    return out


def _primary(spec: Spec, out: Any) -> torch.Tensor:
    if spec.kind == "clip":
        return out["logits_per_image"]
    return out["logits"] if getattr(out, "logits", None) is not None else out[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return math.inf
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


# -- phases: each runs the model through `wrap` (identity, or torch.compile) -------------
Wrap = Callable[[Callable], Callable]


def observe_train(spec: Spec, base: torch.nn.Module, wrap: Wrap) -> dict:
    model = copy.deepcopy(base).train()
    fwd = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, grads = [], {}
    for i in range(2):
        out = fwd(**inputs(spec, model, seed=1 + i, labels=True))
        loss = out.loss if hasattr(out, "loss") else out[0]
        loss.backward()
        if i == 0:
            grads = {
                n: p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.grad is not None
            }
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


def observe_eval(spec: Spec, base: torch.nn.Module, wrap: Wrap) -> dict:
    model = copy.deepcopy(base).eval()
    with torch.no_grad():
        return {"out": _primary(spec, wrap(model)(**inputs(spec, model, seed=5, labels=False)))}


def observe_gen(spec: Spec, base: torch.nn.Module, wrap: Wrap) -> dict:
    model = copy.deepcopy(base).eval()
    kw = inputs(spec, model, seed=7, labels=False, n=8)
    kw.pop("decoder_input_ids", None)
    if "input_ids" in kw:
        kw["attention_mask"] = torch.ones_like(kw["input_ids"])
    model.forward = wrap(model.forward)
    got = model.generate(
        **kw,
        max_new_tokens=4,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return {"seq": got.sequences, "scores": list(got.scores)}


OBSERVE = {"train": observe_train, "eval": observe_eval, "gen": observe_gen}


def error(phase: str, got: dict, want: dict) -> float:
    """How far `got` is from eager's `want` (see the module's docstring)."""
    if phase == "train":
        # by the loss, or absolute below 1: a loss a model has driven to 3e-7 is the rounding
        # of a log-sum-exp near 1 (funnel's: fp32 eager itself is 1.5% off fp64 there)
        losses = [abs(a - b) / max(abs(b), 1.0) for a, b in zip(got["losses"], want["losses"])]
        grads = _grad_errors(got["grads"], want["grads"])
        return max(losses + list(grads.values()), default=0.0)
    if phase == "eval":
        return _rel(got["out"], want["out"])
    if not torch.equal(got["seq"], want["seq"]):
        return math.inf
    return max((_rel(a, b) for a, b in zip(got["scores"], want["scores"])), default=0.0)


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in traceback.format_exception_only(exc)[-1].strip().splitlines() if ln]
    return f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"


def run_phase(
    spec: Spec, base: torch.nn.Module, phase: str, backend: str, amp: bool | None = None
) -> dict:
    """One phase with one backend ("eager", "aot_eager" or "fuser"): its observables or
    its error, and for the compiled backends what Dynamo captured."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fb = FuserBackend() if backend == "fuser" else None

    def wrap(fn: Callable) -> Callable:
        return fn if backend == "eager" else torch.compile(fn, backend=fb or backend)

    rec: dict[str, Any] = {}
    t0 = time.perf_counter()
    autocast = torch.autocast(
        DEVICE, dtype=torch.bfloat16, enabled=AMP["on"] if amp is None else amp
    )
    try:
        with autocast:
            rec["obs"] = OBSERVE[phase](spec, base, wrap)
    except Exception as e:
        rec["error"] = _last_line(e)
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    if backend != "eager":
        rec["captures"] = counters["stats"]["unique_graphs"]
        rec["breaks"] = sum(counters["graph_break"].values())
        reasons = counters["graph_break"].most_common(1)
        if reasons:
            rec["break_reason"] = reasons[0][0].splitlines()[0][:160]
    if fb is not None:
        res = Result(spec.name, "tiny", "fuser", "cpu")
        coverage(fb, res)
        rec["fused_ops"] = res.fused_ops
        rec["fell_back"] = res.fell_back[:3]
        rec["graph_errors"] = [g.error[:200] for c in fb.captures for g in c.graphs if g.error]
    return rec


def verdict(phase: str, fuser: dict, aot: dict, noise: float) -> str:
    if "error" in fuser:
        return "error (aot_eager too)" if "error" in aot else "ERROR"
    err, tol = fuser["err"], TOL[phase]
    if err <= tol:
        return "ok"
    if noise > tol and err <= 2 * noise + tol / 10:
        return "ok~"  # rounding moves this model as far
    aerr = aot.get("err", 0.0)  # 0.0: aot_eager raised, it explains nothing
    if aerr > tol and err <= 2 * aerr + tol / 10:
        return "as aot_eager"  # capture itself changes the result
    return "FAIL (aot_eager too)" if aerr > tol else "FAIL"


def _one_ulp(base: torch.nn.Module) -> torch.nn.Module:
    """`base` with each weight moved by about one rounding step (a random sign each):
    eager's error on it is the model's own sensitivity to rounding, the floor no compiler
    can be judged below (a train-mode batch norm over 8 values can swing a loss by 1e-2)."""
    model = copy.deepcopy(base)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                sign = torch.randint(0, 2, p.shape, generator=g).to(p.device, p.dtype) * 2 - 1
                p.mul_(1 + sign * torch.finfo(p.dtype).eps)
    return model


def run_family(spec: Spec, phases: list[str], dtype: torch.dtype) -> list[dict]:
    rows = []
    try:
        base = build(spec, dtype)
    except Exception as e:
        return [
            {"family": spec.name, "phase": "build", "verdict": "build error", "note": _last_line(e)}
        ]
    for phase in phases:
        if phase == "gen" and spec.kind not in GENERATES:
            continue
        eager = run_phase(spec, base, phase, "eager")
        # the noise: how far rounding alone moves eager. In fp32, one rounding step of
        # every weight; under autocast, bf16 itself: eager's distance from fp32 eager
        noisy = (
            run_phase(spec, base, phase, "eager", amp=False)
            if AMP["on"]
            else run_phase(spec, _one_ulp(base), phase, "eager")
        )
        kind = str(dtype)[6:] + ("+bf16 autocast" if AMP["on"] else "")
        row: dict[str, Any] = {"family": spec.name, "phase": phase, "dtype": kind}
        if "error" in eager:
            row.update(verdict="eager error", note=eager["error"])
            rows.append(row)
            continue
        if "obs" in noisy:
            row["noise"] = error(phase, noisy["obs"], eager["obs"])
        for backend in ("aot_eager", "fuser"):
            rec = run_phase(spec, base, phase, backend)
            if "obs" in rec:
                rec["err"] = error(phase, rec.pop("obs"), eager["obs"])
            row[backend] = rec
        row["verdict"] = verdict(phase, row["fuser"], row["aot_eager"], row.get("noise", 0.0))
        row["note"] = _note(row["fuser"])
        rows.append(row)
    return rows


def _note(f: dict) -> str:
    notes = [f["error"]] if "error" in f else []
    # a region of only views is not a fallback (it needs no kernel)
    fell = [r for r in f.get("fell_back", []) if "computes nothing" not in r]
    if fell:
        notes.append(f"{len(fell)} region(s) fell back to ATen: {fell[0][:120]}")
    notes += f.get("graph_errors", [])[:1]
    if "break_reason" in f:
        notes.append(f"break: {f['break_reason'].splitlines()[0]}")
    return "; ".join(notes)


def _fmt(x: float | None) -> str:
    return "-" if x is None else ("inf" if x == math.inf else f"{x:.2g}")


def table(rows: list[dict]) -> str:
    out = [
        "| family | phase | fuser | fuser err | aot_eager err | 1-ulp noise | captures | breaks "
        "| fused ops | s (fuser) | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, a = r.get("fuser", {}), r.get("aot_eager", {})
        aerr = "error" if "error" in a else _fmt(a.get("err"))
        dtype = f" ({r['dtype']})" if r.get("dtype", "float32") != "float32" else ""
        out.append(
            f"| {r['family']} | {r['phase']}{dtype} | {r['verdict']} | {_fmt(f.get('err'))} | "
            f"{aerr} | {_fmt(r.get('noise'))} | "
            f"{f.get('captures', '-')} | {f.get('breaks', '-')} | {f.get('fused_ops', '-')} | "
            f"{f.get('seconds', '-')} | {r.get('note', '')[:200].replace('|', '/')} |"
        )
    ok = sum(r["verdict"] in ("ok", "ok~", "as aot_eager") for r in rows)
    families = len({r["family"] for r in rows})
    out.append(f"\n{ok}/{len(rows)} phases ok, ok~ or as aot_eager ({families} families)")
    return "\n".join(out)


def load(path: Path) -> list[dict]:
    """The rows of a results.jsonl, the latest of each (family, phase, dtype), judged by
    today's rules."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    last = {(r["family"], r["phase"], r.get("dtype")): r for r in rows}
    for r in last.values():
        if "fuser" in r:
            r["verdict"] = verdict(r["phase"], r["fuser"], r["aot_eager"], r.get("noise", 0.0))
            r["note"] = _note(r["fuser"])
    return list(last.values())


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="families to run (default: all)")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated: train,eval,gen")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--amp", action="store_true", help="every phase under bf16 autocast")
    ap.add_argument("--out", type=Path, help="a folder for results.jsonl and table.md")
    ap.add_argument("--list", action="store_true", help="print the families and exit")
    ap.add_argument("--render", type=Path, help="print the table of a results.jsonl and exit")
    args = ap.parse_args(argv)
    if args.render:
        print(table(load(args.render)))
        return []
    if args.list:
        print("\n".join(f"{s.name:16s} {s.kind:8s} {s.cls}" for s in SPECS))
        return []
    unknown = [n for n in args.only or [] if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown families {unknown}; --list shows them")
    phases = [p for p in args.phases.split(",") if p]
    if any(p not in PHASES for p in phases):
        ap.error(f"--phases takes {PHASES}, not {args.phases!r}")
    specs = [BY_NAME[n] for n in args.only] if args.only else SPECS
    AMP["on"] = args.amp
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in specs:
        new = run_family(spec, phases, getattr(torch, args.dtype))
        for r in new:
            f = r.get("fuser", {})
            print(
                f"{r['family']:16s} {r['phase']:5s} {r['verdict']:22s} err {_fmt(f.get('err'))} "
                f"aot {_fmt(r.get('aot_eager', {}).get('err'))} {r.get('note', '')[:120]}",
                flush=True,
            )
            if args.out:
                with open(args.out / "results.jsonl", "a") as fh:
                    fh.write(json.dumps(r) + "\n")
        rows += new
    text = table(rows)
    print(text)
    if args.out:  # the folder's every run
        (args.out / "table.md").write_text(table(load(args.out / "results.jsonl")) + "\n")
    return rows


if __name__ == "__main__":
    main()

"""The second GPT-2 harness of issue 19: a nanoGPT-style model and loop, timed by CUDA events.

    PYTHONPATH=. python benchmarks/nanogpt_bench.py --out $OUT/nanogpt.jsonl
    PYTHONPATH=. python benchmarks/nanogpt_bench.py --batch 4 \
        --impls eager,inductor,inductor-ro,fuser,fuser-cg --out $OUT/nanogpt_b4.jsonl
    PYTHONPATH=. python benchmarks/nanogpt_bench.py --config 774m --batch 8 --out ...

Not the project's model (fuser.examples.gpt2) and not its training loop
(examples/train_gpt2.py): the model is written here the way nanoGPT-style code writes it
(a `transformer` ModuleDict, the lm head's weight tied into the embedding, biases on,
`F.cross_entropy(logits.float(), ...)` over the full logits, V = 50304 by default), and
every implementation goes through the public `torch.compile` spelling a user types:

    eager          the model as is
    inductor       torch.compile(model)
    inductor-ro    torch.compile(model, mode="reduce-overhead")
    fuser          torch.compile(model, backend="fuser")
    fuser-cg       torch.compile(model, backend="fuser", options={"cudagraphs": True})

One process; each implementation starts from the same weights (one seed) and trains on the
same batches with fused AdamW under bf16 autocast. Each step is timed with CUDA events
(start before the forward, end after the optimizer), and the loss is read with `.item()`
every step, as a loop that logs every step does; ms/step is the median after the warm-up.
Also: each step's loss (parity with eager within --loss-tol), peak memory, the first step's
wall time (compilation included). A JSON line per implementation, then a summary line.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuser  # noqa: E402,F401  (registers the "fuser" backend)
from fuser.examples.gpt2 import GPTConfig, get_config  # noqa: E402

IMPLS = ("eager", "inductor", "inductor-ro", "fuser", "fuser-cg")
CUDAGRAPH_IMPLS = ("inductor-ro", "fuser-cg")


# sizes only (layers, heads, width): the project's GPT-2 configurations, the model apart
SIZES = ("tiny", "124m", "350m", "774m")


class SelfAttention(nn.Module):
    def __init__(self, size: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd = size.n_head, size.n_embd
        self.c_attn = nn.Linear(size.n_embd, 3 * size.n_embd)
        self.c_proj = nn.Linear(size.n_embd, size.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, size: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(size.n_embd)
        self.attn = SelfAttention(size)
        self.ln_2 = nn.LayerNorm(size.n_embd)
        self.mlp = nn.ModuleDict(
            dict(
                c_fc=nn.Linear(size.n_embd, 4 * size.n_embd),
                gelu=nn.GELU(approximate="tanh"),
                c_proj=nn.Linear(4 * size.n_embd, size.n_embd),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.c_proj(m.gelu(m.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, size: GPTConfig, vocab: int, block: int):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, size.n_embd),
                wpe=nn.Embedding(block, size.n_embd),
                h=nn.ModuleList([Block(size) for _ in range(size.n_layer)]),
                ln_f=nn.LayerNorm(size.n_embd),
            )
        )
        self.lm_head = nn.Linear(size.n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, the other way round
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections, scaled by depth
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * size.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
        )


def compiled(model: nn.Module, impl: str) -> Any:
    """The implementation as a user spells it."""
    if impl == "eager":
        return model
    if impl == "inductor":
        return torch.compile(model)
    if impl == "inductor-ro":
        return torch.compile(model, mode="reduce-overhead")
    if impl == "fuser":
        return torch.compile(model, backend="fuser")
    if impl == "fuser-cg":
        return torch.compile(model, backend="fuser", options={"cudagraphs": True})
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def run(impl: str, args: argparse.Namespace, batches: list) -> dict[str, Any]:
    torch._dynamo.reset()
    gc.collect()
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(args.seed)
    model = NanoGPT(get_config(args.config), args.vocab, args.seq).to(args.device)
    step_model = compiled(model, impl)
    opt = torch.optim.AdamW(
        model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda
    )
    row: dict[str, Any] = {"kind": "impl", "impl": impl, "config": args.config}
    row.update(batch=args.batch, seq=args.seq, vocab=args.vocab, steps=len(batches))
    losses, step_ms = [], []
    first = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        if impl in CUDAGRAPH_IMPLS:
            torch.compiler.cudagraph_mark_step_begin()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            end.record()
        losses.append(loss.item())  # a loop that logs every step reads it every step
        if cuda:
            step_ms.append(start.elapsed_time(end))
        else:
            step_ms.append((time.perf_counter() - t0) * 1e3)
        if i == 0:
            row["first_step_s"] = time.perf_counter() - first
    timed = step_ms[args.warmup :] or step_ms[-1:]
    row.update(losses=losses, step_ms=step_ms, ms_per_step=statistics.median(timed))
    row["tokens_per_s"] = args.batch * args.seq / (row["ms_per_step"] / 1e3)
    if cuda:
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del step_model, opt, model
    return row


def summary(rows: dict[str, dict], loss_tol: float) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "summary", "loss_tol": loss_tol}
    ref = rows.get("eager")
    for name, r in rows.items():
        if "error" in r or ref is None or "error" in ref or name == "eager":
            continue
        diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
        out[f"{name}_max_loss_diff"] = diff
        out[f"{name}_loss_parity"] = diff <= loss_tol
    pairs = (("fuser", "inductor"), ("fuser", "eager"), ("fuser-cg", "inductor-ro"))
    for ours, theirs in pairs:
        a, b = rows.get(ours), rows.get(theirs)
        if a and b and "error" not in a and "error" not in b:
            key = f"{ours.replace('-', '_')}_vs_{theirs.replace('-', '_')}"
            out[f"{key}_speedup"] = b["ms_per_step"] / a["ms_per_step"]
            if "peak_mem_gib" in a and "peak_mem_gib" in b:
                out[f"{key}_memory"] = a["peak_mem_gib"] / b["peak_mem_gib"]
    return out


def environment(device: str) -> dict[str, Any]:
    import triton

    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor()
    return {
        "kind": "environment",
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fuser": fuser.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines file to write")
    ap.add_argument("--impls", default="eager,inductor,fuser", help="comma-separated, in order")
    ap.add_argument("--config", default="124m", choices=SIZES)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=23, help="steps per implementation")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of ms/step")
    ap.add_argument("--loss-tol", type=float, default=0.05, help="absolute, per step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    impls = [s for s in args.impls.split(",") if s]
    for impl in impls:
        if impl not in IMPLS:
            ap.error(f"unknown implementation {impl!r}; expected some of {IMPLS}")
    g = torch.Generator().manual_seed(args.seed + 1)
    batches = []
    for _ in range(args.steps):
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()  # as a loader stacks them
        batches.append((x.to(args.device), y.to(args.device)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    with args.out.open("w") as f:
        f.write(json.dumps(environment(args.device)) + "\n")
        for impl in impls:
            t0 = time.perf_counter()
            try:
                row = run(impl, args, batches)
            except Exception:
                row = {"kind": "impl", "impl": impl, "error": traceback.format_exc()[-3000:]}
                print(f"{impl} FAILED:\n{row['error']}", flush=True)
            rows[impl] = row
            f.write(json.dumps(row) + "\n")
            f.flush()
            if "error" not in row:
                print(
                    f"{impl:12s} {row['ms_per_step']:8.2f} ms/step  "
                    f"first step {row['first_step_s']:6.1f} s  "
                    f"peak {row.get('peak_mem_gib', float('nan')):6.2f} GiB  "
                    f"[{time.perf_counter() - t0:.0f} s]",
                    flush=True,
                )
        summ = summary(rows, args.loss_tol)
        f.write(json.dumps(summ) + "\n")
    print(json.dumps(summ, indent=1))


if __name__ == "__main__":
    main()

"""Train GPT-2 on random tokens with AdamW, eager or through torch.compile.

    python examples/train_gpt2.py --backend fuser --config tiny --steps 5
    python examples/train_gpt2.py --backend inductor --config 124m --batch 16 --seq 1024
    torchrun --nproc-per-node 2 examples/train_gpt2.py --ddp      # or --fsdp: several GPUs

Prints the loss of every step and, at the end, ms/step (median after the warm-up steps),
tokens/s, peak memory, the first step's time (it includes compilation) and how many times
Dynamo recompiled. On a GPU the forward runs under bf16 autocast (`--amp none` turns it
off) and AdamW is the fused one. Weights are randomly initialised; tokens are random, so
the loss falls from ln(vocab) only as far as memorising the batches allows.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from fuser.examples.distributed import (
    WRAPPERS,
    init,
    max_over_ranks,
    mean_over_ranks,
    rank_seed,
    wrap,
)
from fuser.examples.gpt2 import GPT, get_config

# inductor-ro: Inductor with mode="reduce-overhead" (its CUDA-graph trees); fuser-cg: fuser
# with options={"cudagraphs": True} (the same trees, fuser/dynamo/program/cudagraphs.py)
# aot_eager: Dynamo and AOTAutograd alone (the first step's floor a backend adds to)
BACKENDS = ("eager", "aot_eager", "fuser", "fuser-cg", "inductor", "inductor-ro")
CUDAGRAPHS = ("inductor-ro", "fuser-cg")  # a step mark per step: torch's convention


@dataclass
class RunResult:
    backend: str
    config: str
    batch: int
    seq: int
    steps: int
    device: str
    amp: str
    losses: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    ms_per_step: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_mem_gib: float = float("nan")
    first_step_s: float = float("nan")
    graphs: int = 0
    recompiles: int = 0
    error: str = ""
    wrapper: str = ""  # ddp | fsdp | "" (one process)
    world: int = 1  # processes (GPUs) training together; tokens_per_s is per process
    comm: dict = field(default_factory=dict)  # communication overlap (--trace-steps)


class CountingBackend:
    """Wraps a torch.compile backend and counts the graphs Dynamo hands it, and how many
    of them were recompilations of a frame compiled before (its guards failed)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.compile_ids: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._guards import CompileContext

        self.compile_ids.append(str(CompileContext.current_compile_id()))
        return self.inner(gm, example_inputs)

    @property
    def recompiles(self) -> int:
        """Compilations beyond the first of each frame (compile ids are frame/attempt; the
        pieces of one graph that DDP's DDPOptimizer split share one id)."""
        ids = set(self.compile_ids)
        return len(ids) - len({c.rsplit("/", 1)[0] for c in ids})


def make_backend(name: str) -> CountingBackend | None:
    if name == "eager":
        return None
    if name == "fuser":
        from fuser.dynamo import FuserBackend

        return CountingBackend(FuserBackend())
    if name == "fuser-cg":
        from fuser.dynamo import FuserBackend

        return CountingBackend(FuserBackend(cudagraphs=True))
    if name in ("inductor", "aot_eager"):
        from torch._dynamo.backends.registry import lookup_backend

        return CountingBackend(lookup_backend(name))
    if name == "inductor-ro":
        from torch._inductor.compile_fx import compile_fx

        # what mode="reduce-overhead" sets: Inductor's CUDA-graph trees
        return CountingBackend(partial(compile_fx, config_patches={"triton.cudagraphs": True}))
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")


def make_batches(
    vocab: int, batch: int, seq: int, steps: int, device: str, seed: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        idx = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((idx[:, :-1].to(device), idx[:, 1:].to(device)))
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_training(
    model: torch.nn.Module,
    backend: str,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    config: str = "?",
    amp: str = "bf16",
    lr: float = 6e-4,
    warmup: int = 3,
    log: bool = True,
    keep: dict | None = None,
    trace_steps: int = 0,
) -> RunResult:
    """Train `model` one step per batch; returns losses, timings, memory (the most any
    rank used), compile counts. `keep`, if given, receives the compiled model and the
    optimizer ("model", "opt"). `trace_steps` > 0: that many more steps (on the last
    batches again) under torch.profiler, for how much communication the compute hid."""
    device = str(next(model.parameters()).device)
    cuda = device.startswith("cuda")
    b, t = batches[0][0].shape
    res = RunResult(backend, config, b, t, len(batches), device, amp if cuda else "none")
    counter = make_backend(backend)
    step_model = torch.compile(model, backend=counter) if counter is not None else model
    # fused AdamW on a GPU, FSDP2's sharded parameters (DTensors) too: DTensor shards the
    # fused kernel like any pointwise op, where the foreach path pays its dispatch per op
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda
    )
    use_amp = cuda and amp == "bf16"
    if keep is not None:
        keep.update(model=step_model, opt=opt, amp=use_amp, cudagraph_steps=backend in CUDAGRAPHS)

    def one_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if backend in CUDAGRAPHS:  # a new step: earlier graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            _, loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i, (x, y) in enumerate(batches):
        _sync(device)
        t0 = time.perf_counter()
        loss = one_step(x, y)
        res.losses.append(mean_over_ranks(loss))  # also synchronizes
        _sync(device)
        res.step_ms.append((time.perf_counter() - t0) * 1e3)
        if log:
            print(
                f"  [{backend}] step {i:3d}  loss {res.losses[-1]:.5f}  {res.step_ms[-1]:9.1f} ms",
                flush=True,
            )
    if trace_steps and cuda:
        res.comm = traced_overlap(one_step, batches, trace_steps, device)
    timed = res.step_ms[warmup:] or res.step_ms[-1:]
    res.ms_per_step = statistics.median(timed)
    res.tokens_per_s = b * t / (res.ms_per_step / 1e3)
    res.first_step_s = res.step_ms[0] / 1e3
    if cuda:
        res.peak_mem_gib = max_over_ranks(torch.cuda.max_memory_allocated() / 2**30)
    if torch.distributed.is_initialized():
        res.world = torch.distributed.get_world_size()
    if counter is not None:
        res.graphs, res.recompiles = len(counter.compile_ids), counter.recompiles
    return res


def traced_overlap(
    one_step: Any, batches: list[tuple[torch.Tensor, torch.Tensor]], n: int, device: str
) -> dict:
    """`n` steps under torch.profiler (every rank steps: the collectives need all of them);
    how much of the GPU's communication time compute kernels overlapped, per step."""
    from torch.profiler import ProfilerActivity, profile

    from fuser.profile.capture import export_trace
    from fuser.profile.overlap import trace_overlap

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for x, y in batches[-n:]:
            one_step(x, y)
        _sync(device)
    return trace_overlap(export_trace(prof), steps=min(n, len(batches)))


def fresh_model(config: str, device: str, vocab: int | None, seed: int) -> torch.nn.Module:
    """A GPT-2 with the same random weights for a given seed."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    return GPT(get_config(config, vocab_size=vocab)).to(device)


def summary(res: RunResult) -> str:
    mem = f"{res.peak_mem_gib:.2f} GiB" if res.peak_mem_gib == res.peak_mem_gib else "n/a (CPU)"
    per = f" per process ({res.world} x {res.wrapper})" if res.world > 1 else ""
    most = " (the most of any rank)" if per and res.peak_mem_gib == res.peak_mem_gib else ""
    return (
        f"{res.backend}: {res.ms_per_step:.1f} ms/step, {res.tokens_per_s:,.0f} tokens/s{per}, "
        f"peak memory {mem}{most}, first step {res.first_step_s:.1f} s, {res.graphs} graph(s), "
        f"{res.recompiles} recompile(s), final loss {res.losses[-1]:.4f}"
    )


def main(argv: list[str] | None = None) -> RunResult:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", choices=BACKENDS, default="fuser")
    ap.add_argument("--config", default="tiny", help="tiny | small | 124m (default tiny)")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=None, help="default 16 on a GPU, 2 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="default block size on GPU, 8 on CPU")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of ms/step")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--amp", choices=("bf16", "none"), default="bf16", help="GPU autocast")
    ap.add_argument("--device", default=None, help="default cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    ap.add_argument("--explain", action="store_true", help="print fuser.explain at the end")
    for how in WRAPPERS:
        ap.add_argument(
            f"--{how}", action="store_true", help=f"train under {how.upper()} (torchrun)"
        )
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient buckets")
    ap.add_argument(
        "--dist-backend", default=None, help="nccl (GPUs) or gloo (CPU, or ranks sharing a GPU)"
    )
    ap.add_argument(
        "--trace-steps",
        type=int,
        default=0,
        help="profile this many more steps: how much communication the compute hid",
    )
    args = ap.parse_args(argv)
    how = next((h for h in WRAPPERS if getattr(args, h)), None)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if how is not None:
        device = str(init(device, args.dist_backend))
    cfg = get_config(args.config, vocab_size=args.vocab)
    batch = args.batch or (16 if device.startswith("cuda") else 2)
    seq = args.seq or (cfg.block_size if device.startswith("cuda") else 8)
    if args.backend.startswith("fuser"):
        import fuser  # noqa: F401  (registers the backend; the entry point would too)
    model = fresh_model(args.config, device, args.vocab, args.seed)
    lead = how is None or torch.distributed.get_rank() == 0
    if lead:
        ranks = f" x {torch.distributed.get_world_size()} ranks ({how})" if how else ""
        print(
            f"GPT-2 {args.config}: {model.num_params() / 1e6:.1f}M parameters, B={batch} "
            f"T={seq}{ranks}, {args.backend} on {device}",
            flush=True,
        )
    if how is not None:
        model = wrap(model, how, args.bucket_cap_mb)
    batches = make_batches(cfg.vocab_size, batch, seq, args.steps, device, rank_seed(1))
    res = run_training(
        model,
        args.backend,
        batches,
        config=args.config,
        amp=args.amp,
        lr=args.lr,
        warmup=args.warmup,
        log=lead,
        trace_steps=args.trace_steps,
    )
    res.wrapper = how or ""
    if how is not None:
        torch.distributed.destroy_process_group()
    if not lead:
        return res
    print(summary(res))
    if res.comm:
        c = res.comm
        print(
            f"communication per step: {c['comm_ms']:.2f} ms, {c['comm_overlapped_ms']:.2f} ms "
            f"of it under compute ({c['overlap_fraction']:.0%}), {c['comm_exposed_ms']:.2f} "
            "ms exposed"
        )
    if args.explain and args.backend.startswith("fuser"):
        import fuser

        print(fuser.explain(model))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(res), indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()

"""The one place fuser reads the environment.

FUSER_DEBUG   0 quiet; 1 one line per compiled fusion; 2 + the explain() report;
              3 + the graphs after every pass; 4 + the full generated source
FUSER_BACKEND default backend of fd.execute: "triton" (default) or "cuda"
FUSER_CACHE_DIR  where compiled kernels are cached on disk (default ~/.cache/fuser)
FUSER_DISABLE_DISK_CACHE  1 keeps the cache in memory only
FUSER_PAD_MATMULS  0 leaves torch.compile(backend="fuser") graphs' unaligned matmuls as they
              are (default 1: pad them, fuser/dynamo/pad_mm.py)
FUSER_EAGER_OUTPUT_STRIDES  1 returns a padded matmul's result (GPT-2's logits at V=50257) as a
              contiguous copy with eager's strides (default 0: in the padded rows, eager's
              stride order, as Inductor returns it; a 1.3 ms copy less on GPT-2 124M B=16)
FUSER_CALL_PROGRAM  0 runs torch.compile(backend="fuser") graphs the old way: the FX graph
              interpreted node by node, a module call per fused region (default 1: a
              generated call program per graph, fuser/dynamo/program/); config.call_program
              switches it at any call, for an A/B in one process
FUSER_PROGRAM_CLOCK  1 times each step of a call program on the host (read when the program
              is built; fuser/dynamo/program/clock.py reports where a step's Python goes)
FUSER_CAST_GROUPS  0 launches each cast of a graph input (autocast's weight casts) on its own
              (default 1: consecutive ones launched together, fuser/dynamo/program/casts.py);
              config.cast_groups is read when a call program is built
FUSER_ABSENT_GRADS  0 lets autograd fill the gradient of a compiled graph's output that nobody
              asks for (the logits beside the loss) with zeros, which the backward reads
              (default 1: the backward takes it as zero, fuser/dynamo/tangents.py)
FUSER_COMPILE_WORKERS  threads (and Triton's worker processes) that compile a graph's kernels
              ahead of its first call (fuser/runtime/precompile.py; default 0: as many as
              cores, at most 8; 1: serial)
FUSER_COMPILE_PROCESSES  1 compiles Triton kernels in worker processes first
              (fuser/runtime/compile_pool.py); default 0, threads only: on an H100 host the
              workers cut the compile phase of a cold GPT-2 124M first step (5.0 -> 3.5 s)
              but slowed its tracing more (+1.5-2.3 s), a slower first step overall
FUSER_COMPILE_NICE  the os.nice increment of Triton's compile worker processes (default 10: they
              only fill a cache; read by fuser/runtime/compile_worker.py in the worker)
FUSER_PLAN_CACHE  0 plans every fusion afresh (default 1: plans kept on disk under the cache
              folder and read back by later processes, fuser/runtime/plan_cache.py)
FUSER_ONE_PASS_CE  0 leaves F.cross_entropy to AOTAutograd's log_softmax + nll_loss (default
              1: when a backward will run, loss and gradient in one kernel,
              fuser/dynamo/ce_op.py)
FUSER_CE_RETURNED  a cross-entropy whose logits the graph also returns (aligned rows): "one-pass"
              (default: the gradient made in the forward; with absent gradients not filled,
              1.8 ms and 3 GiB less than two-pass on GPT-2 124M at V=50304) or "two-pass"
              (the logits saved, the gradient made in the backward; fuser/dynamo/ce_rewrite.py)
FUSER_LINEAR_CE  whether torch.compile(backend="fuser") fuses an lm head into its cross-entropy
              (fuser/dynamo/linear_ce.py: the logits made and consumed a chunk of rows at a
              time, never whole): "auto" (default: on for CUDA logits of >= 256 MiB), "1"
              (wherever the pattern is found), "0" (off); needs FUSER_ONE_PASS_CE on
FUSER_ATTENTION  which runs torch.compile(backend="fuser") graphs' attentions: "sdpa" (default:
              ATen's SDPA kernels), "template" (fuser's Triton flash attention wherever it
              applies), "auto" (the template where a measurement on this GPU, made on first
              use and cached on disk, says it is faster); fuser/schedulers/attention.py
FUSER_CAUSAL_MASK  0 leaves an attention's mask as the graph computes it (default 1: a mask computed
              from sizes alone that is the causal mask, as transformers builds it under
              torch.compile, becomes is_causal=True: fuser/dynamo/causal_mask.py)
FUSER_SCATTER  how scatter-adds (embedding backward, index_add, index_put with accumulate) run:
              "sorted" (default, deterministic: the plan picks runs of sorted indices, long
              runs split in pieces, or partial tables for few rows, each summed in fp32 in
              a fixed order), "runs", "split" or "table" (force one of those), or "atomic"
              (fp32 atomic adds, no sort, not deterministic); fuser/schedulers/scatter.py
FUSER_GEMM    which runs torch.compile(backend="fuser") graphs' matmuls: "aten" (default: cuBLAS,
              the graph unchanged), "template" (fuser's Triton GEMM template with the bias,
              GELU, residual, GELU-backward and bias-gradient work around it fused, wherever
              it applies), "auto" (the template where the roofline estimate, or on a GPU a
              measurement made on first use and cached on disk, says it is faster);
              fuser/schedulers/gemm.py
FUSER_INNER_OUTER_STAGES  how deep the Triton inner_outer kernels (LayerNorm / RMSNorm
              backward) pipeline their row loop's loads through shared memory (tl.range
              num_stages; fuser/plan/build.py _inner_outer_stages, which lowers it where the
              buffers would not fit); default 0: the plan's own choice (not staged)
FUSER_LOOPED_STAGES  the pipeline depth of Triton's inner looped row walks (tl.range num_stages:
              an iteration's loads issued that many - 1 iterations ahead through shared
              memory, where fuser/plan/build.py _walk_stages allows it); default 0: the
              planner's WALK_STAGES; 1: unpipelined
FUSER_LAUNCHER  how call programs launch Triton kernels (fuser/runtime/launchers.py): "static"
              (torch's C++ launcher, Inductor's), "triton-c" (Triton's compiled launcher without
              its Python frame) or "python" (Triton's Python launcher, as its JIT calls it);
              default: the first of those this process and kernel allow
FUSER_FP_WARNINGS  1 lets Triton's CPU interpreter report numpy's floating-point warnings
              (overflow, invalid value, divide by zero) from generated kernels: the test
              suite's check that a kernel computes no inf or NaN that eager does not (default
              0: silent, as eager torch and a GPU are, whatever the data)
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Config:
    debug: int
    backend: str
    cache_dir: Path
    disk_cache: bool
    pad_matmuls: bool
    eager_output_strides: bool
    fp_warnings: bool
    call_program: bool
    program_clock: bool = False
    cast_groups: bool = True
    compile_workers: int = 0
    compile_processes: bool = False
    absent_grads: bool = True
    one_pass_cross_entropy: bool = True
    ce_returned_logits: str = "one-pass"
    attention: str = "sdpa"
    causal_masks: bool = True
    scatter: str = "sorted"
    gemm: str = "aten"
    linear_cross_entropy: str = "auto"
    inner_outer_stages: int = 0
    looped_stages: int = 0
    plan_cache: bool = True
    launcher: str = ""


def _read() -> Config:
    return Config(
        debug=int(os.environ.get("FUSER_DEBUG", "0") or 0),
        backend=os.environ.get("FUSER_BACKEND", "triton"),
        cache_dir=Path(os.environ.get("FUSER_CACHE_DIR", Path.home() / ".cache" / "fuser")),
        disk_cache=os.environ.get("FUSER_DISABLE_DISK_CACHE", "0") in ("", "0"),
        pad_matmuls=os.environ.get("FUSER_PAD_MATMULS", "1") not in ("", "0"),
        eager_output_strides=os.environ.get("FUSER_EAGER_OUTPUT_STRIDES", "0") not in ("", "0"),
        fp_warnings=os.environ.get("FUSER_FP_WARNINGS", "0") not in ("", "0"),
        call_program=os.environ.get("FUSER_CALL_PROGRAM", "1") not in ("", "0"),
        program_clock=os.environ.get("FUSER_PROGRAM_CLOCK", "0") not in ("", "0"),
        cast_groups=os.environ.get("FUSER_CAST_GROUPS", "1") not in ("", "0"),
        compile_workers=int(os.environ.get("FUSER_COMPILE_WORKERS", "0") or 0),
        compile_processes=os.environ.get("FUSER_COMPILE_PROCESSES", "0") not in ("", "0"),
        absent_grads=os.environ.get("FUSER_ABSENT_GRADS", "1") not in ("", "0"),
        one_pass_cross_entropy=os.environ.get("FUSER_ONE_PASS_CE", "1") not in ("", "0"),
        ce_returned_logits=os.environ.get("FUSER_CE_RETURNED", "one-pass") or "one-pass",
        attention=os.environ.get("FUSER_ATTENTION", "sdpa") or "sdpa",
        causal_masks=os.environ.get("FUSER_CAUSAL_MASK", "1") not in ("", "0"),
        scatter=os.environ.get("FUSER_SCATTER", "sorted") or "sorted",
        gemm=os.environ.get("FUSER_GEMM", "aten") or "aten",
        linear_cross_entropy=os.environ.get("FUSER_LINEAR_CE", "auto") or "auto",
        inner_outer_stages=int(os.environ.get("FUSER_INNER_OUTER_STAGES", "0") or 0),
        looped_stages=int(os.environ.get("FUSER_LOOPED_STAGES", "0") or 0),
        plan_cache=os.environ.get("FUSER_PLAN_CACHE", "1") not in ("", "0"),
        launcher=os.environ.get("FUSER_LAUNCHER", ""),
    )


config = _read()


def debug_print(level: int, text: str) -> None:
    """Print `text` when FUSER_DEBUG is at least `level`."""
    if config.debug >= level:
        print(text, flush=True)


def use_interpreter() -> bool:
    """Whether fuser runs its Triton kernels in Triton's CPU interpreter in this process:
    as TRITON_INTERPRET says when it is set, else when torch sees no CUDA GPU.

    Not by setting TRITON_INTERPRET: Triton reads it as each @triton.jit function is made,
    and torch.compile imports Triton (and makes triton.language's own jit functions)
    before the "fuser" entry point imports fuser, so a switch here would come too late for
    those. fuser's runtime makes its interpreted kernels itself (runtime/triton_backend.py),
    the same whichever was imported first."""
    flag = os.environ.get("TRITON_INTERPRET")
    if flag is not None:
        return flag not in ("", "0")
    return not _cuda_available()


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()

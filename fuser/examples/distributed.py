"""GPT-2 training on several processes with PyTorch's own engines: DDP or FSDP2.

fuser writes no communication. Under `DistributedDataParallel`, Dynamo's DDPOptimizer
splits each captured graph at DDP's gradient-bucket boundaries and hands fuser the pieces
one by one, so a bucket's all-reduce can start while the backward of the pieces before it
still runs; `fuser.explain` marks each piece. Under FSDP2 (`fully_shard` per block, then
on the whole model) parameters are all-gathered per block by hooks that Dynamo does not
trace: fuser compiles what runs between them.

    torchrun --nproc-per-node 2 examples/train_gpt2.py --ddp --backend fuser
    torchrun --nproc-per-node 2 examples/train_gpt2.py --fsdp --backend fuser

Each rank trains on its own batches (seeded by its rank); the loss reported is the mean
over ranks. On GPUs the processes talk through NCCL, on CPU through gloo.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

WRAPPERS = ("ddp", "fsdp")


def init(device: str | None = None, backend: str | None = None) -> torch.device:
    """Join the process group torchrun (or the caller's environment) describes; the
    device this rank trains on: GPU LOCAL_RANK where there are GPUs, else the CPU.
    `backend`: NCCL on GPUs and gloo on CPU unless named; with gloo, several ranks may
    share one GPU (a correctness check, never a timing)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    if not cuda:
        return torch.device("cpu")
    index = local % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def wrap(
    model: nn.Module, how: str, bucket_cap_mb: float = 25.0, mixed: bool | None = None
) -> nn.Module:
    """`model` under DDP ("ddp") or FSDP2 ("fsdp": each block sharded, then the whole).
    `mixed` (default: on a GPU) FSDP2 gathers parameters in bf16 and reduces gradients in
    fp32; otherwise everything stays in the parameters' dtype."""
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)
    if how == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if mixed is None:
            mixed = next(model.parameters()).is_cuda
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if mixed
            else MixedPrecisionPolicy()
        )
        for block in model.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    raise ValueError(f"unknown wrapper {how!r}; expected one of {WRAPPERS}")


def rank_seed(seed: int) -> int:
    """A seed of this rank's own: ranks train on different batches."""
    return seed + (dist.get_rank() if dist.is_initialized() else 0)


def mean_over_ranks(value: torch.Tensor) -> float:
    """`value` (a scalar) averaged over the ranks; itself where there is one process."""
    if not dist.is_initialized():
        return value.item()
    total = value.detach().float().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def max_over_ranks(value: float) -> float:
    """The largest `value` over the ranks (peak memory per GPU is the worst rank's)."""
    if not dist.is_initialized():
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return total.item()

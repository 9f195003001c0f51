"""GPT-2 training under DDP and FSDP2 with backend="fuser": two CPU processes over gloo.

What one machine without GPUs can show (issue 24, item 3): fuser compiles the graphs that
Dynamo's DDPOptimizer splits at DDP's bucket boundaries and the blocks FSDP2 shards, fuses
them as on one process (strict: a fuser failure raises instead of falling back), and
trains as eager DDP / FSDP2 does: the same loss at every step, the same gradients after
the first. Each rank trains on its own batches, so the gradients are truly all-reduced.
With a GPU (item 4) the same runs again with both ranks on GPU 0, still over gloo: a check
of fuser's GPU kernels under DDP / FSDP2 on a one-GPU machine, never a timing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
STEPS = 3


def _local(grad: torch.Tensor) -> torch.Tensor:
    """This rank's part of a gradient (FSDP2's are DTensor shards)."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def _train(rank: int, how: str, device: str, init_file: str, out: str) -> None:
    """One rank: eager, then fuser, from the same weights on the same batches."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    from fuser.dynamo import FuserBackend
    from fuser.dynamo.explain import captures_text
    from fuser.examples.distributed import mean_over_ranks, wrap
    from fuser.examples.gpt2 import GPT, get_config

    cfg = get_config("small")  # 0.9M parameters: DDP buckets of 1 MB split its graph
    results: dict = {}
    for name in ("eager", "fuser"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = wrap(GPT(cfg).to(device), how, bucket_cap_mb=1, mixed=False)
        backend = FuserBackend(strict=True)
        step = torch.compile(model, backend=backend) if name == "fuser" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1 + rank)
        losses, grads = [], {}
        for i in range(STEPS):
            idx = torch.randint(0, cfg.vocab_size, (2, 9), generator=g).to(device)
            _, loss = step(idx[:, :-1], idx[:, 1:])
            loss.backward()
            if i == 0:
                grads = {
                    n: _local(p.grad).detach().cpu().clone() for n, p in model.named_parameters()
                }
            opt.step()
            opt.zero_grad()
            losses.append(mean_over_ranks(loss))
        results[name] = {"losses": losses, "grads": grads}
        if name == "fuser":
            regions = [r for c in backend.captures for gr in c.graphs for r in gr.fused]
            results["kernels"] = sum(len(r.kernels) for r in regions)
            results["explain"] = captures_text(backend.captures)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_two_processes_train_as_eager(how: str, device: str, tmp_path: Path) -> None:
    init_file = tempfile.mktemp(dir=tmp_path)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_train, args=(how, device, init_file, str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for res in ranks:
        eager, fused = res["eager"], res["fuser"]
        # the mean loss over ranks, step by step
        torch.testing.assert_close(fused["losses"], eager["losses"], atol=1e-5, rtol=1e-5)
        assert len(set(eager["losses"])) == STEPS  # it trains: the loss moves
        assert eager["grads"].keys() == fused["grads"].keys()
        for n, want in eager["grads"].items():
            torch.testing.assert_close(fused["grads"][n], want, atol=1e-5, rtol=1e-4, msg=n)
        assert res["kernels"] > 0, res["explain"]  # fuser fused, it did not stand aside
    if how == "ddp":
        # all-reduced: every rank holds the same gradients, though its batches differ
        for n, want in ranks[0]["fuser"]["grads"].items():
            torch.testing.assert_close(ranks[1]["fuser"]["grads"][n], want, msg=n)
        assert "piece 2 of" in ranks[0]["explain"], ranks[0]["explain"][:2000]
    else:
        # sharded: each rank holds its own half of every sharded gradient
        a, b = ranks[0]["fuser"]["grads"], ranks[1]["fuser"]["grads"]
        assert any(not torch.equal(a[n], b[n]) for n in a if a[n].shape == b[n].shape)

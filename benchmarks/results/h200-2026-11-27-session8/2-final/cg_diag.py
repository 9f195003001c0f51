# ruff: noqa: E501, E702  (a record of the script as it was run)
import torch

from fuser.dynamo import FuserBackend
from fuser.examples.gpt2 import GPT, GPTConfig

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=40, vocab_size=67, block_size=16)
torch.manual_seed(0)
m = GPT(TINY).cuda()
b = FuserBackend(strict=True, cudagraphs=True)
c = torch.compile(m, backend=b)
g = torch.Generator().manual_seed(3)
opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
for step in range(5):
    idx = torch.randint(0, 67, (3, 8), generator=g).cuda()
    torch.compiler.cudagraph_mark_step_begin()
    _, loss = c(idx[:, :-1], idx[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(
        step,
        [
            (
                r.name,
                (getattr(r, "tangents", "") or "")[:60],
                (getattr(r, "cudagraphs", "") or "")[:50],
            )
            for r in b.captures[0].graphs
        ],
    )

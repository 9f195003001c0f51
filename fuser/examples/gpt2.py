"""A small GPT-2: token and position embeddings, pre-norm blocks with causal SDPA attention,
a GELU (tanh) MLP, a final layernorm and an lm head tied to the token embedding.

    from fuser.examples.gpt2 import GPT, get_config
    model = GPT(get_config("tiny"))
    logits, loss = model(idx, targets)      # idx, targets: [B, T] int64

Part of the package so that the README's examples import it from anywhere;
examples/train_gpt2.py trains it.

The configurations are sizes only; weights are randomly initialised (GPT-2's scheme:
normal(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024
    dropout: float = 0.0


CONFIGS = {
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16),
    "small": GPTConfig(n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=128),
    "124m": GPTConfig(),
    "350m": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "774m": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
}


def get_config(name: str, **overrides: int) -> GPTConfig:
    """A named configuration, with any field overridden (e.g. vocab_size=50304)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown GPT-2 config {name!r}; expected one of {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **{k: v for k, v in overrides.items() if v is not None})


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd {cfg.n_embd} is not a multiple of n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        heads = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The embeddings and the head are methods of their own: under FSDP2, Dynamo gives
        # up on this frame (FSDP's hooks break the graph inside the loop over the blocks)
        # and compiles the frames it calls instead; with the head inline, the lm head and
        # the loss would run eagerly. On one GPU Dynamo inlines them: one graph as before.
        x = self.embed(idx)
        for block in self.h:
            x = block(x)
        return self.head(x, targets)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def head(
        self, x: torch.Tensor, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

"""A GPT-2 decode step: one new token per sequence against a key/value cache.

Takes a size preset; gives a `BenchModel` named "gpt2_decode" whose module maps (token ids
(batch, 1), position ids (batch, 1), cached keys and values (layers, batch, heads, kv_len,
head_dim)) to the next-token logits (batch, 1, vocab). The "large" preset is GPT-2 small (12
layers, width 768, 12 heads) at batch 1 with 128 cached positions: each layer's matmuls are
tiny, so launch overhead dominates — the case device graphs (`mode="reduce-overhead"`) are
for. The weights are the nanoGPT model's (nanogpt.py); the cache is read, not updated, so every
call does the same work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import BenchModel, pick, token_ids
from .nanogpt import GPT, GPTConfig


class DecodeStep(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.gpt = GPT(cfg)
        self.n_head = cfg.n_head

    def forward(self, idx, pos, past_k, past_v):
        g = self.gpt
        x = g.wte(idx) + g.wpe(pos)
        b, t, c = x.shape
        for layer, block in enumerate(g.h):
            h = block.ln_1(x)
            q, k, v = block.attn.c_attn(h).split(c, dim=2)
            q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            k = torch.cat([past_k[layer], k], dim=2)
            v = torch.cat([past_v[layer], v], dim=2)
            y = F.scaled_dot_product_attention(q, k, v)  # one query sees the whole cache
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(b, t, c))
            x = x + block.mlp(block.ln_2(x))
        return g.lm_head(g.ln_f(x))


def _config(size: str) -> tuple[GPTConfig, int, int]:
    """(config, batch, cached positions)"""
    return pick(
        size,
        (GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32), 1, 8),
        (GPTConfig(block_size=64, vocab_size=1024, n_layer=4, n_head=4, n_embd=256), 1, 32),
        (GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768), 1, 128),
    )


def _model(size: str) -> nn.Module:
    return DecodeStep(_config(size)[0])


def _inputs(size: str, gen: torch.Generator) -> tuple:
    cfg, batch, kv = _config(size)
    head = cfg.n_embd // cfg.n_head
    cache = (cfg.n_layer, batch, cfg.n_head, kv, head)
    idx = token_ids(gen, cfg.vocab_size, batch, 1)
    pos = torch.full((batch, 1), kv, dtype=torch.long)
    return idx, pos, torch.randn(cache, generator=gen), torch.randn(cache, generator=gen)


MODELS = {
    "gpt2_decode": BenchModel(
        "gpt2_decode",
        "GPT-2 decode step: 1 token against a KV cache (large: GPT-2 small, batch 1, 128 cached)",
        _model,
        _inputs,
    )
}

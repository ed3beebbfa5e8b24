"""Small models and a 10-step training loop shared by the distributed tests.

Each rank trains on its own random batches (so the ranks' gradients differ and their
all-reduce matters) from the same initial weights; a test trains an eager twin and a
compiled model side by side and compares every step's loss and the final parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 10


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Embedding-free transformer-ish stack: input projection, blocks, head."""

    def __init__(self, dim: int = 16, depth: int = 2, out: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(12, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, out)

    def forward(self, x):
        h = self.proj(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def make_net(seed: int = 0, **kw) -> Net:
    torch.manual_seed(seed)
    return Net(**kw)


def batches(rank: int, n: int = STEPS, batch: int = 4):
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(batch, 3, 12, generator=g), torch.randn(batch, 3, 8, generator=g))
        for _ in range(n)
    ]


def train(model, params, data, lr: float = 1e-2):
    """Plain training: AdamW, MSE loss; gives the per-step losses."""
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def assert_same_training(losses, ref_losses, params, ref_params, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(losses, ref_losses, rtol=rtol, atol=atol)
    params, ref_params = list(params), list(ref_params)
    assert len(params) == len(ref_params)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=atol)

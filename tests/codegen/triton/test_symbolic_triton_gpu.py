"""Symbolic sizes on a real GPU: `kiln.compile(dynamic=True)` of CUDA models builds one Triton
module per graph for every size, with and without device graphs, and matches eager. Marked
`gpu` (deselected by default); run on the GPU machine with

    PYTHONPATH=src python3 -m pytest -m gpu tests/codegen/triton/test_symbolic_triton_gpu.py

Each test skips, saying why, without CUDA or Triton.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tr_helpers import assert_matches_eager, require_gpu

import kiln

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _gpu():
    require_gpu()


def _builds() -> int:
    from kiln.runtime import triton_builder

    s = triton_builder.STATS
    return s["loads"] + s["memory_hits"]


class _Block(torch.nn.Module):
    """A pre-norm transformer block: layer norms, attention (SDPA), a GELU MLP."""

    def __init__(self, c: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc1, self.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, -1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


LENGTHS = (128, 200, 256, 300, 17, 1000, 64)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_transformer_block_one_build_for_every_length(mode):
    torch.manual_seed(0)
    model = _Block().cuda().eval()
    wide = copy.deepcopy(model).double()  # the float64 reference (tr_helpers' step 2)
    compiled = kiln.compile(model, dynamic=True, mode=mode)
    before = None
    with torch.no_grad():
        for t in LENGTHS:
            for _ in range(3):  # device graphs: warm-up, record, replay
                x = torch.randn(4, t, 128, device="cuda")
                assert_matches_eager(compiled(x).clone(), model(x), lambda x=x: wide(x.double()))
            if before is None:
                before = _builds()
    assert _builds() == before, "one build serves every length"


def test_softmax_rows_longer_than_the_first_length_in_bfloat16():
    def f(x):
        return (x.float() * 0.5).softmax(-1).to(torch.bfloat16), x.float().sum(-1)

    compiled = kiln.compile(f, dynamic=True)
    before = None
    for n in (100, 7, 128, 5000, 100000, 333):
        x = torch.randn(8, n, device="cuda").to(torch.bfloat16)
        for g, e in zip(compiled(x), f(x)):
            torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
        if before is None:
            before = _builds()
    assert _builds() == before

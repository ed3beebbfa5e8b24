"""A dynamic entry on CUDA serves every length (issue 31; run with `-m gpu` on the GPU machine).

On torch 2.11's CUDA path, ATen's C++ `linear` -> `matmul` composite reads concrete sizes when
no operand needs a gradient (inference, a weight used under `no_grad`), so a fake-tensor trace
that ran it pinned the sequence length with a guard (`size(1) == 200`): HF GPT-2 compiled once
per prompt length, 7 entries for 7 lengths. Capture's propagation and AOT's symbolic trace now
run under the Python dispatcher, whose SymInt-aware decompositions read no concrete size.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

gpu = pytest.mark.gpu


class _Head(nn.Module):
    """A language-model head: layer norm, a projection, a bias-free tied-style output."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(512, 64)
        self.ln = nn.LayerNorm(64)
        self.proj = nn.Linear(64, 64)
        self.out = nn.Linear(64, 512, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + F.gelu(self.proj(self.ln(h)))
        return self.out(h)


def _captures(compiled) -> int:
    cf = compiled._kiln_compiled
    return cf.compiles + sum(c.compiles for c in cf.continuations.values())


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_dynamic_entry_serves_every_length_on_cuda(dtype):
    torch.manual_seed(0)
    model = _Head().to("cuda", dtype).eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for n in (128, 200, 256, 300, 77):
            ids = torch.randint(0, 512, (2, n), device="cuda")
            torch.testing.assert_close(compiled(ids), model(ids), atol=2e-2, rtol=2e-2)
    assert _captures(compiled) <= 2  # the first length static, then one dynamic entry

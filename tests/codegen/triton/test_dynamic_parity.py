"""A dynamic entry compiles to the code a static entry gets (issue 31): for an HF-GPT-2-like
block on the cuda code generator (Triton's interpreter on CPU tensors), the entry kiln compiles
for symbolic lengths makes as many ATen calls of each kind, launches as many kernels and clamps
as many indices as the entry compiled for one length, matches eager at every length, and
compiles no more than twice.

Each count once differed: the bias of GPT-2's `Conv1D` (`addmm(b, x.view(-1, x.size(-1)), w)`)
stayed in `addmm` for symbolic lengths, the `size(-1)` read being taken for a reader of the
product (3 `addmm` a layer where the static entry keeps 1), and a `cat` onto a KV cache clamped
its new rows' index to the length they already stay within.
"""

from __future__ import annotations

import collections
import re

import torch
import torch.nn.functional as F
from torch import nn
from tr_helpers import require_interpreter

import kiln
from kiln import logs

TRITON = {"codegen.device": "cuda"}


class _Conv1D(nn.Module):
    """HF GPT-2's projection: a weight stored [in, out] and `addmm` on the rows."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class _Block(nn.Module):
    """GPT-2's block (pre-norm attention and tanh-GELU MLP, residual adds) with a KV cache of a
    few earlier positions that the new keys and values are concatenated onto."""

    def __init__(self, d: int = 32, heads: int = 4, past: int = 3) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = _Conv1D(d, 3 * d), _Conv1D(d, d)
        self.c_fc, self.mlp_proj = _Conv1D(d, 4 * d), _Conv1D(4 * d, d)
        self.register_buffer("past_k", torch.randn(1, heads, past, d // heads))
        self.register_buffer("past_v", torch.randn(1, heads, past, d // heads))

    def forward(self, h):
        b, n, d = h.shape
        q, k, v = self.c_attn(self.ln_1(h)).split(d, dim=2)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        k = torch.cat([self.past_k.expand(b, -1, -1, -1), k], dim=-2)
        v = torch.cat([self.past_v.expand(b, -1, -1, -1), v], dim=-2)
        a = F.scaled_dot_product_attention(q, k, v)
        h = h + self.c_proj(a.transpose(1, 2).reshape(b, n, d))
        return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


def _counts(code: str) -> dict:
    """What one compiled graph's `output_code` shows: ATen calls by name, kernel launches,
    distinct kernels and index clamps (`tl.minimum`/`tl.maximum` in kernel bodies)."""
    kernels, _, wrapper = code.partition("\nwrapper:\n")
    return {
        "aten": collections.Counter(re.findall(r"^\s+(?:\w+ = )?(aten_\w+)\(", wrapper, re.M)),
        "launches": len(re.findall(r"^\s+kernel\d+\[", wrapper, re.M)),
        "kernels": len(re.findall(r"@triton\.jit\s*\ndef kernel", kernels)),
        "clamps": len(re.findall(r"\btl\.(?:minimum|maximum)\(", kernels)),
    }


def _graph_codes(text: str) -> list[str]:
    return text.split("Triton kernels:\n")[1:]


def _compile_and_count(model, lengths, dynamic):
    compiled = kiln.compile(model, dynamic=dynamic, options=TRITON)
    with logs.captured("output_code") as buf, torch.no_grad():
        for n in lengths:
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    codes = _graph_codes(buf.getvalue())
    return compiled, [_counts(c) for c in codes]


def test_dynamic_entry_makes_the_static_entrys_calls_and_kernels():
    require_interpreter()
    torch.manual_seed(0)
    model = _Block().eval()
    kiln.reset()
    _, (static,) = _compile_and_count(model, (24,), dynamic=False)
    kiln.reset()
    # the default policy: the first length static, the second a dynamic entry, every later
    # length served by it (fresh random inputs each time, compared with eager)
    compiled, counts = _compile_and_count(model, (20, 24, 9, 33, 50, 24), dynamic=None)
    assert compiled._kiln_compiled.compiles == 2
    assert len(counts) == 2, "a graph compiled for the first length and one for all the others"
    dynamic = counts[1]
    assert dynamic["aten"]["aten_addmm_default"] == static["aten"]["aten_addmm_default"] == 1
    assert dynamic == static

"""A training forward computes fused attention's logsumexp, which the backward reads.

`scaled_dot_product_attention` decomposes on CUDA to `_scaled_dot_product_efficient_attention
(..., compute_log_sumexp=query.requires_grad)`; kiln's first trace runs on detached fake
tensors, so without care the training forward asked for no logsumexp and the backward got an
empty one. The graph is traced on fake tensors only, so this runs on any machine."""

from __future__ import annotations

import torch

from kiln.autograd.analyze import analyze
from kiln.autograd.tracing import trace_functional_forward

aten = torch.ops.aten


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, q.requires_grad
        )
        return (out.sum(),)


def test_training_forward_asks_for_the_logsumexp():
    gm = torch.fx.symbolic_trace(Attention())
    q, k, v = (torch.randn(2, 4, 64, 32, requires_grad=True) for _ in range(3))
    meta = analyze(gm, [q, k, v], True)
    fwd = trace_functional_forward(gm, meta, [q, k, v], True)
    calls = [
        n
        for n in fwd.gm.graph.nodes
        if n.target is aten._scaled_dot_product_efficient_attention.default
    ]
    assert len(calls) == 1
    assert calls[0].args[4] is True  # the trace saw detached inputs (False); training needs it

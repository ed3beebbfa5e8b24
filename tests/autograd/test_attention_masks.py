"""Constant attention masks that mask nothing leave the SDPA call; the causal triangle becomes
`is_causal=True`; any other mask, and any mask that reads an input, draws random numbers or is
written in place, stays.

transformers builds such masks from `arange` comparisons when it sees a compiler (eager BERT
passes none), and a mask keeps SDPA off its fused kernels. Each test captures a function with
kiln, runs the pass on the captured graph, and compares with eager on fresh random data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd.attention_masks import simplify_attention_masks


def _grabbing() -> tuple[list, object]:
    """A backend that keeps each captured graph (in the list) and runs it as it is."""
    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, grab


def _captured(fn, *inputs) -> torch.fx.GraphModule:
    graphs, grab = _grabbing()
    kiln.compile(fn, backend=grab, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def _sdpa_calls(gm) -> list:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is F.scaled_dot_product_attention
    ]


def _mask_and_causal(call) -> tuple:
    mask = call.args[3] if len(call.args) > 3 else call.kwargs.get("attn_mask")
    causal = call.args[5] if len(call.args) > 5 else call.kwargs.get("is_causal", False)
    return mask, causal


def _qkv(batch=2, heads=4, length=12, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=g) for _ in range(3)]


def _check(fn, *, rewritten: int, causal: bool = False):
    """Capture `fn`, simplify, check how many calls lost their mask, compare with eager."""
    gm = _captured(fn, *_qkv())
    notes = simplify_attention_masks(gm)
    assert len(notes) == rewritten, notes
    calls = _sdpa_calls(gm)
    if rewritten:
        assert all(_mask_and_causal(c) == (None, causal) for c in calls[:rewritten])
    fresh = _qkv(seed=1)
    torch.testing.assert_close(gm(*fresh)[0], fn(*fresh), rtol=1e-5, atol=1e-5)
    return gm, notes


def bert_like(q, k, v):
    """transformers' compile-time bidirectional mask: every key position is >= 0."""
    n = q.shape[-2]
    pos = torch.arange(n) + 0
    mask = (pos[None, None, :, None] >= 0).expand(q.shape[0], -1, n, n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)


def causal_like(q, k, v):
    n = q.shape[-2]
    pos = torch.arange(n)
    mask = (pos[None, :] <= pos[:, None])[None, None]
    return F.scaled_dot_product_attention(q, k, v, mask)


def test_a_constant_mask_that_masks_nothing_is_dropped():
    gm, notes = _check(bert_like, rewritten=1)
    assert "masks nothing" in notes[0]
    assert not [n for n in gm.graph.nodes if n.target in (torch.arange, "ge", "expand")]


def test_one_mask_serving_many_layers_is_dropped_from_each():
    def layers(q, k, v):
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool)
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return q

    _check(layers, rewritten=3)


def test_the_causal_triangle_becomes_is_causal():
    _, notes = _check(causal_like, rewritten=1, causal=True)
    assert "causal triangle" in notes[0]


def test_a_float_mask_of_zeros_is_dropped():
    def zeros(q, k, v):
        n = q.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(n, n))

    _check(zeros, rewritten=1)


def window(q, k, v):
    n = q.shape[-2]
    pos = torch.arange(n)
    mask = (pos[None, :] - pos[:, None]).abs() <= 2
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def float_causal(q, k, v):
    n = q.shape[-2]
    mask = torch.full((n, n), float("-inf")).triu(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def from_input(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=q[..., :1] > -100.0)


def written_in_place(q, k, v):
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool)
    row = mask[0]
    row.fill_(False)
    row[0] = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn", [window, float_causal, from_input, written_in_place])
def test_other_masks_stay(fn):
    """A sliding window masks something; a float causal mask is not rewritten (only bool ones
    are); a mask from an input is data; a mask written through a view is not what its
    node computes."""
    gm, _ = _check(fn, rewritten=0)
    (call,) = _sdpa_calls(gm)
    assert isinstance(_mask_and_causal(call)[0], torch.fx.Node)


def test_a_mask_from_a_dynamic_size_stays():
    """With dynamic shapes the sequence length is read off an input: `pos < 10` holds for the
    example's 8 positions and not for 12, so the mask must stay in the graph."""
    graphs, grab = _grabbing()

    def short_window(q, k, v):
        n = q.shape[-2]
        mask = (torch.arange(n)[None, :] < 10).expand(n, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    compiled = kiln.compile(short_window, backend=grab, dynamic=True)
    for n in (8, 12):
        q, k, v = _qkv(length=n, seed=n)
        torch.testing.assert_close(compiled(q, k, v), short_window(q, k, v))
    assert simplify_attention_masks(graphs[-1]) == []
    ours = kiln.compile(lambda *qkv: short_window(*qkv), dynamic=True)  # kiln's own backend
    for n in (8, 12):
        q, k, v = _qkv(length=n, seed=n + 1)
        torch.testing.assert_close(ours(q, k, v), short_window(q, k, v), rtol=1e-5, atol=1e-5)


def test_a_random_mask_stays():
    def dropout_mask(q, k, v):
        n = q.shape[-2]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.rand(n, n) >= 0.0)

    gm = _captured(dropout_mask, *_qkv())
    assert simplify_attention_masks(gm) == []


@pytest.mark.parametrize("fn", [bert_like, causal_like])
def test_compiled_training_matches_eager(fn):
    """Through `kiln.compile`: outputs and gradients against eager on fresh inputs."""
    compiled = kiln.compile(fn)
    for seed in (2, 3):
        ours = [t.requires_grad_() for t in _qkv(seed=seed)]
        theirs = [t.detach().clone().requires_grad_() for t in ours]
        out, ref = compiled(*ours), fn(*theirs)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)

"""A warm start skips AOT autograd's graph rewrites (autograd/compile.py `_rewrite`): an entry
the compiled-artifact store gives needs none of them, and the constant-mask rewrite runs the
mask's subgraph. The store keys the graph as capture gave it, so an entry compiled while the
rewrites ran (or while detailed logs were on) is found again, and a later trace of the same
graph (another grad mode) still rewrites it first. Every call is compared with eager on fresh
random data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import logs
from kiln.autograd import compile as aot
from kiln.backends import warm


@pytest.fixture
def rewrites(monkeypatch):
    """How many times the mask rewrite ran, and what it did."""
    runs: list[list[str]] = []
    real = aot.simplify_attention_masks

    def counting(gm):
        runs.append(real(gm))
        return runs[-1]

    monkeypatch.setattr(aot, "simplify_attention_masks", counting)
    return runs


def attend(q, k, v, w):
    n = q.size(-2)
    i = torch.arange(n)
    mask = i[:, None] >= i[None, :]  # the causal triangle, built as transformers builds it
    out = F.scaled_dot_product_attention(q @ w, k, v, attn_mask=mask)
    return out.tanh() * 2.0


def _inputs(seed: int, grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 8, 16, generator=g) for _ in range(3))
    w = torch.randn(16, 16, generator=g, requires_grad=grad)
    return [q, k, v, w]


def _inference_error(seed: int) -> float:
    """A fresh kiln.compile (after kiln.reset) called under no_grad, against eager."""
    kiln.reset()
    xs = _inputs(seed)
    with torch.no_grad():
        got = kiln.compile(attend)(*xs)
        want = attend(*xs)
    return (got - want).abs().max().item()


def test_a_loaded_entry_runs_no_rewrite_and_a_later_trace_does(cache, rewrites):
    before = dict(warm.STATS)
    assert _inference_error(1) < 1e-5
    assert len(rewrites) == 1 and any("causal" in n for n in rewrites[0]), rewrites
    assert warm.STATS["stored"] - before["stored"] == 1

    assert _inference_error(2) < 1e-5  # a new compile of the same program: loaded
    assert warm.STATS["hits"] - before["hits"] == 1
    assert len(rewrites) == 1, "a loaded entry ran the graph rewrites"

    # the loaded graph's next entry (gradients on) is traced: the rewrites run before it
    kiln.reset()
    compiled = kiln.compile(attend)
    with torch.no_grad():
        compiled(*_inputs(3))
    assert len(rewrites) == 1
    xs = _inputs(4, grad=True)
    got = compiled(*xs)
    (gw,) = torch.autograd.grad(got.square().sum(), xs[3])
    want = attend(*xs)
    (ww,) = torch.autograd.grad(want.square().sum(), xs[3])
    assert len(rewrites) == 2 and any("causal" in n for n in rewrites[1]), rewrites
    assert (got - want).abs().max().item() < 1e-5
    assert (gw - ww).abs().max().item() < 1e-4


def test_an_entry_compiled_with_detailed_logs_is_keyed_as_captured(cache, rewrites):
    logs.set_logs("aot_graphs")  # entries are compiled (not loaded) while it is on
    before = dict(warm.STATS)
    assert _inference_error(1) < 1e-5
    assert warm.STATS["stored"] - before["stored"] == 1
    logs.set_logs()
    assert _inference_error(2) < 1e-5
    assert warm.STATS["hits"] - before["hits"] == 1, "the logged compile's entry was not found"
    assert len(rewrites) == 1

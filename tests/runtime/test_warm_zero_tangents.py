"""A loaded entry (the warm start, backends/warm.py) whose call returns an output that gets no
gradient (an HF model's logits beside its loss): its backward must not read zeros of that
output's size, allocated when the most memory is alive. The compiling process keeps the backward
compiled for the absent tangent (autograd/zero_tangents.py) beside the entry; a later process
loads it. Every call compares kiln's loss and gradient with eager's on fresh data."""

from __future__ import annotations

import torch

import kiln
from kiln.backends import warm
from kiln.bench.live_bytes import LiveBytes

ROWS, COLS = 64, 4096  # the unused output: 1 MiB of float32


def loss_and_logits(x, w):
    logits = torch.tanh(x @ w)
    return logits.square().mean(), logits


def _backward_peak(seed: int) -> int:
    """A fresh kiln.compile's second call (the first is the trace) and the backward of its loss
    alone, against eager's; the most bytes the backward had alive at once."""
    kiln.reset()
    compiled = kiln.compile(loss_and_logits)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(256, COLS, generator=gen, requires_grad=True)
    compiled(torch.randn(ROWS, 256, generator=gen), w)  # the trace (and the entry's load)
    x = torch.randn(ROWS, 256, generator=gen)
    loss, logits = compiled(x, w)
    with LiveBytes() as live:
        (grad,) = torch.autograd.grad(loss, w)
    want_loss, want_logits = loss_and_logits(x, w)
    (want_grad,) = torch.autograd.grad(want_loss, w)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(logits, want_logits)
    torch.testing.assert_close(grad, want_grad)
    return live.peak


def test_a_loaded_backward_reads_no_zeros_for_an_unused_output(cache, monkeypatch):
    cold = _backward_peak(1)  # compiles the entry, then the backward without the logits' tangent
    before = dict(warm.STATS)
    loaded = _backward_peak(2)
    assert warm.STATS["hits"] - before["hits"] == 1, "the second compile did not load the entry"
    logits_bytes = ROWS * COLS * 4
    # the same backward (loaded, not compiled): its peak is the compiling process's; reading
    # zeros for the logits added their bytes to it
    assert loaded < cold + logits_bytes // 2, (loaded, cold)

    # an entry whose variant is not kept (another process compiled the entry and stopped before
    # a backward): the whole backward, with zeros for the logits, still gives eager's gradient
    asked: list = []
    monkeypatch.setattr(warm, "_variants", lambda store, key: lambda absent: asked.append(absent))
    _backward_peak(3)
    assert asked == [(1,)]  # the logits' tangent (the second output's) was absent

"""A graph that capture made with dynamic sizes runs at every size it is called with.

`aot_compile` traces such a graph once with symbolic sizes (test_symbolic_aot.py); the code
generator builds it per size while it declines symbolic sizes (backends/specialize.py). Once,
the compiled graph for the first dynamic size was called with the next one and refused it
("recompile for the new shape"): `kiln.compile(f)` failed on the third sequence length
(automatic dynamic shapes), and `dynamic=True` on the second."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln


def _fresh(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def row_softmax(x, w):
    return F.softmax(x @ w, dim=-1).sum(-1) + x.sin().mean(-1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_inference_at_every_length(dynamic):
    compiled = kiln.compile(row_softmax, dynamic=dynamic)
    w = _fresh(16, 8, seed=0)
    for n in (5, 9, 13, 17, 9):
        x = _fresh(n, 16, seed=n)
        torch.testing.assert_close(compiled(x, w), row_softmax(x, w), rtol=1e-5, atol=1e-5)


def test_training_at_every_length():
    lin = torch.nn.Linear(16, 16)
    compiled = kiln.compile(lin)
    for n in (4, 6, 10, 12):
        x = _fresh(3, n, 16, seed=n)
        lin.zero_grad()
        out = compiled(x).tanh().sum()
        out.backward()
        got = [p.grad.clone() for p in lin.parameters()]
        lin.zero_grad()
        ref = lin(x).tanh().sum()
        ref.backward()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for g, p in zip(got, lin.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)

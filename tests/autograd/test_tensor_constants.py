"""Graphs whose joint graph holds tensor constants (make_fx's `_tensor_constantN`, from a
`torch.tensor(...)` of Python numbers in the program: GPT-Neo's and Falcon's masks, GPT-2's
loss) go through AOT autograd: the forward and the backward each fetch the constants they
read, nothing falls back to eager kernels, and results and gradients equal eager's."""

import pytest
import torch

import kiln
from kiln.backends import builtin


def _program(x, w):
    scale = torch.tensor([2.0, 3.0, 0.5])  # a constant the backward reads too
    y = (x @ w) * scale
    mask = torch.tensor([True, False, True])
    return torch.where(mask, y.sin(), y * torch.tensor(-1.5)).sum(0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_tensor_constants_in_forward_and_backward(backend):
    cf = kiln.compile(_program, backend=backend)
    before = len(builtin.fallbacks())
    for _ in range(3):
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 3, requires_grad=True)
        xe, we = (t.detach().clone().requires_grad_(True) for t in (x, w))
        got, expected = cf(x, w), _program(xe, we)
        torch.testing.assert_close(got, expected)
        g = torch.randn_like(got)
        got.backward(g)
        expected.backward(g)
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(w.grad, we.grad)
    assert builtin.fallbacks()[before:] == []
    state = cf._kiln_compiled
    assert state.eager_reason is None and not state.breaks
    assert len(state.graph_modules) == 1

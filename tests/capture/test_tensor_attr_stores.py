"""Assignments to tensor attributes inside a compiled function: `.grad` of an input and an
attribute of the user's own, on an input and on a tensor the graph makes and returns. Done on
the traced call and replayed by the residual program on later calls: one graph, no eager
fallback, the same attributes as eager's."""

import torch
from harness import CountingBackend

import kiln


def _prog(x, g):
    x.grad = g * 2
    y = (x * 3).detach()
    y.tag = ("scaled", 3)
    x.note = g.sum()
    return y + 1, y


def test_tensor_attribute_stores_are_replayed():
    backend = CountingBackend()
    cf = kiln.compile(_prog, backend=backend)
    for _ in range(3):
        x = torch.randn(4, requires_grad=True)
        g = torch.randn(4)
        xe = x.detach().clone().requires_grad_(True)
        (out, y), (out_e, y_e) = cf(x, g), _prog(xe, g)
        torch.testing.assert_close(out, out_e)
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(x.note, xe.note)
        assert y.tag == y_e.tag
    state = cf._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert not state.breaks
    assert len(backend.graphs) == 1

"""`t.requires_grad_()` on a tensor made inside a compiled function: a graph break (as under
torch.compile) after which the rest is compiled with the new leaf as an input requiring grad;
no graph is handed back to eager kernels, and the leaf's `.grad` equals eager's
(capture/leaf_tensors.py)."""

import pytest
import torch

import kiln
from kiln.backends.builtin import fallbacks


def make_leaf(x):
    t = (torch.ones(3) * 2).requires_grad_()
    y = (x * t).sum() + (t * t).sum()
    return y, t


def test_new_leaf_breaks_and_gets_its_gradient():
    cf = kiln.compile(make_leaf)
    before = len(fallbacks())
    for _ in range(3):
        x = torch.randn(3)
        y, t = cf(x)
        y.backward()
        ye, te = make_leaf(x)
        ye.backward()
        assert t.is_leaf and t.requires_grad
        torch.testing.assert_close(y, ye)
        torch.testing.assert_close(t.grad, te.grad)
    assert len(fallbacks()) == before, "no graph runs on eager kernels"
    out = kiln.explain(make_leaf)(torch.randn(3))
    assert out.graph_break_count == 1
    assert "requires_grad_" in out.breaks[0][0]


def test_requires_grad_on_a_tensor_that_has_it_is_no_break():
    def f(x):
        h = (x * 2).requires_grad_()  # computed from x, which requires grad: a no-op
        return h.sin().sum()

    x = torch.randn(4, requires_grad=True)
    out = kiln.explain(f)(x)
    assert out.graph_break_count == 0
    cf = kiln.compile(f)
    for _ in range(2):
        x = torch.randn(4, requires_grad=True)
        (g,) = torch.autograd.grad(cf(x), x)
        (e,) = torch.autograd.grad(f(x), x)
        torch.testing.assert_close(g, e)


def attr_leaf(x):
    t = torch.ones(3) * 2
    t.requires_grad = True
    return (x * t).sum(), t


def attr_leaf_in_loop(x):
    total = x.sum() * 0
    for k in range(2):
        t = torch.ones(3) * (k + 1)
        t.requires_grad = True
        total = total + (x * t).sum()
    return total, t


def test_requires_grad_assignment_resumes_after_the_store():
    for f in (attr_leaf, attr_leaf_in_loop):
        kiln.reset()
        cf = kiln.compile(f)
        for _ in range(3):
            x = torch.randn(3)
            y, t = cf(x)
            y.backward()
            ye, te = f(x)
            ye.backward()
            torch.testing.assert_close(y, ye)
            torch.testing.assert_close(t.grad, te.grad)
        out = kiln.explain(f)(torch.randn(3))
        assert out.graph_break_count >= 1
        assert "runs eagerly" not in str(out), "the rest of the function is compiled"


def test_requires_grad_assignment_on_a_non_leaf_raises_as_eager():
    def f(x):
        t = x * 2
        t.requires_grad = False
        return t

    x = torch.randn(3, requires_grad=True)
    try:
        f(x)
    except RuntimeError as e:
        expected = type(e)
    with pytest.raises(expected):
        kiln.compile(f)(x)

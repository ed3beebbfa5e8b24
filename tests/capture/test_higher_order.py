"""torch.cond and while_loop inside compiled code: one graph node with the branches as subgraphs,
outputs and gradients equal to eager's with both branches taken, clean breaks for what a
subgraph cannot hold, torch's errors for wrong uses (capture/higher_order.py)."""

import pytest
import torch
from harness import CountingBackend
from torch._higher_order_ops.while_loop import while_loop

import kiln
from kiln.capture.errors import Unsupported


class Gate(torch.nn.Module):
    """A module whose forward picks a branch by a data-dependent predicate; the true branch
    reads a parameter from outside (a free value lifted into the subgraph)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.scale = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        y = x * 2
        out = torch.cond(
            y.sum() > 0,
            lambda a: (self.lin(a).tanh(), a.sin()),
            lambda a: (a.cos() * self.scale, a.exp()),
            (y,),
        )
        return out[0] * out[1]


def _grads(out, params):
    gs = torch.autograd.grad(out.sum(), params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(gs, params)]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_cond_outputs_and_gradients_both_branches(backend):
    m = Gate()
    cm = kiln.compile(m, backend=backend, fullgraph=True)
    taken = set()
    for i in range(6):
        x = torch.randn(5, 6, requires_grad=True) + (1.5 if i % 2 else -1.5)
        taken.add(bool((x * 2).sum() > 0))
        got, expected = cm(x), m(x)
        torch.testing.assert_close(got, expected)
        params = [x, *m.parameters()]
        for g, e in zip(_grads(got, params), _grads(expected, params)):
            torch.testing.assert_close(g, e)
    assert taken == {True, False}


def test_cond_is_one_graph_with_two_subgraphs():
    be = CountingBackend()
    m = Gate()
    cm = kiln.compile(m, backend=be)
    for i in range(4):
        x = torch.randn(3, 6) + (2.0 if i % 2 else -2.0)
        torch.testing.assert_close(cm(x), m(x))
    assert len(be.graphs) == 1, "one compile serves both branches"
    gm = be.graphs[0]
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 1
    subs = [getattr(gm, n.target) for n in conds[0].args[1:3]]
    assert all(isinstance(s, torch.fx.GraphModule) for s in subs)
    assert be.runs == 3  # the first call is the trace itself


def test_cond_python_and_shape_predicates_run_one_branch():
    def f(x, flag: bool):
        a = torch.cond(flag, lambda t: t.sin(), lambda t: t.cos(), (x,))
        b = torch.cond(x.shape[0] > 3, lambda t: t + 1, lambda t: t - 1, [x])
        return a * b

    cf = kiln.compile(f, fullgraph=True)
    for flag in (True, False, True):
        for n in (2, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(cf(x, flag), f(x, flag))


def test_cond_without_grad_zero_dim_pred():
    def f(x, p):
        return torch.cond(p, lambda a, b: a @ b, lambda a, b: a - b.t(), (x, x.t().contiguous()))

    cf = kiln.compile(f, fullgraph=True)
    with torch.no_grad():
        for i in range(4):
            x, p = torch.randn(4, 4), torch.tensor(i % 2 == 0)
            torch.testing.assert_close(cf(x, p), f(x, p))


def test_cond_branch_that_breaks_falls_back_cleanly():
    def f(x):
        y = x + 1
        return torch.cond(y.sum() > 0, lambda a: a * a.max().item(), lambda a: a.cos(), (y,))

    cf = kiln.compile(f)
    for i in range(4):
        x = torch.randn(5) + (1.0 if i % 2 else -1.0)
        torch.testing.assert_close(cf(x), f(x))
    out = kiln.explain(f)(torch.randn(5))
    assert out.graph_break_count >= 1
    assert any("torch.cond" in reason and "item" in reason for reason, _, _ in out.breaks)
    with pytest.raises(Unsupported, match="item"):
        kiln.compile(f, fullgraph=True)(torch.randn(5))


def test_cond_branch_changing_its_operand_breaks_and_matches_eager():
    """A branch that changes its operand in place (torch allows it without grad) cannot be a
    subgraph: kiln breaks before the call, which then runs as in eager; with grad on, torch
    rejects it and the compiled call raises eager's error."""

    def true_fn(a):
        a.add_(1)
        return a * 2

    def f(x):
        y = x * 1
        return torch.cond(y.sum() > 0, true_fn, lambda a: a - 1, (y,)) + y

    cf = kiln.compile(f)
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(6) + (2.0 if i % 2 else -2.0)
            torch.testing.assert_close(cf(x), f(x))
        reasons = [r for r, _, _ in kiln.explain(f)(torch.randn(6) + 2).breaks]
    assert any("torch.cond" in r and "in place" in r for r in reasons)
    x = torch.randn(6) + 2.0
    with pytest.raises(Exception) as eager:
        f(x)
    kiln.reset()
    with pytest.raises(type(eager.value)):
        kiln.compile(f)(x)


def test_cond_wrong_uses_raise_torch_errors():
    x = torch.randn(4)
    dtype = kiln.compile(lambda x: torch.cond(x.sum() > 0, lambda a: a, lambda a: a.int(), (x,)))
    with pytest.raises(RuntimeError, match="alias|same dtype"):
        dtype(x)
    mixed = kiln.compile(
        lambda x: torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: (a * 2).int(), (x,))
    )
    with pytest.raises(RuntimeError, match="expected same dtype"):
        mixed(x)
    count = kiln.compile(
        lambda x: torch.cond(x.sum() > 0, lambda a: (a + 1, a * 2), lambda a: a + 1, (x,))
    )
    with pytest.raises(RuntimeError, match="same number of outputs"):
        count(x)
    pred = kiln.compile(lambda x: torch.cond(x > 0, lambda a: a + 1, lambda a: a - 1, (x,)))
    with pytest.raises(RuntimeError, match="single-element tensor"):
        pred(x)
    alias = kiln.compile(lambda x: torch.cond(x.sum() > 0, lambda a: a[:2], lambda a: a[2:], (x,)))
    with pytest.raises(RuntimeError, match="aliasing"):
        alias(x)


def test_while_loop_matches_eager():
    w = torch.randn(5)

    def f(x, n):
        i = torch.zeros((), dtype=torch.int64)
        _, y = while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 0.5 + w), (i, x))
        return y.sum(0)

    be = CountingBackend()
    cf = kiln.compile(f, backend=be, fullgraph=True)
    for k in (3, 0, 5):
        x, n = torch.randn(4, 5), torch.tensor(k)
        torch.testing.assert_close(cf(x, n), f(x, n))
    assert len(be.graphs) == 1
    assert any(n.target is torch.ops.higher_order.while_loop for n in be.graphs[0].graph.nodes)
    cf2 = kiln.compile(f, fullgraph=True)  # kiln's default backend
    for k in (2, 4):
        x, n = torch.randn(4, 5), torch.tensor(k)
        torch.testing.assert_close(cf2(x, n), f(x, n))


class Loop(torch.nn.Module):
    """A while_loop whose body reads a parameter from outside and whose carried tensor
    requires grad: AOT autograd traces the loop (its fake kernel needs a shape environment)
    and differentiates it by torch's own rule."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5, 5) * 0.3)

    def forward(self, x, n):
        i = torch.zeros((), dtype=torch.int64)
        _, y = while_loop(lambda i, y: i < n, lambda i, y: (i + 1, (y @ self.w).tanh() + y), (i, x))
        return y * 2


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_while_loop_through_aot_autograd_forward_and_backward(backend):
    from kiln.backends import builtin

    m = Loop()
    cm = kiln.compile(m, backend=backend, fullgraph=True)
    before = len(builtin.fallbacks())
    for k in (3, 0, 4):
        x, n = torch.randn(4, 5, requires_grad=True), torch.tensor(k)
        got, expected = cm(x, n), m(x, n)
        torch.testing.assert_close(got, expected)
        params = [x, m.w]
        for g, e in zip(_grads(got, params), _grads(expected, params)):
            torch.testing.assert_close(g, e)
        with torch.no_grad():  # the inference graph too
            torch.testing.assert_close(cm(x, n), m(x, n))
    # AOT autograd takes the graph (no 'eager' backend); the code generator may still run a
    # graph whose sizes depend on the iteration count on ATen kernels (reported, not refused)
    assert [str(f) for f in builtin.fallbacks()[before:] if f.stage == "AOT autograd"] == []

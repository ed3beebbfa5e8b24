"""What crosses a graph break: sizes that were symbolic before it become symbols of the
continuation's own shape environment (not nodes of the graph before the break), and any live
value, a builtin type on the value stack included, is handed over; objects made inside the
function (natively too: an ABC, a class with its own metaclass) are rebuilt from their state on
every call, never handed out by identity. Compared with eager on fresh inputs of changing
sizes, through AOT autograd so a malformed graph cannot pass."""

import abc

import torch
from harness import CountingBackend

import kiln
from kiln.backends import builtin


@kiln.disable
def disabled_helper(y):
    return y * 1.25


def _sizes_across_break(x):
    b, n = x.shape
    y = (x * 2).view(b, n, 1)
    y = disabled_helper(y)  # b and n live across the break
    return y.view(b, 1, n).sum(-1) + n


def test_symbolic_sizes_cross_a_break_as_symbols():
    backend = CountingBackend()
    cf = kiln.compile(_sizes_across_break, backend=backend)
    for n in (4, 6, 8, 10):
        x = torch.randn(2, n)
        torch.testing.assert_close(cf(x), _sizes_across_break(x))
    # static: graph + continuation; then dynamic: graph + continuation serving 6, 8 and 10
    assert len(backend.graphs) == 4
    for gm in backend.graphs:
        gm.graph.lint()  # every node it reads is its own


def test_symbolic_sizes_across_a_break_train_through_aot():
    def prog(x, w):
        b, n = x.shape
        h = (x @ w).view(b, n, 1).tanh()
        h = disabled_helper(h)
        return h.view(b, n).sum(1) * n

    cf = kiln.compile(prog, backend="aot_eager")
    before = len(builtin.fallbacks())
    for n in (4, 6, 8):
        x = torch.randn(3, n)
        w = torch.randn(n, n, requires_grad=True)
        we = w.detach().clone().requires_grad_(True)
        got, expected = cf(x, w), prog(x, we)
        torch.testing.assert_close(got, expected)
        got.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(w.grad, we.grad)
    assert builtin.fallbacks()[before:] == []
    state = cf._kiln_compiled
    assert [u.eager_reason for u in (state, *state.continuations.values())] == [None, None]


def test_builtin_type_on_the_stack_at_a_break():
    def prog(x):
        out = x * 1
        for i, t in enumerate(disabled_helper(x)):  # `enumerate` waits on the stack
            out = out + t * i
        return out

    backend = CountingBackend()
    cf = kiln.compile(prog, backend=backend)
    for _ in range(3):
        x = torch.randn(3, 2)
        torch.testing.assert_close(cf(x), prog(x))
    state = cf._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert len(backend.graphs) == 2


class Accumulator(abc.ABC):  # noqa: B024 - an ABC for its metaclass (ABCMeta)
    def __init__(self, t):
        self.t = t
        self.calls = 0

    def add(self, y):
        self.t = self.t + y
        self.calls += 1


class Meta(type):
    pass


class Counter(metaclass=Meta):  # built natively (a metaclass of its own)
    def __init__(self, start):
        self.seen = [start]


def test_objects_made_inside_are_rebuilt_on_every_call():
    def prog(x):
        acc = Accumulator(x * 2)
        acc.add(x.cos())
        c = Counter(x.sum())
        c.seen.append(acc.t.mean())
        return acc, c

    backend = CountingBackend()
    cf = kiln.compile(prog, backend=backend)
    previous = []
    for _ in range(3):
        x = torch.randn(4)
        (acc, c), (acc_e, c_e) = cf(x), prog(x)
        assert type(acc) is Accumulator and type(c) is Counter
        torch.testing.assert_close(acc.t, acc_e.t)
        assert acc.calls == acc_e.calls == 1
        torch.testing.assert_close(c.seen, c_e.seen)
        assert all(acc is not p and c is not q for p, q in previous)
        previous.append((acc, c))
    assert cf._kiln_compiled.eager_reason is None
    assert len(backend.graphs) == 1

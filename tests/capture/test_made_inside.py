"""Objects made inside a compiled function and returned (deque, itertools iterators part way
through, closures and lambdas with defaults, dataclass instances) are rebuilt by the residual
program on every call: fresh objects holding this call's values, equal to eager's, one graph,
no eager fallback."""

import collections
import dataclasses
import itertools

import torch
from harness import CountingBackend

import kiln


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: int


def _prog(x):
    d = collections.deque([x, x * 2], maxlen=3)
    d.append(x + 1)
    d.append(x - 1)  # drops the first: maxlen holds
    counter = itertools.count(3, 2)
    next(counter)
    chained = itertools.chain([x.sin()], [x.cos(), x.tan()])
    next(chained)
    s = x * 2

    def shift(y, k=3):
        return y + s * k

    scale = lambda y, m=x.sum(): y * m  # noqa: E731, B008 - a default made per call
    return d, counter, chained, shift, scale, Pair(x.exp(), 4)


def _same(got, expected, y):
    d, counter, chained, shift, scale, pair = got
    de, ce, che, she, sce, pe = expected
    assert type(d) is collections.deque and d.maxlen == de.maxlen == 3
    torch.testing.assert_close(list(d), list(de))
    assert next(counter) == next(ce)
    torch.testing.assert_close(list(chained), list(che))
    torch.testing.assert_close(shift(y), she(y))
    torch.testing.assert_close(shift(y, k=5), she(y, k=5))
    torch.testing.assert_close(scale(y), sce(y))
    torch.testing.assert_close(pair.a, pe.a)
    assert pair.b == pe.b


def test_objects_made_inside_are_rebuilt():
    backend = CountingBackend()
    cf = kiln.compile(_prog, backend=backend)
    seen = []
    for _ in range(3):
        x, y = torch.randn(4), torch.randn(4)
        got = cf(x)
        _same(got, _prog(x), y)
        assert all(got[0] is not d and got[3] is not f for d, f in seen)
        seen.append((got[0], got[3]))
    state = cf._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert not state.breaks
    assert len(backend.graphs) == 1

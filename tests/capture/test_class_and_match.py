"""Class statements and `match` statements inside compiled functions, compared with eager.

A class body runs on kiln's interpreter (its reads from outside are guarded); the metaclass
call is native. `match` patterns test sequences, mappings, classes and values on real data.
"""

from __future__ import annotations

import pytest
import torch
from harness import CountingBackend, assert_same, check, clone

import kiln

SCALE = 2.0


def _class_program(x):
    bias = x.mean()

    class Scaler:
        factor = SCALE  # a global read by the class body: guarded
        offset: float = 0.5  # SETUP_ANNOTATIONS
        shift = bias  # the enclosing function's variable (LOAD_CLASSDEREF / ..._OR_DEREF)

        def __init__(self, b):
            self.b = b

        def __call__(self, t):
            return t * self.factor + self.b + self.shift + self.offset

    class Shifted(Scaler):
        def __call__(self, t):
            return super().__call__(t) - 1  # __class__ cell of the body

    assert "offset" in Scaler.__annotations__ and Shifted.__qualname__.endswith("<locals>.Shifted")
    return Shifted(0.25)(x)


def test_class_defined_in_the_function_is_one_graph_and_guards_its_body_reads():
    global SCALE
    compiled, backend = check(_class_program, lambda: (torch.randn(5),), fullgraph=True)
    old = SCALE
    try:
        SCALE = -3.0  # the class attribute comes from here: the trace must not keep 2.0
        x = torch.randn(5)
        assert_same(compiled(x.clone()), _class_program(x.clone()))
    finally:
        SCALE = old
    assert len(backend.graphs) == 2


def test_autograd_function_defined_in_the_function():
    def fn(x):
        class Square(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                ctx.save_for_backward(t)
                return t * t

            @staticmethod
            def backward(ctx, g):
                (t,) = ctx.saved_tensors
                return 2 * t * g

        return Square.apply(x).sum(0)

    x = torch.randn(4, 3, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    cf = kiln.compile(fn, backend="eager")
    got, expected = cf(x), fn(xe)
    assert_same(got, expected)
    got.sum().backward()
    expected.sum().backward()
    assert_same(x.grad, xe.grad)
    assert cf._kiln_compiled.eager_reason is None, cf._kiln_compiled.eager_reason


def test_pytorch_masked_reduction():
    # torch.masked defines a class (an autograd.Function) inside its helpers
    def fn(x, mask):
        return torch.masked.sum(x, 1, mask=mask) + torch.masked.amax(x, 1, mask=mask)

    def args():
        x = torch.randn(4, 6)
        mask = torch.rand(4, 6) > 0.3
        mask[:, 0] = True
        return x, mask

    cf = kiln.compile(fn, backend="eager")
    for _ in range(3):
        a = args()
        assert_same(cf(*clone(a)), fn(*clone(a)))
    assert cf._kiln_compiled.eager_reason is None, cf._kiln_compiled.eager_reason


class Point:
    __match_args__ = ("px", "py")

    def __init__(self, px, py):
        self.px, self.py = px, py


class Box:
    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi


def _match_program(x, spec):
    match spec:
        case {"mode": "scale", "k": k, **rest}:
            return x * k + len(rest)
        case [a, b, *more] if len(more) < 3:
            return x * a + b - len(more)
        case (a,):
            return x - a
        case Point(px, py=0.0):
            return x * px
        case Point(px, py):
            return x * px + py
        case Box(lo=lo, hi=hi):
            return x.clamp(lo, hi)
        case int(n) if n > 0:
            return x + n
        case str() as s:
            return x * len(s)
        case torch.Tensor():
            return x * spec
        case _:
            return -x


_SPECS = [
    {"mode": "scale", "k": 1.5, "extra": 1},
    [2.0, 0.5],
    [2.0, 0.5, 1, 1],
    [1, 2, 3, 4, 5],
    (3.0,),
    Point(2.0, 0.0),
    Point(2.0, 1.0),
    Box(-0.5, 0.5),
    7,
    -7,
    "abc",
    None,
    {"mode": "other"},
]


@pytest.mark.parametrize("fullgraph", [False, True])
def test_match_statement_on_every_kind_of_pattern(fullgraph):
    backend = CountingBackend()
    cf = kiln.compile(
        _match_program,
        backend=backend,
        fullgraph=fullgraph,
        options={"cache_size_limit": 2 * len(_SPECS)},  # one entry a case
    )
    for spec in [*_SPECS, *_SPECS, torch.randn(4)]:
        x = torch.randn(4)
        assert_same(cf(x.clone(), spec), _match_program(x.clone(), spec))
    assert cf._kiln_compiled.eager_reason is None, cf._kiln_compiled.eager_reason
    assert backend.graphs


def test_match_reads_of_an_outside_object_are_guarded():
    p = Point(2.0, 0.0)

    def fn(x):
        match p:
            case Point(px, py=0.0):
                return x * px
            case Point(px, py):
                return x + px + py

    cf = kiln.compile(fn, backend="eager")
    for px, py in [(2.0, 0.0), (3.0, 0.0), (3.0, 1.0), (2.0, 0.0)]:
        p.px, p.py = px, py
        x = torch.randn(3)
        assert_same(cf(x.clone()), fn(x.clone()))

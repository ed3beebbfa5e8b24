"""`except*` (exception groups) and generic classes inside compiled functions: they compile in
one graph (fullgraph=True) and give eager's values, exceptions and classes; what stays
unimplemented (a lazily evaluated bound of a PEP 695 type parameter) is a reported fallback."""

import sys
import textwrap
import typing

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln
from kiln.capture.errors import Unsupported

PEP695 = sys.version_info >= (3, 12)


def _groups(e):
    """An exception (group) as comparable data: type, message, args and the leaves' shape."""
    if isinstance(e, BaseExceptionGroup):
        return (type(e), e.message, [_groups(s) for s in e.exceptions])
    return (type(e), e.args)


def _handled(x, exc):
    total = x
    try:
        raise exc
    except* ValueError as g:
        total = total + len(g.exceptions) * x.sin()
        assert sys.exc_info()[1] is g
    except* (TypeError, KeyError) as g:
        total = total * (2 + len(g.exceptions))
    return total


@pytest.mark.parametrize(
    "exc",
    [
        lambda: ExceptionGroup("g", [ValueError(1), TypeError(2), ValueError(3)]),
        lambda: ExceptionGroup("g", [ExceptionGroup("inner", [KeyError(4)]), ValueError(5)]),
        lambda: ValueError("naked"),
        lambda: TypeError("naked"),
    ],
    ids=["flat", "nested", "naked-first", "naked-second"],
)
def test_except_star_matches_and_splits_in_one_graph(exc):
    def fn(x):
        return _handled(x, exc())

    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        assert_same(compiled(x), fn(x))
    assert len(backend.graphs) == 1


def _reraising(x, exc):
    try:
        raise exc
    except* ValueError:
        x.add_(1)
        raise
    except* TypeError as g:
        raise RuntimeError(f"from {len(g.exceptions)}") from None
    except* OSError:
        pass


@pytest.mark.parametrize(
    "exc",
    [
        lambda: ExceptionGroup("g", [ValueError(1), TypeError(2), KeyError(3)]),
        lambda: ExceptionGroup("g", [ValueError(1), OSError(2)]),
        lambda: ExceptionGroup("g", [ExceptionGroup("in", [ValueError(1)]), KeyError(2)]),
        lambda: ExceptionGroup("g", [OSError(1)]),
        lambda: TypeError("naked"),
        lambda: KeyError("unmatched"),
    ],
    ids=["raised-and-reraised", "reraised", "nested", "handled", "naked-raised", "unmatched"],
)
def test_except_star_propagates_what_eager_propagates(exc):
    def fn(x):
        _reraising(x, exc())
        return x * 2

    compiled = kiln.compile(fn, backend=CountingBackend(), fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        mine, theirs = x.clone(), x.clone()
        outcome = []
        for f, arg in ((compiled, mine), (fn, theirs)):
            try:
                outcome.append(("value", f(arg)))
            except BaseException as e:  # noqa: BLE001 - the exception is what is compared
                outcome.append(("raised", _groups(e)))
        assert outcome[0][0] == outcome[1][0]
        if outcome[0][0] == "value":
            assert_same(outcome[0][1], outcome[1][1])
        else:
            assert outcome[0][1] == outcome[1][1]
        assert_same(mine, theirs)


def test_except_star_rejects_exception_group_types_as_eager_does():
    def fn(x):
        try:
            raise ExceptionGroup("g", [ValueError()])
        except* ExceptionGroup:
            pass
        return x

    compiled = kiln.compile(fn, backend=CountingBackend())
    with pytest.raises(TypeError, match="catching ExceptionGroup with except"):
        compiled(torch.randn(2))


T = typing.TypeVar("T")


def test_generic_class_defined_inside_a_compiled_function():
    def fn(x):
        class Box(typing.Generic[T]):
            def __init__(self, v: T) -> None:
                self.v = v

            def get(self) -> T:
                return self.v

        b = Box[torch.Tensor](x.cos())
        return b.get() + 1, Box.__parameters__ == (T,), typing.Generic in Box.__mro__

    compiled = kiln.compile(fn, backend=CountingBackend(), fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        assert_same(compiled(x), fn(x))


PEP695_SOURCE = textwrap.dedent(
    """
    def generic(x):
        class Pair[A, *Ts, **P]:
            def __init__(self, a: A) -> None:
                self.a = a

        def first[U](items: list[U]) -> U:
            return items[0]

        p = Pair(x * 2)
        params = Pair.__type_params__
        kinds = tuple(type(t).__name__ for t in params)
        return (
            first([p.a, x]) + 1,
            kinds,
            tuple(t.__name__ for t in params),
            params[0].__infer_variance__,
            params[0].__module__,
            first.__type_params__[0].__name__,
            Pair.__orig_bases__[0].__origin__ is typing.Generic,
        )

    def bounded(x):
        class Num[N: float]:
            pass

        return x + 1, Num.__type_params__[0].__bound__
    """
)


@pytest.mark.skipif(not PEP695, reason="PEP 695 syntax is Python 3.12+")
def test_pep695_generic_class_and_function_in_one_graph():
    scope = {"typing": typing}
    exec(PEP695_SOURCE, scope)
    fn = scope["generic"]
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        assert_same(compiled(x), fn(x))
    assert len(backend.graphs) == 1


@pytest.mark.skipif(not PEP695, reason="PEP 695 syntax is Python 3.12+")
def test_pep695_bound_is_a_reported_fallback():
    scope = {"typing": typing}
    exec(PEP695_SOURCE, scope)
    fn = scope["bounded"]
    with pytest.raises(Unsupported, match="INTRINSIC_TYPEVAR_WITH_BOUND"):
        kiln.compile(fn, backend=CountingBackend(), fullgraph=True)(torch.randn(2))
    compiled = kiln.compile(fn, backend=CountingBackend())
    x = torch.randn(3)
    with pytest.warns(kiln.KilnEagerWarning, match="INTRINSIC_TYPEVAR_WITH_BOUND"):
        got = compiled(x)
    assert_same(got, fn(x))

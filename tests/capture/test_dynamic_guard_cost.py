"""A dynamic entry's guards are as cheap as the facts they check allow (issue 31: the per-call
cost of a `dynamic=True` entry within 10 us of a static one's).

The shape environment's facts are simplified before they are written (capture/dynamic.py,
`simplified_facts`): sizes found equal are checked once as a class and every other fact is
written over the class's first member, so repeated facts fall away; and each size the facts read
more than once is read once into a local (guards.py). The simplified facts must hold exactly
when the original ones do: checked here on every assignment of small sizes, and end to end by
calls whose sizes break one fact at a time, each of which must recompile and match eager.
"""

import itertools
import re

import sympy
import torch

import kiln
from kiln.capture import dynamic


def nine_weights(x, *ws):
    y = x
    for w in ws:
        y = y * w + 1.0
    return y


def _entry_source(compiled) -> str:
    (source,) = compiled._kiln_compiled.entry_sources
    return source


def test_each_size_is_read_once_and_equal_sizes_are_one_class():
    ws = [torch.randn(8) for _ in range(9)]
    compiled = kiln.compile(nine_weights, dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, *ws), nine_weights(x, *ws))
    source = _entry_source(compiled)
    # a size fact reads an input through the local its guard bound it to (`___seen0 := ws[0]`)
    bound = dict(re.findall(r"\((___seen\d+) := ([^)]+)\)", source))
    reads = [
        bound.get(base, base) + size
        for base, size in re.findall(r"([\w\]\[]+)(\.size\(\d\))", source)
    ]
    # x's two sizes and each weight's size, each read exactly once
    assert sorted(reads) == sorted(
        ["x.size(0)", "x.size(1)"] + [f"ws[{i}].size(0)" for i in range(9)]
    )
    # nine weights equal to x.size(1): nine equalities, no `ws[i].size(0) != 1` repeated per weight
    assert source.count("!= 1") == 1, source


def test_a_broken_equality_recompiles_and_matches_eager():
    ws = [torch.randn(8) for _ in range(9)]
    compiled = kiln.compile(nine_weights, dynamic=True)
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x, *ws), nine_weights(x, *ws))
    for k in (0, 4, 8):  # one weight now broadcasts (size 1): its equality with x.size(1) fails
        bent = list(ws)
        bent[k] = torch.randn(1)
        x = torch.randn(3, 8)
        torch.testing.assert_close(compiled(x, *bent), nine_weights(x, *bent))
    x = torch.randn(7, 1)  # x's width 1: `x.size(1) >= 2` fails, the weights broadcast x
    torch.testing.assert_close(compiled(x, *ws), nine_weights(x, *ws))


def _holds(facts, values) -> bool:
    return all(bool(f.xreplace(values)) for f in facts)


def test_simplified_facts_hold_exactly_when_the_facts_do():
    a, b, c, d = syms = sympy.symbols("a b c d", integer=True, nonnegative=True)
    cases = [
        [sympy.Eq(a, b), sympy.Ne(b, 1), sympy.Ne(a, 1), sympy.Eq(b, c), sympy.Ge(a * d, 2)],
        [sympy.Eq(c, d), sympy.Eq(a, b), sympy.Eq(b, d), sympy.Ne(c, 1), sympy.Ge(a, 2)],
        [sympy.Ne(a, 1), sympy.Ge(a, 2), sympy.Ne(b, 2), sympy.Gt(b, 2), sympy.Ne(c, 3)],
        [sympy.Ne(a, 1), sympy.Le(1, a), sympy.Ne(b, 0), sympy.Lt(0, b), sympy.Eq(c, 2 * d)],
        [sympy.Eq(a, b), sympy.Eq(b, a), sympy.Eq(a * 2, c + d), sympy.Ne(b, 1)],
    ]
    for facts in cases:
        simple = dynamic.simplified_facts(facts)
        assert len(simple) <= len(facts)
        for values in itertools.product(range(5), repeat=4):
            assign = dict(zip(syms, map(sympy.Integer, values)))
            assert _holds(simple, assign) == _holds(facts, assign), (facts, simple, values)


def test_repeated_facts_fall_away():
    a, b, c = sympy.symbols("a b c", integer=True, nonnegative=True)
    facts = [sympy.Ne(a, 1), sympy.Eq(a, b), sympy.Ne(b, 1), sympy.Eq(a, c), sympy.Ne(c, 1)]
    facts += [sympy.Ge(c, 2)]
    assert dynamic.simplified_facts(facts) == [sympy.Eq(a, b), sympy.Eq(a, c), sympy.Ge(a, 2)]


def _wrappers(compiled_calls) -> list[str]:
    import logging

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    keep = Keep()
    logging.getLogger("kiln").addHandler(keep)
    kiln.set_logs("output_code")
    try:
        compiled_calls()
    finally:
        kiln.set_logs()
        logging.getLogger("kiln").removeHandler(keep)
    return [m for m in messages if "def call" in m]


def test_contiguous_dynamic_inputs_are_not_checked_again_by_the_wrapper():
    """Capture's guard of a dynamic input checks its dimensions and contiguity, and the shape
    facts relate its sizes: the generated wrapper need not check its layout again, nor take an
    arena it puts nothing in. Inputs strided in ways the guard does not pin (a size-1
    dimension's stride, a transposed input) must still give eager's results."""

    def f(x, w):
        return torch.relu(x * w + 1.0)

    compiled = kiln.compile(f, dynamic=True)

    def calls():
        w = torch.randn(8)
        for x in (torch.randn(4, 8), torch.randn(6, 8), torch.randn(3, 8)):
            torch.testing.assert_close(compiled(x, w), f(x, w))
        odd = torch.randn(1, 8).as_strided((1, 8), (100, 1))  # contiguous, any stride on dim 0
        torch.testing.assert_close(compiled(odd, w), f(odd, w))
        for n in (1, 5):  # a weight of size 1 broadcasts: another entry, still eager's
            x, w1 = torch.randn(n, 8), torch.randn(1)
            torch.testing.assert_close(compiled(x, w1), f(x, w1))
        t = torch.randn(8, 5).t()  # strided: another entry, which checks its own layout
        torch.testing.assert_close(compiled(t, w), f(t, w))

    wrappers = _wrappers(calls)
    first = wrappers[0]
    assert "2 inputs' layouts are checked by capture's guards" in first, first
    assert "_fix_input" not in first and "_arena" not in first, first

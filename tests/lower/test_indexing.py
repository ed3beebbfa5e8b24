"""Index helpers of lower/indexing.py: the affine reading of an index (memoized, so it must
agree with sympy's own), and `clamp`, which keeps only the sides an index can cross."""

from __future__ import annotations

import random

import sympy

from kiln.lower.indexing import (
    FloorDiv,
    ModularIndexing,
    affine_coefficients,
    clamp,
    index_vars,
    is_affine,
)

I0, I1, I2 = index_vars(3)


def test_affine_reading_agrees_with_sympy_on_random_expressions():
    rng = random.Random(0)
    for _ in range(200):
        c = [rng.randint(-9, 9) for _ in range(4)]
        expr = c[0] * I0 + c[1] * (I1 + 3) * 2 + c[2] * I2 + c[3]
        assert is_affine(expr, (I0, I1, I2))
        coeffs, const = affine_coefficients(expr, (I0, I1, I2))
        e = sympy.expand(expr)
        assert coeffs == [int(e.coeff(v)) for v in (I0, I1, I2)]
        assert const == int(e.subs({I0: 0, I1: 0, I2: 0}))


def test_not_affine():
    for expr in (I0 * I1, FloorDiv(I0, 4), ModularIndexing(I0, 8), sympy.Max(I0, 3), I0 / 2):
        assert not is_affine(expr, (I0, I1))
    assert not is_affine(I0 + I2, (I0, I1))  # a variable not among those asked about


def test_clamp_keeps_only_the_sides_an_index_can_cross():
    # a 3x3 window with padding 1 and stride 2 over 112 rows, 56 outputs
    assert clamp(2 * I0 - 1, 0, 111, {I0: 56}) == sympy.Max(2 * I0 - 1, 0, evaluate=False)
    assert clamp(2 * I0, 0, 111, {I0: 56}) == 2 * I0  # 0..110: inside
    assert clamp(2 * I0 + 1, 0, 111, {I0: 56}) == 2 * I0 + 1  # 1..111
    both = clamp(I0 - 4, 0, 9, {I0: 20})  # -4..15
    assert isinstance(both, sympy.Max) and any(isinstance(a, sympy.Min) for a in both.args)


def test_clamp_values_match_the_full_clamp_everywhere():
    cases = [(2 * I0 - 1, 0, 111, {I0: 56}), (I0 - 4, 0, 9, {I0: 20}), (3 - I0, 0, 2, {I0: 7})]
    for expr, lo, hi, extents in cases:
        ((var, n),) = extents.items()
        got = clamp(expr, lo, hi, extents)
        for v in range(n):
            want = max(min(int(expr.subs(var, v)), hi), lo)
            assert int(got.subs(var, v)) == want, (expr, v)


def test_clamp_of_an_expression_that_is_not_affine_keeps_both_sides():
    got = clamp(FloorDiv(I0, 2), 0, 3, {I0: 4})
    assert isinstance(got, sympy.Max) and any(isinstance(a, sympy.Min) for a in got.args)


def test_clamp_over_symbolic_lengths_keeps_only_the_sides_it_can_cross():
    """Sizes known per call (shape symbols: positive integers) are compared as expressions: a
    `cat` onto a cache of 3 rows reads its new rows at `i - 3` for `i` in [0, s + 3), which
    never passes s - 1, so only the lower side is clamped, as for any static length; a side no
    comparison settles keeps its clamp. Values are checked against the full clamp at several
    lengths."""
    s = sympy.Symbol("s0", positive=True, integer=True)
    new_rows = clamp(I0 - 3, 0, s - 1, {I0: s + 3})
    assert new_rows == sympy.Max(I0 - 3, 0, evaluate=False)
    assert clamp(I0, 0, s - 1, {I0: s}) == I0  # all of a length: no clamp at all
    cache = clamp(I0, 0, 2, {I0: s + 3})  # the cache's rows: only the upper side
    assert cache == sympy.Min(I0, 2, evaluate=False)
    unknown = clamp(I0, 0, 7, {I0: s})  # s may be above or below 8
    assert unknown == sympy.Min(I0, 7, evaluate=False)
    strided = clamp(s * I0 - I1, 0, s, {I0: 2, I1: s})  # a size as a coefficient: -(s-1)..s
    assert strided == sympy.Max(s * I0 - I1, 0, evaluate=False)
    cases = [(I0 - 3, 0, s - 1, {I0: s + 3}), (I0, 0, 2, {I0: s + 3}), (I0, 0, 7, {I0: s})]
    for n in (1, 2, 5, 9):
        for expr, lo, hi, extents in cases:
            ((var, extent),) = extents.items()
            got = clamp(expr, lo, hi, extents).subs(s, n)
            for v in range(int(extent.subs(s, n))):
                want = max(min(int(expr.subs(var, v)), int(sympy.sympify(hi).subs(s, n))), lo)
                assert int(got.subs(var, v)) == want, (expr, n, v)

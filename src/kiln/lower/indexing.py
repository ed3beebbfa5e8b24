"""Index arithmetic for the loop IR: loop variables, integer division and modulo, view indexers.

Takes sizes and index expressions (sympy; static sizes are plain ints); gives the loop
variables `i0.. / r0..`, the integer functions `FloorDiv` and `ModularIndexing` (which sympy's
own `floor`/`Mod` would rewrite into forms no C printer wants), the indexer of a reshape, and
`sympy_str`, the one printer of index expressions used by IR dumps and the C++ renderer, and
`Indirect`, an index read from memory (`x[idx[i0]]`: gather, embedding, advanced indexing).

Why it exists: every view op (permute, reshape, slice, expand, ...) is a remapping of indices;
keeping that arithmetic in one place keeps views zero-copy and the printed code readable.
"""

from __future__ import annotations

import functools

import sympy
from sympy.core.symbol import Str

from .hints import hint


@functools.lru_cache(maxsize=None)
def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def index_vars(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(_sym(f"i{k}") for k in range(n))


def reduce_vars(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(_sym(f"r{k}") for k in range(n))


class FloorDiv(sympy.Function):
    """`a // b` for a >= 0, b > 0 (indices are never negative)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):  # (x // c) // b == x // (c*b)
            return FloorDiv(a.args[0], a.args[1] * b)
        if not b.is_Integer:  # a symbolic size: only an exact quotient simplifies
            return _exact_quotient(a, b)
        if a.is_Mul and a.args[0].is_Integer and int(a.args[0]) % int(b) == 0:
            return sympy.Mul(sympy.Integer(int(a.args[0]) // int(b)), *a.args[1:])
        return None


class ModularIndexing(sympy.Function):
    """`a % b` for a >= 0, b > 0."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if not b.is_Integer:  # a symbolic size: a multiple of it is 0 modulo it
            return sympy.Integer(0) if _exact_quotient(a, b) is not None else None
        if a.is_Mul and a.args[0].is_Integer and int(a.args[0]) % int(b) == 0:
            return sympy.Integer(0)
        return None


def _exact_quotient(a, b):
    """`a / b` when it is a polynomial with integer coefficients (`4*s0*i0 / s0`), else None:
    then `a // b` is that for every value of the symbols."""
    q = sympy.expand(a / b)
    if sympy.fraction(sympy.together(q))[1] != 1:
        return None
    terms = sympy.Add.make_args(q)
    if all(t.as_coeff_Mul()[0].is_Integer and t.is_polynomial() for t in terms):
        return q
    return None


class Indirect(sympy.Function):
    """An index read from memory: buffer `buf` at `index`, used to index a dimension of `size`.

    Arguments: `(Str(buf), size, wrap, *index)`. With `wrap` a negative value counts from the
    end (`x[-1]`), as advanced indexing does. It is an ordinary integer term of an index, so
    views compose through it and inlining substitutes into its `index` like any other. Renderers
    clamp the value into `[0, size)`, so a bad index never reads outside the buffer; the
    lowering that makes one also adds the check that raises for it (lower/indirect.py).
    """

    is_integer = True
    is_nonnegative = True

    @classmethod
    def make(cls, buf: str, index, size, wrap: bool) -> Indirect:
        return cls(Str(buf), to_sym(size), sympy.true if wrap else sympy.false, *index)

    @property
    def buf(self) -> str:
        return self.args[0].name

    @property
    def size(self):
        """The dimension's size: an int, or an expression when it is symbolic."""
        n = self.args[1]
        return int(n) if n.is_Integer else n

    @property
    def wrap(self) -> bool:
        return bool(self.args[2])

    @property
    def index(self) -> tuple:
        return self.args[3:]


def indirect_terms(expr) -> tuple[Indirect, ...]:
    """Every `Indirect` in an index expression, nested ones included, inner ones first."""
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return ()
    return _indirect_terms(expr)


@functools.lru_cache(maxsize=1 << 16)  # the scheduler asks again and again for the same index
def _indirect_terms(expr: sympy.Basic) -> tuple[Indirect, ...]:
    if not expr.has(Indirect):
        return ()
    return tuple(sorted(expr.atoms(Indirect), key=lambda a: (len(str(a)), str(a))))


def to_sym(x) -> sympy.Expr:
    return sympy.Integer(x) if isinstance(x, int) else x


def is_affine(expr: sympy.Expr, variables) -> bool:
    """True if `expr` is a constant plus integer multiples of `variables` (no div/mod/min)."""
    return _affine_form(expr, tuple(variables)) is not None


def affine_coefficients(expr: sympy.Expr, variables) -> tuple[list[int], int]:
    """The integer multiple of each of `variables` in `expr`, and its constant (for an `expr`
    that is not affine, of its terms that are)."""
    variables = tuple(variables)
    form = _affine_form(expr, variables)
    if form is not None:
        return list(form[0]), form[1]
    expr = sympy.expand(expr)
    coeffs = [int(expr.coeff(v)) for v in variables]
    const = expr.subs({v: 0 for v in variables})
    return coeffs, int(const)


# The same index expressions come back for every layer of a deep model (same loop variables,
# same sizes), and expanding them is most of what lowering and scheduling cost there.
@functools.lru_cache(maxsize=1 << 16)
def _affine_form(expr, variables: tuple) -> tuple[tuple[int, ...], int] | None:
    """(coefficients, constant) of an affine `expr` in `variables`, or None."""
    coeffs = dict.fromkeys(variables, 0)
    const = 0
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            const += coeff
        elif rest in coeffs and coeff.is_Integer:
            coeffs[rest] += int(coeff)
        else:
            return None
    return tuple(coeffs.values()), int(const)


def clamp(expr, lo, hi, extents: dict):
    """`expr` kept within [lo, hi]: `Max(Min(expr, hi), lo)` with only the sides it can cross
    as its loop variables run over `extents` ({variable: extent}), built without sympy's
    simplification (slow: a ResNet-50's max pooling spent 0.2-0.8 s in it, for nothing it
    could simplify). An expression not affine in those variables keeps both sides. Symbolic
    bounds and extents are compared as expressions over positive sizes: `i` over `s0` rows stays
    within [0, s0 - 1] for every `s0`, so a slice or cat that reads all of a symbolic length
    gets no clamp, as it gets none for a static one (a side that cannot be proven keeps it)."""
    variables = tuple(extents)
    symbolic = any(_symbolic(v) for v in (lo, hi, *extents.values()))
    form = symbolic_affine(expr, variables) if symbolic else _affine_form(expr, variables)
    low = high = None
    if form is not None:
        coeffs, const = form
        low = high = const
        for c, n in zip(coeffs, extents.values()):
            span = c * (n - 1)
            if _known_le(0, c):
                high = None if high is None else high + span
            elif _known_le(c, 0):
                low = None if low is None else low + span
            else:  # a coefficient of unknown sign: either side may move
                low = high = None
    out = to_sym(expr)
    if high is None or not _known_le(high, hi):
        out = sympy.Min(out, hi, evaluate=False)
    if low is None or not _known_le(lo, low):
        out = sympy.Max(out, lo, evaluate=False)
    return out


def _known_le(a, b) -> bool:
    """`a <= b` for every size (shape symbols are positive integers); False when unknown."""
    if not (_symbolic(a) or _symbolic(b)):
        return bool(a <= b)
    return sympy.expand(sympy.sympify(b) - sympy.sympify(a)).is_nonnegative is True


def _symbolic(v) -> bool:
    return isinstance(v, sympy.Basic) and not v.is_Number


def symbolic_affine(expr, variables, size_divisions: bool = False) -> tuple[list, object] | None:
    """(coefficients, constant) of `expr` in `variables` where the coefficients and the
    constant may be size expressions (`s1*i0 + i1`, a symbolic stride); None when a variable
    appears other than times a factor free of all of them. Static expressions: as
    `affine_coefficients`. `size_divisions`: a coefficient may also hold `FloorDiv` or
    `ModularIndexing` of sizes (a padded row's stride `s - Mod(s + 1, 8) + 9`), which the
    wrapper computes in Python; kernels' index code keeps them out (the default)."""
    variables = tuple(variables)
    form = _affine_form(expr, variables)
    if form is not None:
        return list(form[0]), form[1]
    coeffs: dict = dict.fromkeys(variables, sympy.Integer(0))
    const = sympy.Integer(0)
    vs = set(variables)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        hit = term.free_symbols & vs
        if not hit:
            if term.has(Indirect):
                return None
            const += term
            continue
        if len(hit) != 1:
            return None
        (v,) = hit
        c = sympy.expand(term / v)
        if c.free_symbols & vs or c.has(Indirect) or not c.is_integer:
            return None
        if not size_divisions and c.has(FloorDiv, ModularIndexing):
            return None
        coeffs[v] += c
    norm = [int(c) if c.is_Integer else c for c in coeffs.values()]
    return norm, int(const) if const.is_Integer else const


def view_form(pos, variables, size) -> tuple[list, object] | None:
    """(coefficients, constant) of a view's storage position `pos` in its index `variables`
    (one per dimension of `size`), or None when the view is not strided. A dimension of extent
    1 reads index 0 only, so its stride means nothing and may be an expression no stride test
    accepts (the padded row length of a `[1, 1, 1, s]` attention bias); symbolic strides may
    hold `FloorDiv`/`ModularIndexing` of sizes, which the wrapper computes. The schedule keeps
    a view by this test and the wrapper prints its strides from the same form."""
    unit = {v: sympy.Integer(0) for v, n in zip(variables, size) if n == 1}
    pos = sympy.sympify(pos).xreplace(unit)
    if pos.free_symbols - set(variables):
        return symbolic_affine(pos, variables, size_divisions=True)
    if not is_affine(pos, variables):
        return None
    coeffs, const = affine_coefficients(pos, variables)
    return list(coeffs), const


def memory_steps(index, strides, variables) -> list[int] | None:
    """How far in memory an access at `index` (of a buffer with `strides`) moves per step of
    each of `variables`; None when its position is not affine in them alone."""
    pos = linearize(index, strides)
    if sympy.sympify(pos).free_symbols - set(variables) or not is_affine(pos, variables):
        return None
    return affine_coefficients(pos, variables)[0]


def linearize(index, strides) -> sympy.Expr:
    """The position `index` reads in a buffer of `strides` (memoized, as `_affine_form`)."""
    return _linearize(tuple(index), tuple(strides))


@functools.lru_cache(maxsize=1 << 16)
def _linearize(index: tuple, strides: tuple) -> sympy.Expr:
    out = sympy.Integer(0)
    for i, s in zip(index, strides):
        out = out + i * s
    return simplify_index(out)


def simplify_index(expr) -> sympy.Expr:
    """Fold `k*(a % m) + k*m*(a // m)` into `k*a`, repeatedly.

    A view of a reshape (`x.view(4, 128, 1024).view(512, 1024).t()`) reads its base at
    `1024*(i1 % 128) + 131072*(i1 // 128) + i0`, which is just `1024*i1 + i0`: folded, the view
    stays a strided alias instead of a copy, and kernels index without divisions.
    """
    if not isinstance(expr, sympy.Expr) or not expr.has(ModularIndexing):
        return expr
    expr = sympy.expand(expr)
    while expr.is_Add:
        coeffs: dict = {}
        for term in expr.args:
            c, rest = _coeff_split(term)
            coeffs[rest] = coeffs.get(rest, 0) + c
        for rest, c in coeffs.items():
            if not isinstance(rest, ModularIndexing):
                continue
            a, m = rest.args
            partner = FloorDiv(a, m)
            if coeffs.get(partner) == c * m:
                expr = sympy.expand(expr - c * rest - c * m * partner + c * a)
                break
        else:
            break
    return expr


def is_size_symbol(s) -> bool:
    """A shape symbol (`s0`, `s17`: a size known per call), not a loop variable."""
    return s.name.startswith("s")


def _only_sizes(e) -> bool:
    return bool(e.free_symbols) and all(map(is_size_symbol, e.free_symbols))


def _coeff_split(term):
    """(coefficient, rest) of a product: its number, or with symbolic sizes its factors that
    are sizes (`s7*s96*(i0 // s96)` -> (s7*s96, i0 // s96)), powers of sizes included
    (`s49**2*(i0 % 4)`: the stride of a square attention matrix)."""
    c, rest = term.as_coeff_Mul()
    if rest.is_Mul and any(_only_sizes(a) for a in rest.args):
        sizes = [a for a in rest.args if _only_sizes(a)]
        others = [a for a in rest.args if a not in sizes]
        if sizes and others:
            return c * sympy.Mul(*sizes), sympy.Mul(*others)
    return c, rest


def delinearize(linear: sympy.Expr, size) -> tuple[sympy.Expr, ...]:
    """Row-major position `linear` in `size` as one index per dim."""
    out, inner = [], 1
    for k in range(len(size) - 1, -1, -1):
        d = FloorDiv(linear, inner)
        out.append(d if k == 0 else ModularIndexing(d, size[k]))
        inner = inner * size[k]
    return tuple(reversed(out))


class ReshapeUnsupported(Exception):
    """A reshape whose dimension groups are not provably equal for every size."""


def reshape_indexer(old: tuple, new: tuple, new_vars) -> tuple[sympy.Expr, ...]:
    """The index into a tensor of size `old` read by index `new_vars` of its reshape to `new`.

    Dims are matched in groups of equal product, so a flatten or a split gives one div/mod per
    dimension of the group, and dims outside any merged group map straight through.
    """
    out: list[sympy.Expr] = []
    i = j = 0
    while i < len(old) or j < len(new):
        if i < len(old) and old[i] == 1 and (j >= len(new) or new[j] != 1):
            out.append(sympy.Integer(0))
            i += 1
            continue
        if j < len(new) and new[j] == 1 and (i >= len(old) or old[i] != 1):
            j += 1
            continue
        i0, j0 = i, j
        po, pn = old[i], new[j]
        i, j = i + 1, j + 1
        while po != pn:
            # Grow the smaller product; with symbolic sizes by their hints, and the group then
            # only counts if the products are equal as expressions (so for every size).
            hp, hn = hint(po), hint(pn)
            if hp == hn or (hp < hn and i >= len(old)) or (hp > hn and j >= len(new)):
                raise ReshapeUnsupported(f"reshape {tuple(old)} -> {tuple(new)}")
            if hp < hn:
                po = po * old[i]
                i += 1
            else:
                pn = pn * new[j]
                j += 1
        linear = linearize(new_vars[j0:j], _strides(new[j0:j]))
        out.extend(delinearize(linear, old[i0:i]))
    return tuple(out)


def _strides(size) -> list:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


# ---------------------------------------------------------------------------------------------
# Printing (IR dumps and C++ share it: the syntax of integer index arithmetic is the same)
# ---------------------------------------------------------------------------------------------


class IndexPrinter:
    """Prints integer index arithmetic. The syntax is shared by IR dumps, C++ and Triton; only
    division, remainder, min/max and parenthesis rules differ, and a renderer overrides just
    those (STYLE.md item 5: language differences in small overrides)."""

    def doprint(self, e) -> str:
        if isinstance(e, int):
            return str(e)
        if e.is_Integer or e.is_Symbol:
            return str(e)
        if e.is_Add:
            terms = sorted(e.args, key=lambda t: (t.is_Number, str(t)))
            out = self.doprint(terms[0])
            for t in terms[1:]:
                coeff, _ = t.as_coeff_Mul()
                if coeff.is_Number and coeff < 0:
                    out += f" - {self.paren(-t)}"
                else:
                    out += f" + {self.doprint(t)}"
            return out
        if e.is_Mul:
            return "*".join(self.paren(a) for a in e.args)
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:  # s0**2: a product of symbolic sizes
            return "*".join([self.paren(e.base)] * int(e.exp))
        if isinstance(e, FloorDiv):
            return self.floordiv(self.paren(e.args[0]), self.paren(e.args[1]))
        if isinstance(e, ModularIndexing):
            return self.mod(self.paren(e.args[0]), self.paren(e.args[1]))
        if isinstance(e, Indirect):
            return self.indirect(e)
        if isinstance(e, (sympy.Min, sympy.Max)):
            out = self.doprint(e.args[0])
            for a in e.args[1:]:
                out = self.minmax(isinstance(e, sympy.Min), out, self.doprint(a))
            return out
        raise NotImplementedError(f"cannot print index expression {e!r}{self.for_whom}")

    for_whom = ""

    # C++ (and IR dumps): indices are non-negative, so `/` truncating is floor division
    def floordiv(self, a: str, b: str) -> str:
        return f"{a}/{b}"

    def mod(self, a: str, b: str) -> str:
        return f"{a}%{b}"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'std::min' if is_min else 'std::max'}<int64_t>({a}, {b})"

    def paren(self, e) -> str:
        s = self.doprint(e)
        return s if plain_operand(e) else f"({s})"

    def indirect(self, e: Indirect) -> str:
        # A renderer binds each indirect index to a variable before printing (C++ does); one
        # that has no such support must not print IR text into its source.
        raise NotImplementedError(f"cannot print indirect index {e}{self.for_whom}")


class _IRPrinter(IndexPrinter):
    def indirect(self, e: Indirect) -> str:
        at = ", ".join(self.doprint(i) for i in e.index)
        return f"indirect({e.buf}[{at}], {e.size}{', wrap' if e.wrap else ''})"


def plain_operand(e) -> bool:
    """Needs no parentheses as an operand: a non-negative integer or a symbol."""
    return isinstance(e, int) or e.is_Integer and e >= 0 or e.is_Symbol or isinstance(e, Indirect)


_CPP = _IRPrinter()


def sympy_str(e) -> str:
    return _CPP.doprint(e)

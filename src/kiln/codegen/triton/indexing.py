"""Index expressions of Triton kernels: binding loop variables to blocks, simplifying, printing.

Takes a loop-IR index expression (sympy, over a member's variables `i0.. / r0..`) and how those
variables come from the kernel's block indices (`xindex`, `rindex`, `yindex`); gives the
simplified storage offset as a sympy expression and its Triton spelling.

The simplification matters for speed: a member of size [8, 33, 64] flattened into `xindex`
would naively read `(x // 2112)*2112 + (x // 64 % 33)*64 + x % 64`; merging the dimensions a
load walks contiguously turns that into `xindex`, and a broadcast read into `xindex % 64`, so
Triton sees contiguous (vectorizable) accesses. Non-affine indices (a reshape of a transposed
view) fall back to sympy substitution with `FloorDiv`/`ModularIndexing`.

Symbolic sizes: sizes and strides may be size expressions (`s0`, `64*s0`); dimensions are
merged the same way where the coefficients match as expressions, and a size the merge cannot
prove to be 1 is kept as a digit (correct at every size, 1 included).

Why it exists: the C++ renderer binds variables one scalar at a time inside loops; a Triton
kernel computes whole blocks of indices, so it needs the index as one expression of the block.
"""

from __future__ import annotations

import math

import sympy

from ...lower.indexing import (
    FloorDiv,
    IndexPrinter,
    ModularIndexing,
    affine_coefficients,
    delinearize,
    is_affine,
    is_size_symbol,
    linearize,
    plain_operand,
    symbolic_affine,
)
from ...lower.symbolic import hint, is_symbolic

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
MASKS = {XINDEX: "xmask", YINDEX: "ymask", RINDEX: "rmask"}

# One group: (loop variables, their sizes, the block index they are the row-major digits of).
Group = tuple[tuple, tuple, sympy.Symbol]


def _merged(coeffs: list[int], sizes: tuple, source: sympy.Symbol) -> sympy.Expr:
    """sum(coeffs[k] * digit_k(source)), merging dims walked contiguously into one digit."""
    sizes = tuple(_as_size(s) for s in sizes)
    out = sympy.Integer(0)
    inner = 1
    k = len(sizes) - 1
    while k >= 0:
        if sizes[k] == 1:
            k -= 1
            continue
        c, gsize, j = coeffs[k], sizes[k], k - 1
        while j >= 0 and (sizes[j] == 1 or coeffs[j] == c * gsize):
            gsize *= sizes[j]
            j -= 1
        if c != 0:
            term = FloorDiv(source, inner)
            if any(s != 1 for s in sizes[: j + 1]):
                term = ModularIndexing(term, gsize)
            out = out + c * term
        inner *= gsize
        k = j
    return out


def bind(expr, groups: list[Group]) -> sympy.Expr:
    """`expr` (over the groups' loop variables) as an expression of the block indices."""
    expr = sympy.sympify(expr)
    allvars = [v for g in groups for v in g[0]]
    if not expr.free_symbols - set(allvars) and is_affine(expr, allvars):
        coeffs, const = affine_coefficients(expr, allvars)
        out = sympy.Integer(const)
        k = 0
        for vars_, sizes, source in groups:
            out = out + _merged(coeffs[k : k + len(vars_)], sizes, source)
            k += len(vars_)
        return out
    symbolic = size_symbols(expr) or any(is_symbolic(n) for g in groups for n in g[1])
    form = _symbolic_form(expr, allvars) if symbolic else None
    if form is not None:  # sizes or strides are size expressions
        coeffs, const = form
        out = const
        k = 0
        for vars_, sizes, source in groups:
            out = out + _merged(coeffs[k : k + len(vars_)], sizes, source)
            k += len(vars_)
        return sympy.expand(out)
    sub = {}
    for vars_, sizes, source in groups:
        if vars_:
            sub.update(zip(vars_, delinearize(source, tuple(sizes))))
    return _substituted(expr, sub)


def _as_size(s):
    return s if is_symbolic(s) else int(s)


def _symbolic_form(expr, allvars) -> tuple[list, object] | None:
    """(coefficients, constant) of `expr` in the loop variables, where they and the sizes are
    size expressions; None when `expr` is not affine so, or uses a symbol that is not a size."""
    if not all(is_size_symbol(s) for s in expr.free_symbols - set(allvars)):
        return None
    return symbolic_affine(expr, allvars)


def size_symbols(e) -> set:
    """The size symbols (`s0`) an expression printed into a kernel uses: its size arguments."""
    if not isinstance(e, sympy.Basic):
        return set()
    return {s for s in e.free_symbols if s not in MASKS and is_size_symbol(s)}


def _substituted(expr: sympy.Expr, sub: dict) -> sympy.Expr:
    """`expand(expr.xreplace(sub))`, with each clamp (`Min`/`Max`, lower.indexing.clamp) built
    again unevaluated, as clamp builds it, and kept whole by the expansion: sympy's evaluation
    of a `Min` compares every pair of its arguments. It had made up a third of rendering a
    six-layer GPT's backward graph (its attention gradients' `cat`: 49-50 ms against 32 ms;
    benchmarks/triton_passes_cpu.py, 2-core CPU machine)."""
    clamps: dict = {}

    def walk(e):
        if e in sub:
            return sub[e]
        if isinstance(e, (sympy.Min, sympy.Max)):
            args = [sympy.expand(walk(a)).xreplace(clamps) for a in e.args]
            hidden = sympy.Dummy(integer=True)
            clamps[hidden] = e.func(*args, evaluate=False)
            return hidden
        if not e.args:
            return e
        args = tuple(walk(a) for a in e.args)
        return e if args == e.args else e.func(*args)

    return sympy.expand(walk(expr)).xreplace(clamps)


def store_index(size: tuple, groups: list[Group]) -> sympy.Expr:
    """Where element `vars` of a contiguous buffer of `size` lives, bound to the blocks."""
    vars_ = [v for g in groups for v in g[0]]
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= _as_size(s)
    return bind(linearize(vars_, list(reversed(strides))), groups)


def mask_for(expr: sympy.Expr, masked: set) -> str | None:
    """The mask a memory access at `expr` needs: only the block indices it uses, only those
    whose blocks overhang their range (`masked`)."""
    used = [MASKS[s] for s in (YINDEX, XINDEX, RINDEX) if s in expr.free_symbols and s in masked]
    return " & ".join(used) if used else None


class _TritonIndexPrinter(IndexPrinter):
    """Python/Triton spelling: floor division and remainder operators, tl.minimum/maximum, and
    no parentheses around an expression that already has them."""

    for_whom = " for Triton"

    def floordiv(self, a: str, b: str) -> str:
        return f"({a} // {b})"

    def mod(self, a: str, b: str) -> str:
        return f"({a} % {b})"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'tl.minimum' if is_min else 'tl.maximum'}({a}, {b})"

    def paren(self, e) -> str:
        s = self.doprint(e)
        enclosed = s.startswith("(") and s.endswith(")") and _balanced(s)
        return s if plain_operand(e) or enclosed else f"({s})"


_TRITON = _TritonIndexPrinter()


def tl_str(e) -> str:
    """Triton (Python) spelling of an integer index expression."""
    return _TRITON.doprint(e)


def _balanced(s: str) -> bool:
    """True if the outer parentheses of `s` enclose all of it."""
    depth = 0
    for k, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(s) - 1:
            return False
    return True


def extent(layout) -> int:
    """Elements a layout's storage spans (offset included): decides 32- vs 64-bit indices
    (at the size hints where sizes are symbolic)."""
    if any(hint(s) == 0 for s in layout.size):
        return 0
    far = sum((hint(s) - 1) * abs(hint(st)) for s, st in zip(layout.size, layout.stride))
    return hint(layout.offset) + far + 1


def symbolic_extent(layout):
    """The elements a layout with symbolic sizes or strides spans from its first element (a
    kernel's pointer), as a size expression (None for a static layout): what a kernel indexing
    it with 32 bits must keep below 2**31."""
    if not any(is_symbolic(v) for v in (*layout.size, *layout.stride)):
        return None
    far = sum((s - 1) * st for s, st in zip(layout.size, layout.stride))
    return sympy.expand(far + 1)


def numel(size):
    """Elements of `size`: an int, or a size expression."""
    if any(is_symbolic(s) for s in size):
        return sympy.Mul(*size)
    return math.prod(int(s) for s in size)

"""Symbolic sizes: torch's SymInts as loop-IR expressions, and the size hints decisions use.

Takes the values an ATen graph traced with symbolic shapes carries (`SymInt` sizes and strides
of fake tensors, `SymInt` placeholders; their `node.expr` is a sympy expression over the shape
environment's symbols `s0, s17, ...`); gives plain ints for static values and sympy expressions
in kiln's own index functions (`FloorDiv`, `ModularIndexing`) for symbolic ones, and `hint(e)`:
the value of `e` at the sizes first seen (the shape environment's hints).

The rule every pass follows: a decision that only costs speed when wrong (tiling, splitting,
parallelizing, memory reuse) may read `hint`; one that correctness depends on compares
expressions (`==` on sympy is structural: equal expressions are equal for every size) or is
refused (`Unsupported`: the op becomes an ATen call) or made a per-call check.

Why it exists: one place converts torch's symbolic values and holds the hints, so lower/,
schedule/ and codegen/ all read sizes the same way.
"""

from __future__ import annotations

import math

import sympy
import torch

from .hints import DEFAULT_HINT, current_hints, hint, is_symbolic, using_hints
from .indexing import FloorDiv, ModularIndexing


class SymbolicUnsupported(Exception):
    """A symbolic value kiln cannot express (an unbacked size, an unknown sympy function)."""


class TrueDiv(sympy.Function):
    """`a / b` as a float (a SymFloat: batch norm's `n / (n - 1)` over a symbolic `n`). Kept
    unevaluated so that sympy never rewrites it into integer arithmetic; kernels compute it in
    float64 from the sizes (`lower.context.size_scalar`), never as an index."""

    nargs = 2
    is_real = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Number and b.is_Number and b != 0:
            return sympy.Float(float(a) / float(b))
        return None


__all__ = [
    "DEFAULT_HINT",
    "SymbolicUnsupported",
    "TrueDiv",
    "current_hints",
    "from_torch",
    "graph_hints",
    "hint",
    "is_symbolic",
    "size_bounds",
    "sizes_of",
    "using_hints",
]


def size_symbols(values) -> set:
    """The shape symbols in an iterable of sizes/expressions."""
    out: set = set()
    for v in values:
        if isinstance(v, sympy.Basic):
            out |= v.free_symbols
    return out


def from_torch(value: object):
    """An int, a SymInt, a SymBool/SymFloat or a sympy expression as kiln's value: an int when
    static, else a sympy expression in kiln's index functions."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        node = value.node
        if node.is_nested_int():  # pragma: no cover - jagged tensors never reach codegen
            raise SymbolicUnsupported("nested (jagged) sizes")
        expr = node.expr
        if isinstance(value, torch.SymInt):
            maybe = getattr(node, "maybe_as_int", lambda: None)()
            if maybe is not None:
                return int(maybe)
        return _convert(expr)
    if isinstance(value, sympy.Basic):
        return _convert(value)
    return value


def _convert(expr: sympy.Basic):
    if expr.is_Integer:
        return int(expr)
    for s in expr.free_symbols:
        if not str(s).startswith("s"):
            raise SymbolicUnsupported(
                f"size {expr} depends on {s}, a value only known when the graph runs (unbacked)"
            )
    return _translate(expr)


def _translate(e: sympy.Basic) -> sympy.Basic:
    """torch's sympy functions as kiln's (its printers know only theirs)."""
    from torch.utils._sympy import functions as tf

    if e.is_Atom:
        return e
    args = [_translate(a) for a in e.args]
    if type(e).__name__ in ("IntTrueDiv", "FloatTrueDiv"):
        return TrueDiv(args[0], args[1])
    if type(e).__name__ == "ToFloat":  # an integer read as a float stays a float
        return TrueDiv(args[0], sympy.Integer(1))
    if isinstance(e, TrueDiv):
        return TrueDiv(*args)
    if isinstance(e, tf.FloorDiv) or type(e).__name__ in ("CleanDiv", "IntTrueDiv_exact"):
        return FloorDiv(args[0], args[1])
    if isinstance(e, (FloorDiv, ModularIndexing)):  # kiln's own (converted before)
        return type(e)(*args)
    if isinstance(e, tf.ModularIndexing):
        base, div, mod = args
        return ModularIndexing(FloorDiv(base, div), mod)
    if type(e).__name__ in ("PythonMod", "Mod"):
        return ModularIndexing(args[0], args[1])
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return type(e)(*args)
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer and int(e.args[1]) > 0:
        return sympy.Mul(*([args[0]] * int(e.args[1])))
    if type(e).__name__ in ("Max", "Min"):
        return (sympy.Max if type(e).__name__ == "Max" else sympy.Min)(*args)
    raise SymbolicUnsupported(f"size expression {e} uses {type(e).__name__}")


def sizes_of(t: torch.Tensor) -> tuple[tuple, tuple, object]:
    """(size, stride, storage offset) of a (fake) tensor as kiln values."""
    size = tuple(from_torch(s) for s in t.shape)
    stride = tuple(from_torch(s) for s in t.stride())
    return size, stride, from_torch(t.storage_offset())


def graph_hints(values) -> dict:
    """{symbol: hint} of the shape environment behind these fake values (the first one that has
    a SymInt size, a SymInt itself, or nothing)."""
    for v in values:
        syms: list = []
        if isinstance(v, torch.Tensor):
            syms = [s for s in list(v.shape) + list(v.stride()) if isinstance(s, torch.SymInt)]
        elif isinstance(v, torch.SymInt):
            syms = [v]
        for s in syms:
            env = s.node.shape_env
            table = getattr(env, "backed_var_to_val", None)
            if table is None:
                table = env.var_to_val
            return {k: int(val) for k, val in table.items() if str(k).startswith("s")}
    return {}


def size_bounds(expr) -> tuple[float, float]:
    """(lowest, highest) value of a size expression for every size (shape symbols are
    nonnegative integers), `-inf`/`inf` where unknown: `8 - ModularIndexing(s0, 8)` is within
    [1, 8]. What sympy's own assumptions cannot tell (they know no upper bound of a remainder);
    a correctness decision (the sign of a padding) may rely on it, as it holds for every size."""
    if not isinstance(expr, sympy.Basic):
        return (expr, expr)
    if expr.is_Number:
        return (float(expr), float(expr))
    if expr.is_Symbol:
        return (0.0, math.inf) if expr.is_nonnegative else (-math.inf, math.inf)
    if isinstance(expr, ModularIndexing):
        hi = size_bounds(expr.args[1])[1]
        return (0.0, hi - 1 if hi < math.inf else math.inf)
    if isinstance(expr, FloorDiv):
        (a_lo, a_hi), (b_lo, _) = (size_bounds(a) for a in expr.args)
        if a_lo >= 0 and b_lo >= 1:
            return (0.0, a_hi / b_lo if a_hi < math.inf else math.inf)
        return (-math.inf, math.inf)
    if isinstance(expr, sympy.Add):
        parts = [size_bounds(a) for a in expr.args]
        return (sum(p[0] for p in parts), sum(p[1] for p in parts))
    if isinstance(expr, sympy.Mul):
        lo, hi = 1.0, 1.0
        for a in expr.args:
            a_lo, a_hi = size_bounds(a)
            products = [x * y for x in (lo, hi) for y in (a_lo, a_hi) if not _zero_inf(x, y)]
            lo, hi = (min(products), max(products)) if products else (-math.inf, math.inf)
        return (lo, hi)
    if isinstance(expr, (sympy.Max, sympy.Min)):
        parts = [size_bounds(a) for a in expr.args]
        pick = max if isinstance(expr, sympy.Max) else min
        return (pick(p[0] for p in parts), pick(p[1] for p in parts))
    return (-math.inf, math.inf)


def _zero_inf(x: float, y: float) -> bool:
    return (x == 0 and math.isinf(y)) or (y == 0 and math.isinf(x))

"""The scalar operations of loop-IR bodies and the helpers that build expressions from them.

Takes value expressions; gives new ones (`op("add", a, b)`, `cast(e, torch.float32)`,
`where(c, a, b)`). `OPS` is the complete list of operation names with their arity: every
renderer must implement each of them, and `codegen/cpp/ops.py` asserts that it does, so a new
lowering cannot use an operation that some backend silently lacks (STYLE.md item 4).

Why it exists: lowerings compose activations, softmax and norms from these few primitives;
keeping the vocabulary small keeps the renderers small.
"""

from __future__ import annotations

import math

import torch

from .ir import Const, Expr, IndexValue, Op, walk

__all__ = ["IndexValue", "OPS", "op", "const", "cast", "where"]

# name -> arity. Comparisons and predicates give bool; everything else the dtype of its args.
OPS: dict[str, int] = {
    # unary math
    **dict.fromkeys(
        "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan "
        "sinh cosh tanh asinh acosh atanh sigmoid erf erfc floor ceil round trunc sign "
        "reciprocal logical_not bitwise_not isnan isinf frac signbit lgamma".split(),
        1,
    ),
    "to": 1,  # conversion to the Op's dtype
    # binary
    **dict.fromkeys(
        "add sub mul truediv floordiv truncdiv remainder fmod pow maximum minimum fmax fmin "
        "atan2 hypot copysign eq ne lt le gt ge logical_and logical_or logical_xor "
        "bitwise_and bitwise_or bitwise_xor lshift rshift".split(),
        2,
    ),
    "where": 3,
}

# Ops that cost tens of cycles a value even vectorized (library calls): worth storing a value
# of instead of computing it again (schedule/realize.py, the C++ renderer's shared values).
COSTLY = frozenset(
    "exp exp2 expm1 log log2 log10 log1p tanh sigmoid erf erfc sin cos tan pow".split()
)


def costly_count(expr: Expr) -> int:
    """How many costly ops `expr` computes (each distinct subexpression once)."""
    return sum(1 for e in walk(expr) if isinstance(e, Op) and e.op in COSTLY)


BOOL_RESULT = frozenset(
    "eq ne lt le gt ge logical_and logical_or logical_xor logical_not isnan isinf signbit".split()
)


def op(name: str, *args: Expr, dtype: torch.dtype | None = None) -> Expr:
    assert name in OPS, f"unknown loop-IR op {name!r}"
    assert len(args) == OPS[name], f"{name} takes {OPS[name]} arguments, got {len(args)}"
    if dtype is None:
        dtype = torch.bool if name in BOOL_RESULT else args[-1].dtype
    return Op(name, tuple(args), dtype)


def const(value: bool | int | float, dtype: torch.dtype) -> Const:
    if dtype == torch.bool:
        return Const(bool(value), dtype)
    if dtype.is_floating_point:
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def cast(e: Expr, dtype: torch.dtype) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Const) and not (
        isinstance(e.value, float) and not math.isfinite(e.value) and not dtype.is_floating_point
    ):
        return const(e.value, dtype)
    return Op("to", (e,), dtype)


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    dtype = a.dtype
    return Op("where", (cast(c, torch.bool), a, cast(b, dtype)), dtype)


def add(a: Expr, b: Expr) -> Expr:
    return op("add", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return op("sub", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    return op("mul", a, b)


def div(a: Expr, b: Expr) -> Expr:
    return op("truediv", a, b)


def scalar(value: bool | int | float, like: Expr) -> Const:
    return const(value, like.dtype)

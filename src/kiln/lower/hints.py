"""Size hints: the sizes first seen, for decisions that only cost speed when wrong.

Takes {symbol: size} for the graph being compiled (`using_hints`, set by lower_graph, schedule
and the pipeline around each pass); gives `hint(e)`, the value of a size expression at those
sizes. See lower/symbolic.py for the rule on where hints may be read.

Why it exists apart from symbolic.py: indexing.py reads hints (reshape grouping) and
symbolic.py reads indexing.py; this leaf module breaks that cycle.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import sympy

# {symbol: the size first seen} for the graph being compiled (set by lower_graph, schedule and
# the pipeline around each pass).
_HINTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "kiln_size_hints", default=None
)
DEFAULT_HINT = 64  # a symbol with no recorded hint (a graph built by hand): a middling size


@contextlib.contextmanager
def using_hints(hints: dict) -> Iterator[None]:
    token = _HINTS.set(hints)
    try:
        yield
    finally:
        _HINTS.reset(token)


def current_hints() -> dict:
    return _HINTS.get() or {}


def is_symbolic(value: object) -> bool:
    return isinstance(value, sympy.Basic) and not value.is_Number


def hint(value: object) -> int:
    """`value` (an int or a size expression) at the sizes first seen."""
    if isinstance(value, int):
        return value
    if isinstance(value, sympy.Basic):
        if value.is_Integer:
            return int(value)
        hints = current_hints()
        sub = {s: hints.get(s, DEFAULT_HINT) for s in value.free_symbols}
        return int(value.xreplace(sub))
    return int(value)  # type: ignore[call-overload]


def hint_at_least(value: object, floor: int) -> int:
    """`value` at the hints with every size symbol taken as at least `floor`: for a speed
    decision that asks whether a size is too short to be worth something (a loop, a tile, a
    kernel of its own). A symbolic size is the one that changes from call to call, and the size
    it was first seen at is one of many: a dynamic entry first built at a short length must not
    give every later, longer one the kernels shaped for short rows (at 15 tokens, the attention
    heads' transposed split fused with the others into one loop with a division per element)."""
    if not is_symbolic(value):
        return hint(value)
    assert isinstance(value, sympy.Basic)
    hints = current_hints()
    sub = {s: max(hints.get(s, DEFAULT_HINT), floor) for s in value.free_symbols}
    return int(value.xreplace(sub))

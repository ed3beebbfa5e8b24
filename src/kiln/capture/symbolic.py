"""Symbolic Python scalars: a number that is also a graph input and guards only what is used.

Takes a Python int or float that came from outside the graph and changes from call to call
(today: the value a graph break hands to its continuation, such as `t.item()`); gives a
`SymInt`/`SymFloat` that behaves as the number (it *is* an int/float subclass holding the real
value) while arithmetic on it is recorded as graph nodes, torch calls take it as an input, and
a comparison guards only its outcome (`v > 0`), not the value. Whenever it escapes to code
kiln does not record (a C function, list indexing, formatting), it is specialized: the exact
value is guarded and a plain number continues.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from . import guards as G


class _Sym:
    """Mixin: `_tracer`, `_node` (FX node of the value) and `_expr` (guard-code template)."""

    _tracer: Any
    _node: Any
    _expr: str
    _fake: Any = None  # the torch.SymInt of the fake world, when sizes are symbolic

    def _plain(self):
        return float.__float__(self) if isinstance(self, float) else int.__int__(self)

    def specialize(self):
        """Guard the exact value and return it as a plain number."""
        v = self._plain()
        self._tracer.guards.add(
            G.Guard(None, "SYM", f"({self._expr}) == {v!r}", {}, f"{self._expr} == {v!r}")
        )
        return v


def make(tracer, value, node, expr: str, fake=None):
    cls = SymFloat if isinstance(value, float) else SymInt
    obj = cls(value)
    obj._tracer, obj._node, obj._expr, obj._fake = tracer, node, expr, fake
    return obj


def _fake_of(v):
    if isinstance(v, _Sym):
        return v._fake
    return v


def plain(value):
    """Specialize a Sym (guarding its value); leave anything else alone."""
    return value.specialize() if isinstance(value, _Sym) else value


def unwrap(value, _seen: set | None = None):
    """`value` with kiln's symbolic numbers replaced by the plain numbers they hold, for a
    value that leaves the trace (a result, a store into an outside object, an argument of a
    call run natively after a break): eager gives `int`/`float`, never a subclass that records
    into a finished graph. No guard is added: the trace is over. Lists, dicts and sets are
    changed in place (they may be the caller's), tuples (torch.Size, namedtuples) rebuilt."""
    if isinstance(value, _Sym):
        return value._plain()
    t = type(value)
    if t in (int, float, bool, str, type(None)):
        return value
    plain_object = not isinstance(value, (list, dict, set, tuple)) and _plain_object(value)
    if not plain_object and not isinstance(value, (list, dict, set, tuple)):
        return value
    seen = set() if _seen is None else _seen
    if id(value) in seen or len(seen) > 10000:
        return value
    seen.add(id(value))
    if plain_object:  # a dataclass or object the program made: its attributes
        for k, v in list(vars(value).items()):
            new = unwrap(v, seen)
            if new is not v:
                object.__setattr__(value, k, new)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            new = unwrap(v, seen)
            if new is not v:
                list.__setitem__(value, i, new)
    elif isinstance(value, dict):
        if any(isinstance(k, _Sym) for k in value):  # keys too, in their order
            items = [(unwrap(k, seen), v) for k, v in value.items()]
            dict.clear(value)
            dict.update(value, items)
        for k, v in list(value.items()):
            new = unwrap(v, seen)
            if new is not v:
                dict.__setitem__(value, k, new)
    elif isinstance(value, set):
        if any(isinstance(v, _Sym) for v in value):
            members = [unwrap(v, seen) for v in value]
            set.clear(value)
            set.update(value, members)
    else:  # a tuple
        items = [unwrap(v, seen) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            if t is tuple or t is torch.Size:
                return t(items)
            if hasattr(value, "_fields"):
                return t(*items)
            try:
                return t(items)
            except Exception:  # noqa: BLE001 - a tuple type with its own constructor
                return tuple(items)
    return value


def _plain_object(value) -> bool:
    """An instance of a Python class holding its state in `__dict__` (not a module, class,
    function, tensor or nn.Module, whose attributes are no program values)."""
    import types

    return (
        type(value).__flags__ & _HEAP_TYPE
        and hasattr(value, "__dict__")
        and not isinstance(
            value,
            (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor),
        )
        and not isinstance(value, torch.nn.Module)
    )


_HEAP_TYPE = 1 << 9


_REFLECTED = {
    operator.add: "__radd__",
    operator.sub: "__rsub__",
    operator.mul: "__rmul__",
    operator.truediv: "__rtruediv__",
    operator.floordiv: "__rfloordiv__",
    operator.mod: "__rmod__",
    operator.pow: "__rpow__",
    operator.iadd: "__radd__",
    operator.isub: "__rsub__",
    operator.imul: "__rmul__",
    operator.itruediv: "__rtruediv__",
    operator.ifloordiv: "__rfloordiv__",
    operator.imod: "__rmod__",
    operator.ipow: "__rpow__",
}
# `a < b` asks `b > a` when b's type is a subclass of a's (Python's rule), else a first
_SWAPPED = {
    operator.lt: "__gt__",
    operator.le: "__ge__",
    operator.gt: "__lt__",
    operator.ge: "__le__",
    operator.eq: "__eq__",
    operator.ne: "__ne__",
}


def apply(op, lhs, rhs):
    """`op(lhs, rhs)` for the interpreter's operators, with a symbolic number on the right
    asked first when Python would not ask it: a plain float (or bool) on the left of a SymInt
    is no base of it, so `1.0 / n` or `0.5 < n` would otherwise be computed by float's own
    method from the int value, unrecorded and unguarded, and the entry would keep that one
    size's result for every size."""
    if isinstance(rhs, _Sym) and not isinstance(lhs, _Sym) and type(lhs) in (float, bool):
        name = _REFLECTED.get(op) or _SWAPPED.get(op)
        if name is not None:
            result = getattr(rhs, name)(lhs)
            if result is not NotImplemented:
                return result
    return op(lhs, rhs)


def pick(op, values: list):
    """`min`/`max` of numbers, some symbolic: the comparisons guard their outcome and the
    chosen value stays what it was (a size stays a graph value), instead of the builtin
    specializing every symbolic argument to its exact value."""
    best = values[0]
    for v in values[1:]:
        if apply(op, v, best):  # max: v > best; min: v < best (the first of equals wins)
            best = v
    return best


def convert(fn, value):
    """`int(n)`, `float(n)`, `operator.index(n)`, `math.ceil(x)`, `math.floor(x)`, `round(x)`
    of a symbolic number, kept symbolic (recorded, guarded by later use) instead of
    specialized: `int(x.shape[1])` and `math.ceil(n / 8) * 8` are everyday library code,
    and each used to pin the size. None when `fn` has no symbolic form for `value`."""
    v = value._plain()
    if fn in (int, operator.index) and isinstance(value, int):
        return value
    if fn is float and isinstance(value, float):
        return value
    if fn is float:  # of a SymInt
        return _unary(value, torch.sym_float, float(v), "float({})")
    if isinstance(value, float) and fn in _ROUNDING:
        target, text = _ROUNDING[fn]
        return _unary(value, target, fn(v), text)
    return None


def _unary(value, target, result, text: str):
    tracer = value._tracer
    node = tracer.graph.call_function(target, (value._node,))
    fake = target(value._fake) if value._fake is not None else None
    return make(tracer, result, node, text.format(value._expr), fake)


# written with builtins only: guard code has no `math` in its namespace
_ROUNDING = {
    math.ceil: (math.ceil, "int(-(-({}) // 1))"),
    math.floor: (math.floor, "int(({}) // 1)"),
    round: (round, "round({})"),
}


def _operand(v):
    if isinstance(v, _Sym):
        return v._node, v._expr, v._plain()
    return v, repr(v), v


def _binary(op, sym_result=True, reflected=False):
    def method(self, other):
        if not isinstance(other, (int, float)):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        an, ae, av = _operand(a)
        bn, be, bv = _operand(b)
        result = op(av, bv)
        if not isinstance(result, (int, float)) or isinstance(result, bool):
            return result
        tracer = self._tracer
        node = tracer.graph.call_function(op, (an, bn))
        fa, fb = _fake_of(a), _fake_of(b)
        fake = op(fa, fb) if fa is not None and fb is not None else None
        return make(tracer, result, node, f"({ae} {_SYMBOL[op]} {be})", fake)

    return method


def _compare(op):
    def method(self, other):
        if not isinstance(other, (int, float)):
            return NotImplemented
        _, ae, av = _operand(self)
        _, be, bv = _operand(other)
        result = op(av, bv)
        self._tracer.guards.add(
            G.Guard(
                None,
                "SYM",
                f"({ae} {_SYMBOL[op]} {be}) == {result!r}",
                {},
                f"{ae} {_SYMBOL[op]} {be} is {result}",
            )
        )
        return result

    return method


_SYMBOL = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
    operator.eq: "==",
    operator.ne: "!=",
}


def _install(cls, base):
    for name, op in (
        ("add", operator.add),
        ("sub", operator.sub),
        ("mul", operator.mul),
        ("truediv", operator.truediv),
        ("floordiv", operator.floordiv),
        ("mod", operator.mod),
        ("pow", operator.pow),
    ):
        setattr(cls, f"__{name}__", _binary(op))
        setattr(cls, f"__r{name}__", _binary(op, reflected=True))
    for name, op in (
        ("lt", operator.lt),
        ("le", operator.le),
        ("gt", operator.gt),
        ("ge", operator.ge),
        ("eq", operator.eq),
        ("ne", operator.ne),
    ):
        setattr(cls, f"__{name}__", _compare(op))
    cls.__hash__ = base.__hash__

    def _neg(self):
        node = self._tracer.graph.call_function(operator.neg, (self._node,))
        fake = -self._fake if self._fake is not None else None
        return make(self._tracer, -self._plain(), node, f"(-{self._expr})", fake)

    def _bool(self):
        result = bool(self._plain())
        self._tracer.guards.add(
            G.Guard(
                None,
                "SYM",
                f"bool({self._expr}) == {result!r}",
                {},
                f"bool({self._expr}) is {result}",
            )
        )
        return result

    def _escape(name):
        def method(self, *args):
            return getattr(self.specialize(), name)(*args)

        return method

    cls.__neg__ = _neg
    cls.__bool__ = _bool
    for name in (
        "__format__",
        "__repr__",
        "__str__",
        "__int__",
        "__float__",
        "__index__",
        "__round__",
        "__abs__",
        "__trunc__",
        "__floor__",
        "__ceil__",
    ):
        if hasattr(base, name):
            setattr(cls, name, _escape(name))


class SymInt(_Sym, int):
    pass


class SymFloat(_Sym, float):
    pass


_install(SymInt, int)
_install(SymFloat, float)

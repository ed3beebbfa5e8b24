"""Sizes of a symbolic graph read at run time, and the shape guards AOT tracing added.

Takes capture's fake examples of a graph's inputs (symbolic world, symbolic.py) and the shape
environment; gives

- `SizeReader`: where each symbol lives in a call's inputs (`args[0].size(1)`, an int input),
  and functions compiled from expressions over the symbols: the guards AOT tracing added
  (`check(args) -> bool`) and values computed per call (a size the graph returns, the geometry
  of an output that is a view);
- `guards_since`: the guards a trace added to the shape environment.

Apart from symbolic.py because it imports sympy, which a graph with static sizes never needs.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.printers import PythonPrinter

from .symbolic import compile_function

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def guards_since(shape_env: ShapeEnv, start: int) -> list[sympy.Basic]:
    """The guards of `shape_env` added after the first `start`, less repeats of earlier ones
    and constants (True)."""
    seen = {g.expr for g in shape_env.guards[:start]}
    out: list[sympy.Basic] = []
    for g in shape_env.guards[start:]:
        expr = shape_env.simplify(g.expr)
        if expr in seen or expr == sympy.true or not expr.free_symbols:
            continue
        seen.add(expr)
        out.append(expr)
    return out


class SizeReader:
    """Where each symbol of a symbolic world's inputs is found in a call's arguments, and
    Python functions over them. `args` are the call's flat inputs, in placeholder order."""

    def __init__(self, examples: list) -> None:
        self.names: dict[sympy.Symbol, sympy.Symbol] = {}
        for i, ev in enumerate(examples):
            if isinstance(ev, torch.Tensor):
                for d, s in enumerate(ev.shape):
                    self._locate(s, f"a[{i}].size({d})")
                for d, s in enumerate(ev.stride()):
                    self._locate(s, f"a[{i}].stride({d})")
                self._locate(ev.storage_offset(), f"a[{i}].storage_offset()")
            else:
                self._locate(ev, f"a[{i}]")
        self._printer = PythonPrinter()

    def _locate(self, value: Any, where: str) -> None:
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if isinstance(expr, sympy.Symbol) and expr not in self.names:
                self.names[expr] = sympy.Symbol(where)

    def can_read(self, expr: sympy.Basic) -> bool:
        return all(s in self.names for s in expr.free_symbols)

    def render(self, expr: Any) -> str:
        if isinstance(expr, _SYM_TYPES):
            expr = expr.node.expr
        return self._printer.doprint(sympy.sympify(expr).xreplace(self.names))

    def compile(self, values: list, name: str) -> Callable[[Any], tuple]:
        """`fn(args) -> tuple` of `values` (SymInts, SymFloats, SymBools or constants) for the
        call `args`, as plain numbers."""
        parts = []
        for v in values:
            conv = "float" if isinstance(v, (float, torch.SymFloat)) else "int"
            if isinstance(v, (bool, torch.SymBool)):
                conv = "bool"
            parts.append(f"{conv}({self.render(v)})")
        body = "".join(f"{p}, " for p in parts)
        return compile_function(f"def {name}(a):\n    return ({body})", name)

    def check(self, exprs: list) -> Callable[[Any], bool]:
        """`fn(args) -> bool`: every guard holds for the call `args`."""
        body = " and ".join(f"({self.render(e)})" for e in exprs) or "True"
        return compile_function(f"def shape_guards(a):\n    return bool({body})", "shape_guards")

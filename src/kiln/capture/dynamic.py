"""Dynamic shapes: sizes that may change between calls, carried as symbols beside real sizes.

Takes the input tensors whose dimensions are dynamic (marked with `kiln.mark_dynamic`, all of
them under `dynamic=True`, or the ones seen to change under the default automatic policy) and
every torch call of the trace; gives fake tensors with symbolic sizes for every tensor of the
trace (placeholder `node.meta["example_value"]`, as torch.compile's graphs carry), symbolic
Python sizes for shape reads (`x.shape[0] // 2` stays an expression over the inputs), and the
guards the shape environment collected, written over the inputs' sources.

Only traces with a dynamic dimension pay for fake-tensor propagation; static traces read sizes
off the real tensors. The policy for sizes 0 and 1 is written down in docs/dynamic_shapes.md:
no size is specialized up front; what the program and PyTorch's kernels rely on is guarded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch._guards import GuardSource
from torch._guards import Source as TorchSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._sympy.printers import PythonPrinter

from ..symbolic_dispatch import run_symbolic
from . import guards as G
from .dense_fakes import owned_dense_fake
from .sources import Namer, Source


@dataclass(frozen=True)
class _NamedSource(TorchSource):
    """The shape environment's name for a scalar input (its guards are rendered by kiln)."""

    label: str

    @property
    def name(self) -> str:
        return self.label

    def guard_source(self):
        return GuardSource.LOCAL


class DynamicShapes:
    def __init__(self) -> None:
        self.shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        self.fakes: dict[int, torch.Tensor] = {}
        self.names: dict[sympy.Symbol, sympy.Symbol] = {}  # s0 -> x.size(0)
        self._printer = PythonPrinter()

    # ---- inputs ------------------------------------------------------------------------------
    def fake_input(self, t: torch.Tensor, source: Source, dims: set[int]) -> torch.Tensor:
        expr = source.expr(Namer())
        with torch._C.DisableTorchFunction():  # not a call of the user's program
            fake = owned_dense_fake(
                t, dims, self.shape_env, self.fake_mode, lambda d: _NamedSource(f"{expr}.size({d})")
            )
            if fake is None:  # a view, or an input that shares or overhangs its storage
                sizes = [
                    DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())
                ]
                ctx = StatelessSymbolicContext(
                    dynamic_sizes=sizes, constraint_sizes=[None] * t.dim()
                )
                fake = self.fake_mode.from_tensor(t, symbolic_context=ctx)
        for d in dims:
            sym = fake.size(d).node.expr
            if isinstance(sym, sympy.Symbol):
                self.names[sym] = sympy.Symbol(f"{expr}.size({d})")
        # The fake's storage offset (and a stride not written in its sizes) can be symbols of
        # their own; a shape fact over one (an aligned-access check of a CUDA kernel's fake,
        # `16*s0 + 8*s1 <= 3200`) must read it from the input too, or its guard would raise
        # NameError and miss on every call.
        reads = [(fake.storage_offset(), f"{expr}.storage_offset()")]
        reads += [(st, f"{expr}.stride({d})") for d, st in enumerate(fake.stride())]
        for value, text in reads:
            if isinstance(value, torch.SymInt):
                sym = value.node.expr
                if isinstance(sym, sympy.Symbol) and sym not in self.names:
                    self.names[sym] = sympy.Symbol(text)
        self.fakes[id(t)] = fake
        return fake

    def scalar_input(self, value: int, source: Source) -> torch.SymInt:
        """A symbolic int input (a size handed across a graph break): a symbol of the shape
        environment, so what the sizes it meets need of it is a relation (`s1 == s0`), not
        its value."""
        expr = source.expr(Namer())
        sym = self.shape_env.create_symbol(
            value, _NamedSource(expr), dynamic_dim=DimDynamic.DYNAMIC, positive=None
        )
        if isinstance(sym, sympy.Symbol):
            self.names[sym] = sympy.Symbol(expr)
        return self.shape_env.create_symintnode(sym, hint=value)

    def fake_of(self, t: torch.Tensor) -> torch.Tensor:
        fake = self.fakes.get(id(t))
        if fake is None:
            with torch._C.DisableTorchFunction():
                fake = self.fakes[id(t)] = self.fake_mode.from_tensor(t, static_shapes=True)
        return fake

    # ---- calls -------------------------------------------------------------------------------
    def propagate(self, func, args, kwargs, out) -> None:
        """Run `func` on fake tensors so the outputs' sizes are known as expressions."""
        from .symbolic import _Sym

        def to_fake(v):
            if isinstance(v, slice):
                return slice(to_fake(v.start), to_fake(v.stop), to_fake(v.step))
            if isinstance(v, torch.Tensor):
                return self.fake_of(v)
            if isinstance(v, _Sym):
                return v._fake if getattr(v, "_fake", None) is not None else v._plain()
            if type(v) is torch.Size and any(isinstance(e, _Sym) for e in v):
                return tuple(to_fake(e) for e in v)
            return v

        fargs, fkwargs = tree_map(to_fake, (args, kwargs))
        # symbolic sizes: first under the Python dispatcher (kiln/symbolic_dispatch.py says why)
        with torch._C.DisableTorchFunction(), self.fake_mode:
            fout = run_symbolic(True, lambda: func(*fargs, **fkwargs))
        real_flat, _ = tree_flatten(out)
        fake_flat, _ = tree_flatten(fout)
        for r, f in zip(real_flat, fake_flat):
            if isinstance(r, torch.Tensor) and isinstance(f, torch.Tensor):
                self.fakes[id(r)] = f

    # ---- sizes and guards --------------------------------------------------------------------
    def render(self, expr: Any) -> str:
        return self._printer.doprint(sympy.sympify(expr).xreplace(self.names))

    def symbolic(self, value: Any) -> tuple[bool, str]:
        """(is it symbolic, guard-code expression) of a torch.SymInt from the fake world."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if not expr.free_symbols:
                return False, str(int(expr))
            return True, self.render(expr)
        return False, repr(value)

    def guards(self) -> list[G.Guard]:
        """The shape environment's facts as guards. A fact the printer writes with `math.` or
        `torch.` (a float size `torch.sym_float(n)`, `math.ceil`, from arange with a float
        step, a mean's count) holds those modules as guard constants: the entry's namespace
        has neither name, and a guard that raises NameError misses on every call."""
        out = []
        for fact in simplified_facts([g.expr for g in self.shape_env.guards]):
            text = self.render(fact)
            check = _MODULE_REF.sub(r"{\1}.", text.replace("{", "{{").replace("}", "}}"))
            held = {m: _MODULES[m] for m in set(_MODULE_REF.findall(text))}
            out.append(G.Guard(None, "SHAPE", f"({check})", held, f"shape fact {text}"))
        return out


_MODULES = {"math": math, "torch": torch}
_MODULE_REF = re.compile(r"\b(math|torch)\.")


def simplified_facts(facts: list) -> list:
    """The shape environment's facts, fewer and cheaper to check, holding exactly when they do.

    Sizes found equal (`x.size(1) == w.size(0)`, one fact per broadcast of a program that
    multiplies by nine weights) form classes; each class is checked once as equalities with
    its first member, and every other fact is written over those first members, so that the
    facts it repeats (`w.size(0) != 1` after `x.size(1) != 1`) fall away as duplicates. A
    `!= k` implied by a bound on the same size (`>= 2` implies `!= 1`) is dropped too. Why:
    the entry checks these on every call, and a dynamic entry's per-call cost must stay near
    a static one's (benchmarks/dynamic_overhead.py)."""
    parent: dict = {}

    def find(s):
        while parent.get(s, s) != s:
            s = parent[s]
        return s

    order: list = []  # symbols in the order first met: the first of a class represents it
    rest = []
    for f in facts:
        if isinstance(f, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in f.args):
            a, b = (find(x) for x in f.args)
            for x in f.args:
                if x not in order:
                    order.append(x)
            if a != b:
                first, second = sorted((a, b), key=order.index)
                parent[second] = first
        else:
            rest.append(f)
    rep = {s: find(s) for s in order if find(s) != s}
    out = [sympy.Eq(r, s) for s, r in sorted(rep.items(), key=lambda kv: order.index(kv[0]))]
    seen = set(out)
    for f in rest:
        g = f.xreplace(rep) if rep else f
        if g is sympy.true or g in seen:
            continue
        seen.add(g)
        out.append(g)
    return [f for f in out if not _implied_ne(f, seen)]


def _implied_ne(fact, facts: set) -> bool:
    """`s != k` where another fact bounds `s` above `k` (`s >= k + 1`, `s > k`)."""
    if not isinstance(fact, sympy.Ne):
        return False
    s, k = fact.args
    if not (isinstance(s, sympy.Symbol) and isinstance(k, sympy.Integer)):
        return False
    for f in facts:
        if isinstance(f, (sympy.GreaterThan, sympy.StrictGreaterThan)) and f.lhs == s:
            low = f.rhs
        elif isinstance(f, (sympy.LessThan, sympy.StrictLessThan)) and f.rhs == s:
            low = f.lhs
        else:
            continue
        strict = isinstance(f, (sympy.StrictGreaterThan, sympy.StrictLessThan))
        if isinstance(low, sympy.Integer) and (low >= k if strict else low > k):
            return True
    return False

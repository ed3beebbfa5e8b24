"""Loop IR: the small immutable nodes that lower/ produces and schedule/ and codegen/ consume.

Takes nothing; gives two families of frozen dataclasses that print as readable code:

* value expressions (`Load`, `Const`, `IndexValue`, `Op`) — the body of a loop, evaluated
  once per index point. Index expressions inside them are sympy expressions over the loop
  variables `i0, i1, ...` (output dims) and `r0, r1, ...` (reduced dims), and may contain
  `Indirect` terms, indices read from memory (`x[indirect(idx[i0], 50)]`);
* buffer nodes (`Input`, `Constant`, `Pointwise`, `Reduction`, `View`, `Extern`, `ExternItem`),
  each naming one buffer, and `LoopGraph`, the ordered list of them for one ATen graph.

Why it exists: a graph of these is what the scheduler fuses and the renderers print. Nodes
carry no closures (STYLE.md item 2), so `str(graph)` is the whole program.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import sympy
import torch

from .indexing import Indirect, index_vars, indirect_terms, reduce_vars, sympy_str

IntExpr = Union[int, sympy.Expr]  # a size or an index: a number or an expression over loop vars
SizeT = tuple[IntExpr, ...]

_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
}


def dtype_str(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision types are stored as such but computed in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _Hashed:
    """Frozen dataclasses used as dictionary keys many times: hash once, not once per lookup."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # set by @dataclass on each subclass

    def __hash__(self) -> int:
        h = self.__dict__.get("_h")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_h", h)
        return h


# ---------------------------------------------------------------------------------------------
# Value expressions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=True)
class Load(_Hashed):
    """Read buffer `buf` at the logical (multi-dimensional) index `index`."""

    buf: str
    index: tuple[sympy.Expr, ...]
    dtype: torch.dtype  # the compute dtype of the loaded value

    __hash__ = _Hashed.__hash__

    def __str__(self) -> str:
        return f"{self.buf}[{', '.join(sympy_str(e) for e in self.index)}]"


@dataclass(frozen=True, eq=False)
class Const:
    """A constant. Equal to another when dtype, type and bits agree: renderers share equal
    values, and -0.0 must not become 0.0 (1 / x tells them apart), nor 1 become True."""

    value: Any  # bool, int or float (inf and nan allowed)
    dtype: torch.dtype

    def _key(self) -> tuple:
        v = self.value
        return (self.dtype, type(v), struct.pack("<d", v) if isinstance(v, float) else v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"{self.value!r}:{dtype_str(self.dtype)}"


@dataclass(frozen=True, eq=True)
class IndexValue(_Hashed):
    """The value of an index expression (arange, iota, masks built from positions)."""

    expr: sympy.Expr
    dtype: torch.dtype

    __hash__ = _Hashed.__hash__

    def __str__(self) -> str:
        return f"index({sympy_str(self.expr)}):{dtype_str(self.dtype)}"


@dataclass(frozen=True, eq=True)
class Op(_Hashed):
    """Apply a scalar operation named in `lower.ops.OPS` (the renderers implement each one)."""

    op: str
    args: tuple[Expr, ...]
    dtype: torch.dtype

    __hash__ = _Hashed.__hash__

    def __str__(self) -> str:
        if self.op == "to":
            return f"to_{dtype_str(self.dtype)}({self.args[0]})"
        return f"{self.op}({', '.join(str(a) for a in self.args)})"


Expr = Union[Load, Const, IndexValue, Op]


def reindex(expr: Expr, sub: dict) -> Expr:
    """`expr` with its loop variables replaced by the expressions in `sub`."""
    key = tuple(sub.items())
    return map_indices(expr, lambda ix: _xreplace(ix, key))


@functools.lru_cache(maxsize=1 << 16)  # every layer of a deep model substitutes the same
def _xreplace(ix: sympy.Expr, sub: tuple) -> sympy.Expr:
    return ix.xreplace(dict(sub))


def map_indices(expr: Expr, fn: Callable[[sympy.Expr], sympy.Expr]) -> Expr:
    """`expr` with `fn` applied to every index expression (of loads and index values); shared
    sub-expressions are rebuilt once."""
    cache: dict[int, Expr] = {}

    def go(e: Expr) -> Expr:
        hit = cache.get(id(e))
        if hit is not None:
            return hit
        r: Expr
        if isinstance(e, Load):
            r = Load(e.buf, tuple(fn(ix) for ix in e.index), e.dtype)
        elif isinstance(e, IndexValue):
            r = IndexValue(fn(e.expr), e.dtype)
        elif isinstance(e, Op):
            r = Op(e.op, tuple(go(a) for a in e.args), e.dtype)
        else:
            r = e
        cache[id(e)] = r
        return r

    return go(expr)


def walk(expr: Expr, stop: Container[Expr] = ()) -> Iterator[Expr]:
    """Every sub-expression of `expr` (each distinct one once), children first; the parts of
    one found in `stop` (a renderer's values already computed) are not walked into."""
    seen: set[int] = set()
    stack = [(expr, False)]
    while stack:
        e, done = stack.pop()
        if id(e) in seen:
            continue
        if done or not isinstance(e, Op) or e in stop:
            seen.add(id(e))
            yield e
            continue
        stack.append((e, True))
        stack.extend((a, False) for a in reversed(e.args))


def loads(expr: Expr) -> list[Load]:
    """Every buffer read of `expr`: its `Load`s, and the reads of its indirect indices (as
    int64 `Load`s at the index they read), so dependencies and lifetimes see both."""
    out = []
    for e in walk(expr):
        if isinstance(e, Load):
            out.append(e)
        if isinstance(e, (Load, IndexValue)):
            out.extend(Load(a.buf, a.index, torch.int64) for a in index_reads(e))
    return out


def index_reads(e: Expr) -> list[Indirect]:
    """The `Indirect` terms of a `Load`'s index or an `IndexValue`, inner ones first."""
    exprs = e.index if isinstance(e, Load) else (e.expr,) if isinstance(e, IndexValue) else ()
    out: dict[Indirect, None] = {}
    for ix in exprs:
        out.update(dict.fromkeys(indirect_terms(ix)))
    return list(out)


def op_count(expr: Expr) -> int:
    return sum(1 for e in walk(expr) if isinstance(e, Op))


# ---------------------------------------------------------------------------------------------
# Buffer nodes
# ---------------------------------------------------------------------------------------------


def _size(size: SizeT) -> str:
    return "[" + ", ".join(sympy_str(s) for s in size) + "]"


def contiguous_strides(size: SizeT) -> SizeT:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def numel(size: SizeT) -> int | sympy.Expr:
    out = 1
    for s in size:
        out = out * s
    return out


@dataclass(frozen=True)
class Layout:
    size: SizeT
    stride: SizeT
    dtype: torch.dtype
    offset: IntExpr = 0

    def __str__(self) -> str:
        out = f"{dtype_str(self.dtype)}{_size(self.size)}"
        if tuple(self.stride) != contiguous_strides(self.size):
            out += f" stride={_size(self.stride)}"
        return out + (f" offset={self.offset}" if self.offset else "")


@dataclass(frozen=True)
class Input:
    name: str
    layout: Layout

    def __str__(self) -> str:
        return f"{self.name}: {self.layout} = input()"


@dataclass(frozen=True)
class Constant:
    """A tensor attribute of the graph module; the tensor itself lives in `LoopGraph.constants`."""

    name: str
    layout: Layout

    def __str__(self) -> str:
        return f"{self.name}: {self.layout} = constant()"


@dataclass(frozen=True)
class Pointwise:
    """`name[i0, i1, ...] = body` for every index of `size`; stored contiguous when realized."""

    name: str
    size: SizeT
    dtype: torch.dtype
    body: Expr

    @property
    def layout(self) -> Layout:
        return Layout(self.size, contiguous_strides(self.size), self.dtype)

    def __str__(self) -> str:
        vs = ", ".join(str(v) for v in index_vars(len(self.size)))
        return f"{self.name}: {self.layout} = pointwise[{vs}] {self.body}"


REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclass(frozen=True)
class Reduction:
    """`name[i...] = reduce_type over r... in reduce_size of body(i..., r...)`.

    argmax/argmin give the position of the first extreme value, counted in the row-major order
    of `reduce_size` (what ATen returns for a single reduced dimension).
    """

    name: str
    size: SizeT
    dtype: torch.dtype
    reduce_type: str
    reduce_size: SizeT
    body: Expr

    @property
    def layout(self) -> Layout:
        return Layout(self.size, contiguous_strides(self.size), self.dtype)

    def __str__(self) -> str:
        vs = ", ".join(str(v) for v in index_vars(len(self.size)))
        rs = ", ".join(str(v) for v in reduce_vars(len(self.reduce_size)))
        return (
            f"{self.name}: {self.layout} = {self.reduce_type}[{vs}] over [{rs}] in "
            f"{_size(self.reduce_size)} {self.body}"
        )


@dataclass(frozen=True)
class View:
    """A view of `base`: element `i` of this view is element `index(i)` of `base` (no copy)."""

    name: str
    base: str
    size: SizeT
    dtype: torch.dtype
    index: tuple[sympy.Expr, ...]

    def __str__(self) -> str:
        vs = ", ".join(str(v) for v in index_vars(len(self.size)))
        idx = ", ".join(sympy_str(e) for e in self.index)
        lay = f"{dtype_str(self.dtype)}{_size(self.size)}"
        return f"{self.name}: {lay} = view[{vs}] {self.base}[{idx}]"


@dataclass(frozen=True)
class BufRef:
    """A buffer passed to an extern call (an argument template holds these, not tensors)."""

    name: str

    def __str__(self) -> str:
        return self.name


def buf_refs(value: object) -> Iterator[BufRef]:
    """The `BufRef`s in an extern call's argument template (nested lists and tuples)."""
    if isinstance(value, BufRef):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from buf_refs(v)


@dataclass(frozen=True)
class Extern:
    """An ATen call kept as is: `target(*args, **kwargs)`. `layouts` has one entry per tensor
    output; `multi` says the op returns a tuple (taken apart by `ExternItem`)."""

    name: str
    target: Any  # a torch OpOverload (hashable, prints as aten.mm.default)
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]
    layouts: tuple[Layout | None, ...]
    multi: bool
    reason: str = field(default="", compare=False)

    @property
    def layout(self) -> Layout:
        assert not self.multi and self.layouts[0] is not None
        return self.layouts[0]

    def __str__(self) -> str:
        parts = [_arg_str(a) for a in self.args]
        parts += [f"{k}={_arg_str(v)}" for k, v in self.kwargs]
        out = "(" + ", ".join(str(lay) for lay in self.layouts) + ")" if self.multi else ""
        lay = out or str(self.layouts[0])
        return f"{self.name}: {lay} = extern {self.target}({', '.join(parts)})"


def _arg_str(a: object) -> str:
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_str(x) for x in a)
        return f"[{inner}]"
    return str(a)


@dataclass(frozen=True)
class ExternItem:
    """Output `index` of a tuple-returning extern call."""

    name: str
    base: str
    index: int
    layout: Layout

    def __str__(self) -> str:
        return f"{self.name}: {self.layout} = {self.base}[{self.index}]"


Node = Union[Input, Constant, Pointwise, Reduction, View, Extern, ExternItem]
REALIZED = (Input, Constant, Extern, ExternItem)  # nodes whose storage exists before any kernel


@dataclass(frozen=True)
class LoopGraph:
    """One ATen graph in loop IR. `outputs` holds buffer names or Python values (None, ints)."""

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[Any, ...]
    constants: dict = field(default_factory=dict, compare=False, repr=False)
    # Symbolic sizes (lower/symbolic.py): the integer inputs, {name: the size expression each
    # is}, and every argument's name in calling order (tensor inputs and integer ones); empty
    # when there are no integer inputs. `hints`: {symbol: the size first seen}.
    scalars: dict = field(default_factory=dict, compare=False, repr=False)
    signature: tuple[str, ...] = ()
    hints: dict = field(default_factory=dict, compare=False, repr=False)

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def replace(self, nodes: Iterable[Node]) -> LoopGraph:
        return LoopGraph(
            tuple(nodes),
            self.inputs,
            self.outputs,
            self.constants,
            self.scalars,
            self.signature,
            self.hints,
        )

    @property
    def args(self) -> tuple[str, ...]:
        """Every argument's name, in calling order (tensor and integer inputs)."""
        return self.signature or self.inputs

    @property
    def symbolic(self) -> bool:
        """Does any size of this graph depend on a size only known per call?"""
        return bool(self.hints) or bool(self.scalars)

    def __str__(self) -> str:
        lines = [f"{n} = int input  # {sympy_str(e)}" for n, e in self.scalars.items()]
        lines += [str(n) for n in self.nodes]
        lines.append(f"return ({', '.join(str(o) for o in self.outputs)})")
        return "\n".join(lines)


def node_size(node: Node) -> SizeT:
    if isinstance(node, (Pointwise, Reduction, View)):
        return node.size
    return node.layout.size


def node_dtype(node: Node) -> torch.dtype:
    if isinstance(node, (Pointwise, Reduction, View)):
        return node.dtype
    return node.layout.dtype

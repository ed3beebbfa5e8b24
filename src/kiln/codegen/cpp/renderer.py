"""The C++ renderer: scheduled kernels -> one C++ translation unit with OpenMP loops.

Takes a `Schedule`; gives `CppModule`: the source text of every kernel of the graph (one file,
one compiler run) and, per kernel, the buffers its pointer arguments stand for, in order.

Shape of a kernel (see schedule/fusion.py for the model): an OpenMP-parallel loop over rows;
inside, one block per member — a reduction loop into a scalar accumulator, a `#pragma omp simd`
loop over the row's elements for consecutive elementwise members, or one scalar for a per-row
member. Values a later member reads from an earlier one in the same row stay in registers;
only what leaves the kernel is stored. Half types are stored as such and computed in float.
A costly value a reduction's loop computes and a later elementwise member recomputes element
for element (softmax's `exp(x - max)`) is kept in that member's output row instead
(`_shared_values`). Buffers are indexed from their `data_ptr()`, which already includes any
storage offset. An index read from memory (`Indirect`) is loaded into an int64 variable,
clamped into its dimension, before the load that uses it.

Symbolic sizes: a kernel whose loops or indices use size symbols takes them as `int64_t`
arguments after its buffers (`CppKernel.sizes`); its loops have runtime bounds (the `omp simd`
loops vectorize with a scalar tail for any length), and whether threads start is an OpenMP
`if` clause on the call's sizes. Static kernels are rendered exactly as before.

Why it exists: the renderer half of the cpu device (STYLE.md item 5); it knows C++ syntax and
nothing about building or running.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy
import torch

from ...lower.hints import hint_at_least
from ...lower.indexing import (
    delinearize,
    index_vars,
    indirect_terms,
    linearize,
    reduce_vars,
    sympy_str,
)
from ...lower.ir import (
    Const,
    IndexValue,
    Load,
    Op,
    Pointwise,
    Reduction,
    loads,
    map_indices,
    reindex,
    walk,
)
from ...lower.ops import costly_count
from ...lower.symbolic import is_symbolic
from ...schedule import Kernel
from .ops import (
    CTYPES,
    HALF_TYPES,
    OP_TEMPLATES,
    REDUCTION_COMBINE,
    REDUCTION_INIT,
    compute_ctype,
)
from .ops import render_const as _const

PARALLEL_MIN_ELEMENTS = 32768  # below this, starting threads costs more than it saves
_X, _R = sympy.Symbol("x", integer=True), sympy.Symbol("r", integer=True)
_RO = sympy.Symbol("ro", integer=True)  # the row's position outside its last dimension


@dataclass(frozen=True)
class CppKernel:
    name: str
    params: tuple[str, ...]  # buffer names, in argument order
    source: str
    sizes: tuple[str, ...] = ()  # size symbols passed after the buffers (symbolic sizes)


@dataclass(frozen=True)
class CppModule:
    kernels: tuple[CppKernel, ...]
    source: str


class _Body:
    """Emits the statements computing one member's body, common subexpressions once."""

    def __init__(
        self, kernel_ctx: _KernelContext, lines: list[str], indent: str, row_sub=None
    ) -> None:
        """`row_sub`: {index variable: its value in the row position `x`} for the variables
        that stay fixed along a row; an index read from memory at those alone is loaded once
        per row (`_row_indirect`)."""
        self.k, self.lines, self.indent = kernel_ctx, lines, indent
        self.row_sub = row_sub
        self.names: dict = {}
        self.indirect: dict = {}  # Indirect term -> the C variable (a sympy Symbol) holding it

    def direct(self, ix):
        """`ix` with each `Indirect` term replaced by a variable holding the index it reads,
        clamped into range (so a bad index reads a valid element; the graph's check raises)."""
        terms = indirect_terms(ix)
        if not terms:
            return ix
        sub = {}
        for a in terms:  # inner terms first: an outer one's index may use them
            if a not in self.indirect and (row := self._row_indirect(a)) is not None:
                self.indirect[a] = row
            if a not in self.indirect:
                at = tuple(i.xreplace(sub) for i in a.index)
                value = self.k.load(Load(a.buf, at, torch.int64))
                fn = "kiln::indirect_wrap" if a.wrap else "kiln::indirect"
                var = f"t{self.k.next_id()}"
                self.lines.append(
                    f"{self.indent}const int64_t {var} = "
                    f"{fn}(static_cast<int64_t>({value}), {sympy_str(a.size)});"
                )
                self.indirect[a] = sympy.Symbol(var, integer=True, nonnegative=True)
            sub[a] = self.indirect[a]
        return ix.xreplace(sub)

    def _row_indirect(self, a):
        """The variable holding index `a`, defined once per row at the top of the row loop,
        when `a` is read at a position fixed along the row (an embedding's token id); else
        None. Loaded inside the vectorized loop, GCC turned the row's contiguous loads at
        that index into per-lane gathers (BERT's embedding + layer norm kernel)."""
        if self.row_sub is None or a.buf in self.k.in_kernel or a.buf in self.k.aliased:
            return None
        if any(indirect_terms(i) for i in a.index):
            return None
        free = set().union(*(sympy.sympify(i).free_symbols for i in a.index))
        if any(not _SIZE_NAME.fullmatch(v.name) for v in free - set(self.row_sub)):
            return None  # moves along the row
        at = tuple(sympy.sympify(i).xreplace(self.row_sub) for i in a.index)
        value = self.k.load(Load(a.buf, at, torch.int64))
        fn = "kiln::indirect_wrap" if a.wrap else "kiln::indirect"
        hoist, indent = self.k.row_hoist
        var = hoist.name(f"{fn}(static_cast<int64_t>({value}), {sympy_str(a.size)})", indent)
        return sympy.Symbol(var, integer=True, nonnegative=True)

    def emit(self, expr) -> str:
        fused = _one_plus_erf(expr, self.names)
        for e in walk(expr, stop=self.names):
            if e in self.names or e in fused:
                continue
            if isinstance(e, Const):
                self.names[e] = _const(e.value, e.dtype)
                continue
            if e in fused.values():  # `1 + erf(y)`, its erf never computed on its own
                (y,) = next(f for f, add in fused.items() if add == e).args
                text = f"kiln::one_plus_erf({self.names[y]})"
            elif isinstance(e, Load):
                text = self.k.load(Load(e.buf, tuple(self.direct(i) for i in e.index), e.dtype))
            elif isinstance(e, IndexValue):
                text = f"static_cast<{compute_ctype(e.dtype)}>({sympy_str(self.direct(e.expr))})"
            else:
                assert isinstance(e, Op)
                args = [self.names[a] for a in e.args]
                if e.op == "to" and e.dtype in HALF_TYPES:  # round to the half type, stay float
                    text = f"kiln::load(kiln::Store<{CTYPES[e.dtype]}>::of({args[0]}))"
                else:
                    text = OP_TEMPLATES[e.op].format(*args, T=compute_ctype(e.dtype))
            var = f"t{self.k.next_id()}"
            self.lines.append(f"{self.indent}const {compute_ctype(e.dtype)} {var} = {text};")
            self.names[e] = var
        return self.names[expr]


def _is_float_erf(e) -> bool:
    return isinstance(e, Op) and e.op == "erf" and e.dtype == torch.float32


def _one_plus_erf(expr, done) -> dict:
    """{erf op: the `1 + erf` op that is its only use in `expr`} for float erfs not yet
    computed (`done`): those render as one `kiln::one_plus_erf` (ops.py's prelude), the form of
    ATen's vectorized GELU, which `omp simd` loops compute faster than libmvec's erf."""
    users: dict = {}
    for e in walk(expr, stop=done):
        if isinstance(e, Op) and e not in done:
            for a in set(e.args):
                if _is_float_erf(a) and a not in done:
                    users.setdefault(a, []).append(e)
    if expr in users:  # the erf itself is a value the member stores
        users.pop(expr)

    def is_one(c) -> bool:
        return isinstance(c, Const) and c.value == 1 and c.dtype == torch.float32

    return {
        erf: add
        for erf, (add, *more) in users.items()
        if not more and add.op == "add" and any(is_one(c) for c in add.args)
    }


class _KernelContext:
    def __init__(self, kernel: Kernel, nodes: dict) -> None:
        self.kernel, self.nodes = kernel, nodes
        self.in_kernel = {m.name for m in kernel.members}
        self.values: dict[str, str] = {}  # member name -> C variable holding this row's value
        self.shared = _shared_values(kernel, nodes)
        self.preset: dict[str, dict] = {}  # member -> {expr: C text} computed by an earlier loop
        self.params: dict[str, bool] = {}  # buffer -> written by this kernel
        self.aliased: frozenset = frozenset()  # buffers sharing memory with another
        # row indices over runtime sizes, defined at the top of the row loop's body
        self.row_hoist = (_Hoisted("xi"), "    ")
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def param(self, name: str, written: bool = False) -> str:
        self.params[name] = self.params.get(name, False) or written
        return name

    def load(self, ld: Load) -> str:
        if ld.buf in self.values:
            return self.values[ld.buf]
        node = self.nodes[ld.buf]
        lay = node.layout
        # No `lay.offset` here: the wrapper passes `data_ptr()`, which already points at the
        # tensor's first element (a split or a slice returned by an extern call has an offset).
        index = sympy.expand(linearize(ld.index, lay.stride))
        return f"kiln::load({self.param(ld.buf)}[{sympy_str(index)}])"


class _Hoisted:
    """Index definitions that depend on an outer loop's variable and on runtime sizes
    (`x/(4*s0)`), computed once per outer iteration instead of inside the vectorized loop:
    GCC does not vectorize an `omp simd` loop holding a 64-bit division by a runtime value
    (a symbolic softmax ran unvectorized, 1.7x its static kernel's time), though the value is
    loop-invariant. Static sizes divide by constants, which GCC vectorizes: left in place."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: dict[str, str] = {}  # C expression -> the variable holding it
        self.lines: list[str] = []

    def name(self, text: str, indent: str) -> str:
        if text not in self.names:
            self.names[text] = f"{self.prefix}{len(self.names)}"
            self.lines.append(f"{indent}const int64_t {self.names[text]} = {text};")
        return self.names[text]


def _bind(lines: list[str], indent: str, vars_, sizes, source, hoist: tuple | None = None) -> None:
    """Defines index variables `vars_` from the flat position `source` over `sizes`; with
    `hoist` = (_Hoisted, its indent), a definition using a runtime size is made there."""
    for v, e in zip(vars_, delinearize(source, tuple(sizes))):
        text = sympy_str(e)
        if hoist is not None and e.free_symbols - {source}:
            text = hoist[0].name(text, hoist[1])
        lines.append(f"{indent}const int64_t {v} = {text};")


def _row_sub(vars_, sizes) -> dict:
    """{row index variable: its value in the row position `x`}, as `_bind` defines them."""
    return dict(zip(vars_, delinearize(_X, tuple(sizes))))


def _store(k: _KernelContext, node, index_expr, value: str, indent: str, lines) -> None:
    if node.name in k.kernel.local:
        return
    ctype = CTYPES[node.dtype]
    lines.append(
        f"{indent}{k.param(node.name, True)}[{sympy_str(index_expr)}] = "
        f"kiln::Store<{ctype}>::of({value});"
    )


def _reduction(k: _KernelContext, node: Reduction, lines: list[str], ind: str) -> None:
    acc = f"acc_{node.name}"
    ct = compute_ctype(node.body.dtype)
    arg = node.reduce_type.startswith("arg")
    if arg:
        lines.append(f"{ind}{ct} {acc} = kiln::lowest<{ct}>(); int64_t {acc}_i = 0;")
    else:
        ct = compute_ctype(node.dtype)
        init = REDUCTION_INIT[node.reduce_type].format(T=ct)
        lines.append(f"{ind}{ct} {acc} = {init};")
    simd = node.reduce_type == "sum" and ct in ("float", "double", "int64_t", "int32_t")
    # Float max/min: a vectorizable max plus a NaN flag (ATen propagates NaN).
    nan_flag = node.reduce_type in ("max", "min") and ct in ("float", "double")
    if simd:
        lines.append(f"{ind}#pragma omp simd reduction(+:{acc})")
    elif nan_flag:
        # An int flag, not a bool: GCC 12 cannot vectorize an `omp simd` reduction of bools.
        lines.append(f"{ind}int {acc}_nan = 0;")
        lines.append(
            f"{ind}#pragma omp simd reduction({node.reduce_type}:{acc}) reduction(|:{acc}_nan)"
        )
    lines.append(f"{ind}for (int64_t r = 0; r < {sympy_str(k.kernel.inner)}; ++r) {{")
    inner = ind + "  "
    _bind(lines, inner, index_vars(len(node.size)), node.size, _X, k.row_hoist)
    _bind(lines, inner, reduce_vars(len(node.reduce_size)), node.reduce_size, _R)
    body = _Body(k, lines, inner, _row_sub(index_vars(len(node.size)), node.size))
    body.names.update(k.preset.get(node.name, {}))
    v = body.emit(node.body)
    if node.name in k.shared:
        expr, target, readers = k.shared[node.name]
        slot = f"{k.param(target, True)}[{sympy_str(_X * k.kernel.inner + _R)}]"
        lines.append(f"{inner}{slot} = {body.names[expr]};")
        for member, same in readers.items():
            k.preset.setdefault(member, {})[same] = slot
    if arg:
        better = ">" if node.reduce_type == "argmax" else "<"
        lines.append(
            f"{inner}if (r == 0 || (!kiln::isnan_({acc}) && "
            f"(kiln::isnan_({v}) || {v} {better} {acc}))) {{ {acc} = {v}; {acc}_i = r; }}"
        )
    elif nan_flag:
        cmp = ">" if node.reduce_type == "max" else "<"
        lines.append(f"{inner}{acc} = {v} {cmp} {acc} ? {v} : {acc}; {acc}_nan |= ({v} != {v});")
    else:
        lines.append(inner + REDUCTION_COMBINE[node.reduce_type].format(acc=acc, v=v))
    lines.append(f"{ind}}}")
    if nan_flag:
        lines.append(f"{ind}if ({acc}_nan) {acc} = std::numeric_limits<{ct}>::quiet_NaN();")
    result = f"{acc}_i" if arg else acc
    k.values[node.name] = result
    _store(k, node, _X, result, ind, lines)


def _per_row(k: _KernelContext, node: Pointwise, lines: list[str], ind: str) -> None:
    lines.append(f"{ind}{compute_ctype(node.dtype)} v_{node.name};")
    lines.append(f"{ind}{{")
    _bind(lines, ind + "  ", index_vars(len(node.size)), node.size, _X)
    v = _Body(k, lines, ind + "  ").emit(node.body)
    lines.append(f"{ind}  v_{node.name} = {v};")
    lines.append(f"{ind}}}")
    k.values[node.name] = f"v_{node.name}"
    _store(k, node, _X, f"v_{node.name}", ind, lines)


def _inner_loop(
    k: _KernelContext, members, lines: list[str], ind: str, pragma: str, piece=None
) -> None:
    """One loop over the row's elements computing `members`; `piece` = (start, end, body):
    only positions [start, end) of a single member, whose body there is `body`."""
    start, end, body = piece or (0, k.kernel.inner, None)
    tail = None if piece else _tail(k, members)
    ro_hoist, ro_ind, ro_at = _Hoisted("roi"), ind, 0
    if tail:  # the row as (the rest) x (its last dimension), the last one vectorized
        if " for" in pragma:  # shared among threads: the outer loop is
            lines.append(f"{ind}{pragma.replace(' simd', '')}")
        first = k.nodes[members[0].name]
        rest = sympy_str(sympy.Mul(*first.size[members[0].split : -1]))  # = end / tail
        lines.append(f"{ind}for (int64_t ro = 0; ro < {rest}; ++ro) {{")
        ind += "  "
        ro_hoist, ro_ind, ro_at = _Hoisted("roi"), ind, len(lines)
        lines.append(f"{ind}#pragma omp simd")
        last = sympy_str(tail) if isinstance(tail, int) else f"({sympy_str(tail)})"
        lines.append(f"{ind}for (int64_t ri = 0; ri < {last}; ++ri) {{")
        lines.append(f"{ind}  const int64_t r = ro * {last} + ri;")
    else:
        lines.append(f"{ind}{pragma}")
        lines.append(f"{ind}for (int64_t r = {start}; r < {sympy_str(end)}; ++r) {{")
    inner = ind + "  "
    for m in members:
        node = k.nodes[m.name]
        lines.append(f"{inner}{compute_ctype(node.dtype)} v_{node.name};")
    # Members over the same index space share one scope and one `_Body`, so what several of
    # them compute (GELU's erf in a backward that also recomputes the forward) is computed
    # once. A member reading values an earlier loop stored in a row (`k.preset`) gets a scope
    # of its own: the row it reads may be the one the next member overwrites.
    scope, member_body = None, None
    for m in members:
        node = k.nodes[m.name]
        var = f"v_{node.name}"
        key = (tuple(node.size), m.split, node.name in k.preset)
        if key != scope or node.name in k.preset:
            if scope is not None:
                lines.append(f"{inner}}}")
            lines.append(f"{inner}{{")
            vs = index_vars(len(node.size))
            _bind(lines, inner + "  ", vs[: m.split], node.size[: m.split], _X, k.row_hoist)
            if tail:
                rest_vs, rest = vs[m.split : -1], node.size[m.split : -1]
                _bind(lines, inner + "  ", rest_vs, rest, _RO, (ro_hoist, ro_ind))
                lines.append(f"{inner}  const int64_t {vs[-1]} = ri;")
            else:
                _bind(lines, inner + "  ", vs[m.split :], node.size[m.split :], _R)
            row_sub = _row_sub(vs[: m.split], node.size[: m.split])
            member_body, scope = _Body(k, lines, inner + "  ", row_sub), key
            member_body.names.update(k.preset.get(node.name, {}))
        v = member_body.emit(body if body is not None else node.body)
        lines.append(f"{inner}  {var} = {v};")
        _store(k, node, _X * k.kernel.inner + _R, var, inner + "  ", lines)
        k.values[node.name] = var
    lines.append(f"{inner}}}")
    lines.append(f"{ind}}}")
    if tail:
        lines.append(f"{ind[:-2]}}}")
        lines[ro_at:ro_at] = ro_hoist.lines  # before the vectorized loop, inside `ro`'s
    for m in members:  # element values are only valid inside this loop
        del k.values[m.name]


TAIL_MIN = 8  # a last dimension this long (one vector of floats at AVX2) is its own loop


def _tail(k: _KernelContext, members) -> int | None:
    """The size of the last dimension when every member's row spans it and more, and it is
    long enough to vectorize alone: a channels-last batch norm's row is width x channels, and
    looping over channels innermost reads its per-channel parameters as plain vectors (as
    `r % channels` they were per-lane gathers, with the per-channel math per element)."""
    sizes = {tuple(k.nodes[m.name].size) for m in members}
    splits = {m.split for m in members}
    if len(sizes) != 1 or len(splits) != 1:
        return None
    (size,), (split,) = sizes, splits
    if split >= len(size) - 1 or any(m.per_row for m in members):
        return None
    last = size[-1]
    if is_symbolic(last) or is_symbolic(k.kernel.inner):
        # symbolic sizes: the row is still (the rest) x (its last dimension), whatever they
        # are; a last dimension that is short (a symbolic one counts as long, whatever its
        # hint) is not worth a loop of its own (speed only)
        return last if hint_at_least(last, TAIL_MIN) >= TAIL_MIN else None
    if last < TAIL_MIN or k.kernel.inner % last:
        return None
    return last


def _pieces(k: _KernelContext, group) -> list | None:
    """A member that picks its value by position along the row (`cat` along the last dim:
    `where(i2 < 256, a, where(i2 < 512, b, c))`) as (start, end, body) per piece, so each
    piece is a plain loop with no select and only its own loads; None for any other member."""
    if len(group) != 1 or group[0].name in k.preset or is_symbolic(k.kernel.inner):
        return None
    (m,) = group
    node = k.nodes[m.name]
    if m.per_row or m.split != len(node.size) - 1:
        return None
    last = index_vars(len(node.size))[-1]
    out, start, body = [], 0, node.body
    while isinstance(body, Op) and body.op == "where":
        cond, a, b = body.args
        if not (
            isinstance(cond, Op)
            and cond.op == "lt"
            and isinstance(cond.args[0], IndexValue)
            and cond.args[0].expr == last
            and isinstance(cond.args[1], Const)
            and start < int(cond.args[1].value) < k.kernel.inner
        ):
            break
        end = int(cond.args[1].value)
        out.append((start, end, a))
        start, body = end, b
    if not out:
        return None
    out.append((start, k.kernel.inner, body))
    return [(lo, hi, _within(e, last, lo, hi)) for lo, hi, e in out]


def _within(expr, var, lo: int, hi: int):
    """`expr` with the clamps of its indices (`min(255, i2)`, which keep every branch of a
    `cat` in bounds) decided for `var` in [lo, hi): a piece's loads then index plainly."""
    from ...lower.indexing import affine_coefficients, is_affine

    def bounds(a):
        if a.free_symbols - {var} or not is_affine(a, [var]):
            return None
        (c,), k0 = affine_coefficients(a, [var])
        ends = (c * lo + k0, c * (hi - 1) + k0)
        return min(ends), max(ends)

    def decide(e):
        bs = [bounds(a) for a in e.args]
        if None in bs:
            return e
        for k, (a, (alo, ahi)) in enumerate(zip(e.args, bs)):
            rest = bs[:k] + bs[k + 1 :]
            if isinstance(e, sympy.Min) and all(ahi <= blo for blo, _ in rest):
                return a
            if isinstance(e, sympy.Max) and all(alo >= bhi for _, bhi in rest):
                return a
        return e

    def index(ix):
        if not isinstance(ix, sympy.Basic) or not ix.has(sympy.Min, sympy.Max):
            return ix
        return ix.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), decide)

    return map_indices(expr, index)


def _at_least(value, n: int) -> bool | str:
    """`value >= n`: a bool for a static size, else the C condition for the kernel to test (an
    OpenMP `if` clause: threads start only for sizes that pay for them)."""
    if not is_symbolic(value):
        return value >= n
    return f"{sympy_str(value)} >= {n}"


def _omp_if(cond: bool | str) -> str:
    return f" if({cond})" if isinstance(cond, str) else ""


def _size_params(lines: list[str]) -> tuple[str, ...]:
    """The size symbols (`s0`, `s17`) a kernel's text uses: its `int64_t` arguments."""
    found: set[str] = set()
    for line in lines:
        found.update(_SIZE_NAME.findall(line))
    return tuple(sorted(found, key=lambda n: (len(n), n)))


_SIZE_NAME = re.compile(r"\bs\d+\b")


def _signature(k: _KernelContext, nodes: dict, params: tuple, sizes: tuple) -> str:
    # a buffer written into a mutated input is that input's memory: neither pointer is
    # `__restrict__`, or the compiler could move a read of the input after the write
    sig = [
        f"{'' if k.params[p] else 'const '}{CTYPES[_dtype(nodes[p])]}*"
        f"{'' if p in k.aliased else ' __restrict__'} {p}"
        for p in params
    ]
    return ", ".join(sig + [f"const int64_t {s}" for s in sizes])


def render_kernel(kernel: Kernel, nodes: dict, aliased: frozenset = frozenset()) -> CppKernel:
    """`aliased`: buffers that share memory with another one (schedule/inplace.py)."""
    k = _KernelContext(kernel, nodes)
    k.aliased = aliased
    numel = kernel.outer * kernel.inner
    only_inner = all(isinstance(nodes[m.name], Pointwise) and not m.per_row for m in kernel.members)
    if is_symbolic(numel):
        # Runtime sizes: parallel when the call's sizes pay for it (OpenMP `if`), decided per
        # call; rows of a row kernel may be 1 only for some sizes (then the `if` keeps it serial)
        parallel_rows = _at_least(numel, PARALLEL_MIN_ELEMENTS) if kernel.outer != 1 else False
        flat_parallel = kernel.outer == 1 and only_inner and _at_least(numel, PARALLEL_MIN_ELEMENTS)
        if _is_column_kernel(kernel, nodes):
            return _render_columns(k, parallel_rows)
    else:
        parallel_rows = kernel.outer > 1 and numel >= PARALLEL_MIN_ELEMENTS
        flat_parallel = kernel.outer == 1 and only_inner and numel >= PARALLEL_MIN_ELEMENTS
    if not is_symbolic(numel) and _is_column_kernel(kernel, nodes):
        return _render_columns(k, parallel_rows)
    pragma = "#pragma omp parallel for simd" if flat_parallel else "#pragma omp simd"
    loop = kernel_loop(k, pragma + _omp_if(flat_parallel))
    params = tuple(k.params)
    sizes = _size_params(loop)
    lines = [f'extern "C" void {kernel.name}({_signature(k, nodes, params, sizes)}) {{']
    if parallel_rows:
        lines.append("  #pragma omp parallel for" + _omp_if(parallel_rows))
    lines.extend(loop)
    lines.append("}")
    return CppKernel(kernel.name, params, "\n".join(lines), sizes)


def kernel_loop(k: _KernelContext, flat_pragma: str) -> list[str]:
    """The kernel's loop over its rows, each member's block inside; `flat_pragma` heads each
    loop over a row's elements (`omp simd`, or a pragma that also shares it among threads)."""
    kernel, nodes = k.kernel, k.nodes
    body: list[str] = []
    ind = "    "
    members = list(kernel.members)
    while members:
        m = members.pop(0)
        node = nodes[m.name]
        if isinstance(node, Reduction):
            _reduction(k, node, body, ind)
        elif m.per_row:
            _per_row(k, node, body, ind)
        else:
            group = [m]
            while (
                members and not members[0].per_row and isinstance(nodes[members[0].name], Pointwise)
            ):
                group.append(members.pop(0))
            pieces = _pieces(k, group)
            for piece in pieces or [None]:
                _inner_loop(k, group, body, ind, flat_pragma, piece)
    loop = [f"  for (int64_t x = 0; x < {sympy_str(kernel.outer)}; ++x) {{"]
    return loop + k.row_hoist[0].lines + body + ["  }"]


def _dtype(node):
    return node.dtype if isinstance(node, (Pointwise, Reduction)) else node.layout.dtype


# ---------------------------------------------------------------------------------------------
# Column reductions: sums whose rows are contiguous across the row index (a bias gradient sums
# a [tokens, features] tensor over tokens). Read row by row they load one element per cache
# line, unvectorized; instead a block of COLUMN_BLOCK rows is summed together, the reduced
# index outermost and the row index in a vectorized inner loop over an array of accumulators.
# ---------------------------------------------------------------------------------------------

COLUMN_BLOCK = 64
COLUMN_CHUNK = 8  # rows summed into a partial before it joins the column's total


def _storage_coefficients(node, k: _KernelContext):
    """(coefficient of x, coefficient of r) of every load of a buffer outside the kernel in
    `node`'s body, with x/r the kernel's row and reduced positions; None if not affine. A
    coefficient may be a size expression (a symbolic stride: `s1` features per token)."""
    from ...lower.indexing import simplify_index, symbolic_affine

    sub = dict(zip(index_vars(len(node.size)), delinearize(_X, tuple(node.size))))
    sub.update(zip(reduce_vars(len(node.reduce_size)), delinearize(_R, tuple(node.reduce_size))))
    out = []
    for ld in loads(node.body):
        if ld.buf in k.in_kernel:
            return None
        lay = k.nodes[ld.buf].layout
        pos = simplify_index(linearize([e.xreplace(sub) for e in ld.index], lay.stride))
        form = symbolic_affine(pos, (_X, _R))
        if form is None:
            return None
        (cx, cr), _ = form
        out.append((cx, cr))
    return out


def _is_column_kernel(kernel: Kernel, nodes: dict) -> bool:
    """Float sums only (any per-row members after them), each reading at least one buffer
    strided along the reduced position and contiguous along the row, and nothing that moves
    along the row by other than one element: then a column layout reads memory in order.
    Loads that do not move along the row are one value per reduced position (layer norm's
    per-token mean and rstd in its weight gradient) and cost nothing in that layout."""
    k = _KernelContext(kernel, nodes)
    reds = [nodes[m.name] for m in kernel.members if isinstance(nodes[m.name], Reduction)]
    # speed only: hints, a symbolic size counted as long whatever its hint
    if not reds or hint_at_least(kernel.outer, 8) < 8 or hint_at_least(kernel.inner, 2) < 2:
        return False
    if any(not m.per_row for m in kernel.members if isinstance(nodes[m.name], Pointwise)):
        return False
    for red in reds:
        if red.reduce_type != "sum" or compute_ctype(red.dtype) not in ("float", "double"):
            return False
        coeffs = _storage_coefficients(red, k)
        if not coeffs or any(cx not in (0, 1) or (cx, cr) == (1, 1) for cx, cr in coeffs):
            return False
        if not any(cx == 1 and cr not in (0, 1) for cx, cr in coeffs):
            return False
    return True


def _render_columns(k: _KernelContext, parallel: bool | str) -> CppKernel:
    kernel, nodes, B = k.kernel, k.nodes, COLUMN_BLOCK
    reds = [m for m in kernel.members if isinstance(nodes[m.name], Reduction)]
    body: list[str] = []
    ind = "    "
    outer, inner_n = sympy_str(kernel.outer), sympy_str(kernel.inner)
    body.append(f"{ind}const int64_t xe = xb + {B} < {outer} ? xb + {B} : {outer};")
    C = COLUMN_CHUNK
    for m in reds:  # per column, a total in double (summed in order, a column's rounding
        # error grows with its length; eager sums pairwise) and a partial over a few rows in
        # the compute type: adding floats into doubles made the row loop convert every value
        part = compute_ctype(nodes[m.name].dtype)
        body.append(f"{ind}double acc_{m.name}[{B}]; {part} part_{m.name}[{B}];")
        body.append(f"{ind}for (int64_t x = xb; x < xe; ++x) acc_{m.name}[x - xb] = 0;")
    body.append(f"{ind}for (int64_t rb = 0; rb < {inner_n}; rb += {C}) {{")
    body.append(f"{ind}  const int64_t re = rb + {C} < {inner_n} ? rb + {C} : {inner_n};")
    for m in reds:
        body.append(f"{ind}  for (int64_t x = xb; x < xe; ++x) part_{m.name}[x - xb] = 0;")
    body.append(f"{ind}  for (int64_t r = rb; r < re; ++r) {{")
    r_hoist, r_at = (_Hoisted("rv"), f"{ind}    "), len(body)
    body.append(f"{ind}    #pragma omp simd")
    body.append(f"{ind}    for (int64_t x = xb; x < xe; ++x) {{")
    inner = ind + "        "
    for m in reds:  # each in its own scope: they bind the same index names
        node = nodes[m.name]
        body.append(f"{ind}      {{")
        _bind(body, inner, index_vars(len(node.size)), node.size, _X)
        _bind(body, inner, reduce_vars(len(node.reduce_size)), node.reduce_size, _R, r_hoist)
        v = _Body(k, body, inner).emit(node.body)
        body.append(f"{inner}part_{m.name}[x - xb] += {v};")
        body.append(f"{ind}      }}")
    body[r_at:r_at] = r_hoist[0].lines  # the reduced position's indices: once per `r`
    body.append(f"{ind}    }}")
    body.append(f"{ind}  }}")
    for m in reds:
        a, pt = f"acc_{m.name}[x - xb]", f"part_{m.name}[x - xb]"
        body.append(f"{ind}  for (int64_t x = xb; x < xe; ++x) {a} += {pt};")
    body.append(f"{ind}}}")
    body.append(f"{ind}for (int64_t x = xb; x < xe; ++x) {{")
    for m in kernel.members:
        node = nodes[m.name]
        if isinstance(node, Reduction):
            ct = compute_ctype(node.dtype)
            k.values[node.name] = f"static_cast<{ct}>(acc_{node.name}[x - xb])"
            _store(k, node, _X, k.values[node.name], ind + "  ", body)
        else:
            _per_row(k, node, body, ind + "  ")
    body.append(f"{ind}}}")
    params = tuple(k.params)
    loop = [f"  for (int64_t xb = 0; xb < {outer}; xb += {B}) {{", *body]
    sizes = _size_params(loop)
    lines = [f'extern "C" void {kernel.name}({_signature(k, nodes, params, sizes)}) {{']
    if parallel:
        lines.append("  #pragma omp parallel for" + _omp_if(parallel))
    lines.extend(loop)
    lines.append("  }")
    lines.append("}")
    return CppKernel(kernel.name, params, "\n".join(lines), sizes)


def _shared_values(kernel: Kernel, nodes: dict) -> dict:
    """Reduction member -> (expr, pointwise member, {member: same expr in its body}) where the
    pointwise, and maybe members between, recompute element for element a costly value the
    reduction's loop already computed.

    Softmax is the case: `sum(exp(x - max))` then `exp(x - max) / sum`. The reduction's loop
    stores each `exp(x - max)` into the pointwise's own output row (it is about to be written
    there anyway), and the pointwise's loop reads it back instead of calling `exp` again; so do
    the loops between them over the same row (a layer norm of the softmax sums the row twice
    more), which run before the pointwise overwrites the row.
    """
    out: dict = {}
    members = list(kernel.members)
    targets: set = set()
    for k, m in enumerate(members):
        red = nodes[m.name]
        if not isinstance(red, Reduction) or red.reduce_type.startswith("arg"):
            continue
        for j in range(k + 1, len(members)):
            pm, p = members[j], nodes[members[j].name]
            if (
                not isinstance(p, Pointwise)
                or pm.per_row
                or p.name in kernel.local
                or p.name in targets
                or p.dtype in HALF_TYPES  # the row is stored rounded: recompute instead
                or not _same_row(red, p, pm)
            ):
                continue
            found = None
            for e in walk(red.body):  # children first: the last match is the largest
                if isinstance(e, Op) and e.dtype == p.dtype and _costly(e):
                    same = _in_member(e, red, p, pm)
                    if same is not None:
                        found = (e, same)
            if found:
                e, same = found
                readers = {p.name: same}
                for bm in members[k + 1 : j]:  # the loops between also read the stored row
                    between = _in_member(e, red, nodes[bm.name], bm)
                    if between is not None:
                        readers[bm.name] = between
                out[red.name] = (e, p.name, readers)
                targets.add(p.name)
                break
    return out


def _same_row(red: Reduction, node, m) -> bool:
    """`node`, placed as `m`, loops over the same rows and row elements as `red`."""
    if isinstance(node, Reduction):
        return tuple(node.size) == tuple(red.size) and tuple(node.reduce_size) == tuple(
            red.reduce_size
        )
    return (
        not m.per_row
        and tuple(node.size[: m.split]) == tuple(red.size)
        and tuple(node.size[m.split :]) == tuple(red.reduce_size)
    )


def _in_member(expr, red: Reduction, node, m):
    """`expr` of `red`'s body as `node`'s body spells it (its own loop variables), if
    `node`'s body computes it at the same element; else None."""
    if not _same_row(red, node, m):
        return None
    if isinstance(node, Pointwise):
        sub = dict(zip(reduce_vars(len(red.reduce_size)), index_vars(len(node.size))[m.split :]))
        expr = reindex(expr, sub)
    return expr if any(e == expr for e in walk(node.body) if isinstance(e, Op)) else None


def _costly(expr) -> bool:
    return costly_count(expr) > 0

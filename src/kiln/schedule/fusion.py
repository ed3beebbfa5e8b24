"""Fusion: group the computed nodes of a `LoopGraph` into kernels.

Takes a `LoopGraph` after `realize.py` (every `Pointwise`/`Reduction` left needs computing);
gives the ordered steps: `Kernel`s and `ExternCall`s.

The model (the CPU one; a GPU renderer reads the same kernels): a kernel is a loop over `outer`
rows, run in parallel, and inside each row a sequence of members. A `Reduction` member loops
over the `inner` reduced elements of its row and yields one value; an inner `Pointwise` member
loops over the `inner` elements of its row (its size splits into leading dims of product
`outer` and trailing dims of product `inner`); an outer `Pointwise` member computes one value
per row. So softmax — max, sum of exp, then the normalized row — is one kernel, one pass per
member over each row, and layer norm likewise.

A node joins a kernel only if every value it reads from a member of that kernel is one the
same row computed: the same element (inner from inner), or the row's value (anything from a
per-row member). A one-value node goes first to a kernel of one-value nodes (an optimizer step's
counts and bias corrections: one small kernel ahead of the per-tensor updates, which then each
read and write their tensors in one pass); a pointwise node of more than one value does not
become a per-row member of an element-wise kernel it reads nothing from (it would share no
value, and would keep that kernel out of a horizontal group). Each refusal names its rule under
`KILN_LOGS=schedule`; each fusion spends one unit of fuel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import sympy

from .. import logs
from ..lower.hints import hint_at_least
from ..lower.indexing import index_vars, is_size_symbol, memory_steps, reduce_vars
from ..lower.ir import (
    Extern,
    ExternItem,
    IntExpr,
    LoopGraph,
    Node,
    Pointwise,
    Reduction,
    SizeT,
    loads,
)
from ..lower.symbolic import hint
from .fuel import Fuel

# A pointwise kernel of its own splits so that each row has at least this many elements.
MIN_INNER = 256


@dataclass(frozen=True)
class Member:
    """`name` placed in a kernel: `split` dims form the row index, the rest the inner loop;
    `per_row` members compute one value per row."""

    name: str
    split: int
    per_row: bool

    def __str__(self) -> str:
        return f"{self.name}({'row' if self.per_row else f'split={self.split}'})"


@dataclass(frozen=True)
class Kernel:
    name: str
    outer: int
    inner: int
    members: tuple[Member, ...]
    local: frozenset = frozenset()  # members whose values never leave the kernel
    # a horizontal kernel (horizontal.py): the independent kernels it runs side by side
    parts: tuple[Kernel, ...] = ()

    def __str__(self) -> str:
        if self.parts:
            inner = "\n".join(f"  part {p}" for p in self.parts)
            return f"{self.name}: horizontal, {len(self.parts)} parts\n{inner}"
        ms = ", ".join(str(m) for m in self.members)
        loc = f" local={{{', '.join(sorted(self.local))}}}" if self.local else ""
        return f"{self.name}: rows={self.outer} x inner={self.inner} [{ms}]{loc}"


@dataclass(frozen=True)
class ExternCall:
    name: str

    def __str__(self) -> str:
        return f"extern {self.name}"


Computed = Union[Pointwise, Reduction]  # the nodes kernels compute
Step = Union[Kernel, ExternCall]  # what fusion gives, in order


def member_node(nodes: dict[str, Node], name: str) -> Computed:
    """The node of kernel member `name`: only computed nodes join kernels."""
    node = nodes[name]
    assert isinstance(node, (Pointwise, Reduction)), f"kernel member {name} is {node}"
    return node


def _coords(node: Computed, m: Member) -> tuple[tuple, tuple, tuple, tuple]:
    """(row vars, row sizes, inner vars, inner sizes) of a member, in its own loop variables."""
    if isinstance(node, Reduction):
        return (
            index_vars(len(node.size)),
            tuple(node.size),
            reduce_vars(len(node.reduce_size)),
            tuple(node.reduce_size),
        )
    vs, size = index_vars(len(node.size)), tuple(node.size)
    if m.per_row:
        return vs, size, (), ()
    return vs[: m.split], size[: m.split], vs[m.split :], size[m.split :]


def _splits(size: SizeT) -> list[int]:
    return list(range(len(size) + 1))


def place(node: Computed, outer: int, inner: int) -> Member | None:
    """Where `node` goes in a kernel of `outer` rows x `inner`, or None if it does not fit."""
    if isinstance(node, Reduction):
        ok = math.prod(node.size) == outer and math.prod(node.reduce_size) == inner
        return Member(node.name, len(node.size), False) if ok else None
    size = tuple(node.size)
    for k in _splits(size):
        if math.prod(size[:k]) == outer and math.prod(size[k:]) == inner:
            return Member(node.name, k, False)
    if math.prod(size) == outer:
        return Member(node.name, len(size), True)
    return None


def _reads_ok(node: Computed, m: Member, kernel: Kernel, nodes: dict[str, Node]) -> str | None:
    """None if every load of a kernel member by `node` reads a value of the same row."""
    inside = {x.name: x for x in kernel.members}
    rv, rs, iv, isz = _coords(node, m)
    ones = {v for v, n in zip(rv + iv, rs + isz) if n == 1}  # loop variables that are always 0
    for ld in loads(node.body):
        src_m = inside.get(ld.buf)
        if src_m is None:
            continue
        src = member_node(nodes, ld.buf)
        srv, srs, siv, sis = _coords(src, src_m)
        per_row_src = src_m.per_row or isinstance(src, Reduction)
        if per_row_src:
            if not _same_position(ld.index, srs, rv, rs, ones):
                return f"reads {ld.buf}[{', '.join(map(str, ld.index))}], not its own row's value"
        else:
            if m.per_row and not isinstance(node, Reduction):
                return f"computes one value per row but reads {ld.buf} element by element"
            if not _same_position(ld.index, srs + sis, rv + iv, rs + isz, ones):
                return f"reads {ld.buf} at another element than the one this row computes"
    return None


def _same_position(
    index: tuple, src_size: tuple, my_vars: tuple, my_size: tuple, ones: set
) -> bool:
    """Does `src[index]` (of `src_size`) name the element at loop position `my_vars` (of
    `my_size`)? Dimensions of size 1 do not count: a decode step's [1, 1, 768] row and its
    [1, 1] statistics are the same row however the kernel splits the ones."""
    if len(index) != len(src_size):
        return False
    theirs = [(e, n) for e, n in zip(index, src_size) if n != 1]
    mine = [(v, n) for v, n in zip(my_vars, my_size) if n != 1]
    if theirs != mine:
        return False
    return all(e == 0 or e in ones for e, n in zip(index, src_size) if n == 1)


def _try_join(node: Computed, kernel: Kernel, nodes: dict[str, Node]) -> tuple[Kernel | None, str]:
    outer, inner = kernel.outer, kernel.inner
    has_reduction = any(isinstance(nodes[x.name], Reduction) for x in kernel.members)
    if isinstance(node, Reduction) and not has_reduction:
        # A pointwise-only kernel may be re-split to the reduction's rows.
        outer, inner = math.prod(node.size), math.prod(node.reduce_size)
    members = []
    for x in kernel.members:
        p = place(member_node(nodes, x.name), outer, inner)
        if p is None:
            return None, f"{x.name} does not split into {outer} rows x {inner}"
        members.append(p)
    m = place(node, outer, inner)
    if m is None:
        return None, f"size does not split into the kernel's {outer} rows x {inner}"
    if not has_reduction and not isinstance(node, Reduction):
        apart = _transposed_apart(node, kernel, nodes)
        if apart:
            return None, apart
    if m.per_row and not has_reduction and isinstance(node, Pointwise) and _numel(node) != 1:
        inside = {x.name for x in kernel.members}
        if not any(ld.buf in inside for ld in loads(node.body)):
            # It would share no value with the rows, only a launch, and make an element-wise
            # kernel one of per-row members, no part of a horizontal group (horizontal.py),
            # where a foreach step's bias vectors and the same-size ones of other layers make
            # one launch anyway.
            return None, "one value per row, reading nothing the element-wise kernel computes"
    trial = Kernel(kernel.name, outer, inner, tuple(members))
    why = _reads_ok(node, m, trial, nodes)
    if why:
        return None, why
    return Kernel(kernel.name, outer, inner, tuple(members) + (m,)), ""


def _transposed_apart(node: Computed, kernel: Kernel, nodes: dict[str, Node]) -> str:
    """Pointwise nodes of different shapes that share a kernel share one flat loop, so a read
    that is transposed for one of them cannot be tiled (a GPU renderer tiles a kernel whose
    members have one shape: `codegen/triton/heuristics.py`). Q, K-transposed and V of an
    attention layer fused this way took 24 us against 15 us apart (BERT, H200). A reason when
    joining would do that; "" otherwise."""
    others = [member_node(nodes, x.name) for x in kernel.members]
    if all(tuple(o.size) == tuple(node.size) for o in others):
        return ""
    for n in (node, *others):
        hit = transposed_read(n, nodes, at_hints=True)
        if hit:
            shape = "the kernel's members" if n is node else f"{node.name}"
            return (
                f"{n.name} reads {hit[0]} transposed: apart, its kernel can be tiled; sharing "
                f"one with {shape} of another shape, it cannot"
            )
    return ""


def transposed_read(
    node: Computed, nodes: dict[str, Node], at_hints: bool = False
) -> tuple[str, int] | None:
    """The first buffer `node` reads with its last dimension strided and an earlier one, `d`,
    contiguous, as (buffer, the last such `d`); None if it reads none so. Dimensions shorter
    than TRANSPOSE_MIN do not count. (The Triton renderer tiles such a kernel at `d + 1`.)
    `at_hints`: symbolic strides and indices are read at the size hints, so that a transposed
    read through a symbolic stride (`768*s0*i0 + 768*i3 + i2`) is seen as one: fusion keeps such
    a node apart as it does at static sizes, where the C++ renderer vectorizes each alone."""
    # a speed decision: hints for symbolic sizes, each taken as long enough to count
    size = [hint_at_least(s, TRANSPOSE_MIN) for s in node.size]
    if len(size) < 2 or size[-1] < TRANSPOSE_MIN:
        return None
    names = index_vars(len(size))
    for ld in loads(node.body):
        layout = getattr(nodes.get(ld.buf), "layout", None)  # a view has none
        if layout is None:
            continue
        index, stride = ld.index, layout.stride
        if at_hints:
            index, stride = tuple(map(_at_hints, index)), tuple(map(_at_hints, stride))
        steps = memory_steps(index, stride, names)
        if steps is None or steps[-1] in (0, 1):
            continue
        for d in range(len(size) - 2, -1, -1):
            if steps[d] == 1 and size[d] >= TRANSPOSE_MIN:
                return ld.buf, d
    return None


# a dimension shorter than this gains nothing from a tile of 32
TRANSPOSE_MIN = 16


def _at_hints(e: object) -> object:
    """A size or index expression with its size symbols at their hints (loop variables kept)."""
    if not isinstance(e, sympy.Basic) or e.is_Number:
        return e
    sizes = {s: hint(s) for s in e.free_symbols if is_size_symbol(s)}
    return e.xreplace(sizes) if sizes else e


def _new_kernel(node: Computed, name: str) -> Kernel:
    if isinstance(node, Reduction):
        outer, inner = math.prod(node.size), math.prod(node.reduce_size)
        return Kernel(name, outer, inner, (Member(node.name, len(node.size), False),))
    size = tuple(node.size)
    k = len(size)
    while k > 0 and hint_at_least(math.prod(size[k:]), MIN_INNER) < MIN_INNER:  # speed only
        k -= 1
    outer, inner = math.prod(size[:k]), math.prod(size[k:])
    return Kernel(name, outer, inner, (Member(node.name, k, False),))


def fuse(graph: LoopGraph, fuel: Fuel) -> tuple[Step, ...]:
    """The steps of `graph`: kernels (fused greedily, in graph order) and extern calls."""
    nodes = graph.node_map()
    steps: list[Step] = []
    where: dict[str, int] = {}  # buffer name -> index of the step that computes it
    by_numel: dict = {}  # elements -> positions of kernels that hold pointwise nodes of that many
    for node in graph.nodes:
        if isinstance(node, Extern):
            steps.append(ExternCall(node.name))
            where[node.name] = len(steps) - 1
            continue
        if isinstance(node, ExternItem):  # an output of a tuple-returning call: ready with it
            where[node.name] = where[node.base]
            continue
        if not isinstance(node, (Pointwise, Reduction)):
            continue
        deps = [where[ld.buf] for ld in loads(node.body) if ld.buf in where]
        first_ok = max(deps, default=-1)
        joined: Kernel | None = None
        for pos in _candidates(node, steps, first_ok, by_numel):
            step = steps[pos]
            if isinstance(step, ExternCall) and first_ok < 0:
                # A node that reads only the graph's inputs, joined to a kernel before an
                # extern call, has its work and its buffer's life moved back across the call:
                # a conv net's weight copies then each lived across a convolution, stacked
                # up, and the arena (arena.py) no longer fitted under the call's peak.
                # (the message is bound to a name first: mypy#15459, as below)
                not_moved = lambda s=step, n=node.name: f"{n} not moved before {s.name}"
                logs.log("schedule", not_moved)
                break
            if pos < first_ok or not isinstance(step, Kernel):
                continue
            kernel, why = _try_join(node, step, nodes)
            if kernel is not None and not fuel.take(f"fuse {node.name} into {step.name}"):
                kernel, why = None, "out of fuel"
            if kernel is None:
                # Bound to a name first: mypy cannot type a lambda whose defaults bind loop
                # variables where it is passed as an argument (mypy#15459).
                not_fused = lambda s=step, w=why, n=node.name: f"{n} not fused into {s.name}: {w}"
                logs.log("schedule", not_fused)
                continue
            steps[pos] = joined = kernel
            where[node.name] = pos
            fused = lambda s=step, n=node.name: f"{n} fused into {s.name}"  # mypy#15459
            logs.log("schedule", fused)
            break
        if joined is None:
            joined = _new_kernel(node, f"kernel{sum(isinstance(s, Kernel) for s in steps)}")
            steps.append(joined)
            where[node.name] = len(steps) - 1
        if isinstance(node, Pointwise) and joined.outer * joined.inner == _numel(node):
            by_numel.setdefault(_numel(node), []).append(where[node.name])
    return tuple(_mark_locals(steps, graph))


# Kernels tried right behind a node before the search goes to its producer's and same-size ones
LOOKBACK = 3


def _numel(node: Computed) -> IntExpr:
    return math.prod(node.size)


def _candidates(node: Computed, steps: list, first_ok: int, by_numel: dict) -> list[int]:
    """Positions of the kernels `node` may join, tried in this order: the last LOOKBACK steps,
    then the kernel that computes what it reads last (a chain of per-tensor ops such as a
    foreach optimizer update: the op of tensor i finds tensor i's kernel, however many other
    tensors' kernels came between), then kernels of pointwise nodes with as many elements (the
    same op on another tensor of that size: one kernel for all of them). Never one before
    `first_ok`, the step that computes the last value `node` reads."""
    low = max(first_ok, 0)
    if isinstance(node, Pointwise) and _numel(node) == 1:
        # One value (a step count, a bias correction, a step size): first the kernels of such
        # values. As a per-row member of a larger kernel it would wait for that kernel's
        # place, and so would everything that reads it: an optimizer step's per-tensor update
        # then split into two kernels around it, its state written by one and read back by
        # the other.
        ones = [p for p in reversed(by_numel.get(1, ())) if p >= low]
        if ones:
            return ones[:LOOKBACK]
    near = list(range(len(steps) - 1, max(low, len(steps) - LOOKBACK) - 1, -1))
    far: list[int] = []
    if low < len(steps) - LOOKBACK:
        if first_ok >= 0:
            far.append(first_ok)
        if isinstance(node, Pointwise):
            same = dict.fromkeys(reversed(by_numel.get(_numel(node), ())))
            far += [p for p in same if p >= low and p not in far][:LOOKBACK]
    return near + [p for p in far if p not in near]


def _mark_locals(steps: list[Step], graph: LoopGraph) -> list[Step]:
    from .realize import users

    readers = users(graph)
    nodes = graph.node_map()
    out: list[Step] = []
    for step in steps:
        if isinstance(step, Kernel):
            inside = {m.name for m in step.members}
            local = frozenset(
                m.name
                for m in step.members
                if (m.per_row or isinstance(nodes[m.name], Reduction))
                and all(u in inside for u in readers[m.name])
            )
            step = Kernel(step.name, step.outer, step.inner, step.members, local)
        out.append(step)
    return out

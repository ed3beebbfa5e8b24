"""Decide which loop-IR nodes get a buffer, and inline the rest into their readers.

Takes a `LoopGraph` fresh from lowering; gives an equivalent `LoopGraph` in which

* every `Pointwise` that is not an output, not read by an extern call and not expensive to
  recompute has been substituted into the bodies that load it (so a chain of elementwise ops
  is one expression, computed where it is consumed), and
* every `View` left is one an extern call or the graph output needs: a strided alias of a
  buffer (kept as a `View`, rendered as `as_strided`) or, when the index is not strided (a
  reshape of a transposed tensor), a copying `Pointwise` with the view's name.

Each pass here is a plain function `LoopGraph -> LoopGraph` (STYLE.md item 3). Every decision
not to inline records its reason under `KILN_LOGS=schedule`; each inlining spends one unit of
fuel (`debug.fuel`) so a miscompile can be bisected to one decision.
"""

from __future__ import annotations

import math
from collections import defaultdict

import sympy
import torch

from .. import logs
from ..lower.indexing import index_vars, linearize, view_form
from ..lower.ir import (
    REALIZED,
    Expr,
    Extern,
    ExternItem,
    Load,
    LoopGraph,
    Node,
    Op,
    Pointwise,
    Reduction,
    View,
    buf_refs,
    index_reads,
    loads,
    node_dtype,
    node_size,
    op_count,
    reindex,
    walk,
)
from ..lower.ops import costly_count
from ..lower.symbolic import hint, is_symbolic
from .fuel import Fuel

INLINE_MAX_OPS = 24  # a pointwise read by several nodes is recomputed by each while this cheap
# A pointwise with costly ops (lower.ops.COSTLY) is stored when its readers broadcast it: each
# value would be computed again for every element of the reader that reads it, and this many
# recomputed values more is worth a kernel of its own.
BROADCAST_RECOMPUTE_MIN = 4096
# ...except a one-value pointwise on a device of many short programs (`many_programs`): a
# kernel computes a one-value expression once per program, not per element (Triton: a [1]
# block), so inlined it costs a few instructions a program where stored it costs a kernel of
# its own and a load. GPT-2's AdamW step spent three of its fourteen launches computing
# 1 - beta ** step for each parameter's bias corrections.
# A pointwise that one reader loads at more positions than this (a pooling window) is stored,
# unless it only moves a value: inlined, it would be computed again at every position. The
# fused batch norm, ReLU and 3x3 max-pool of ResNet-50's stem took 300 us on the H200; stored
# and then pooled, 35 + 20 us, as torch.compile does it.
WINDOW_MAX_READS = 4


def users(graph: LoopGraph) -> dict[str, list[str]]:
    """buffer name -> names of the nodes (or "<output>") that read it, in graph order."""
    out: dict[str, list[str]] = defaultdict(list)
    for node in graph.nodes:
        if isinstance(node, (Pointwise, Reduction)):
            for name in dict.fromkeys(ld.buf for ld in loads(node.body)):
                out[name].append(node.name)
        elif isinstance(node, (View, ExternItem)):
            out[node.base].append(node.name)
        elif isinstance(node, Extern):
            for name in dict.fromkeys(r.name for r in buf_refs((node.args, node.kwargs))):
                out[name].append(node.name)
    for o in graph.outputs:
        if isinstance(o, str):
            out[o].append("<output>")
    return out


def eliminate_dead(graph: LoopGraph) -> LoopGraph:
    """Drop nodes nothing reads (inputs stay: they are the calling convention; so do checks,
    extern calls that return nothing and raise on bad input)."""
    readers = users(graph)
    live, keep = set(graph.inputs), []
    for node in reversed(graph.nodes):
        if (
            node.name in live
            or _is_check(node)
            or any(u in live or u == "<output>" for u in readers[node.name])
        ):
            live.add(node.name)
            keep.append(node)
    return graph.replace(reversed(keep))


def _is_check(node: Node) -> bool:
    return isinstance(node, Extern) and node.layouts == (None,) and not node.multi


def index_sources(graph: LoopGraph) -> set[str]:
    """Buffers whose values some body uses as an index (`Indirect` terms read them)."""
    out: set[str] = set()
    for node in graph.nodes:
        if isinstance(node, (Pointwise, Reduction)):
            for e in walk(node.body):
                out.update(a.buf for a in index_reads(e))
    return out


def _storage_index(node: Node, index: tuple) -> sympy.Expr | None:
    """Linear storage position of `node[index]` if its storage layout is known, else None."""
    if isinstance(node, REALIZED):
        lay = node.layout
        return lay.offset + linearize(index, lay.stride)
    if isinstance(node, (Pointwise, Reduction)):
        return linearize(index, node.layout.stride)
    return None


def materialize_views(graph: LoopGraph) -> LoopGraph:
    """Views read by extern calls or returned stay strided aliases when they can, else copy."""
    readers = users(graph)
    nodes = graph.node_map()
    out: list[Node] = []
    for node in graph.nodes:
        if not isinstance(node, View):
            out.append(node)
            continue
        if not readers[node.name]:
            continue
        vs = index_vars(len(node.size))
        pos = _storage_index(nodes[node.base], node.index)
        if pos is not None and view_form(pos, vs, node.size) is not None:
            out.append(node)
            continue
        # The message is bound to a name first: mypy cannot type a lambda whose defaults bind
        # loop variables where it is passed as an argument (mypy#15459).
        copied = lambda n=node: f"{n.name}: view is not strided; copied ({n})"
        logs.log("schedule", copied)
        body = Load(node.base, node.index, _compute(node.dtype))
        out.append(Pointwise(node.name, node.size, node.dtype, body))
    return graph.replace(out)


def _compute(dtype: torch.dtype) -> torch.dtype:
    from ..lower.ir import compute_dtype

    return compute_dtype(dtype)


def _must_realize(
    node: Pointwise,
    readers: list[str],
    nodes: dict[str, Node],
    indices: set[str],
    many_programs: bool = False,
) -> str | None:
    """Why `node` needs its own buffer, or None if it can be inlined into every reader."""
    if "<output>" in readers:
        return "it is a graph output"
    if node.name in indices:
        return "its values are indices another node reads memory at"
    for u in readers:
        if isinstance(nodes[u], (View, Extern)):
            return f"{u} ({type(nodes[u]).__name__.lower()}) reads its memory"
    why = _window_reads(node, readers, nodes)
    if why:
        return why
    if len(readers) > 1 and op_count(node.body) > INLINE_MAX_OPS:
        return (
            f"read by {len(readers)} nodes and costs {op_count(node.body)} ops (> {INLINE_MAX_OPS})"
        )
    if many_programs and _one_value(node):
        return None
    return _broadcast_recompute(node, [nodes[u] for u in readers])


def _one_value(node: Pointwise) -> bool:
    size = math.prod(node.size)
    return not is_symbolic(size) and int(size) == 1


def _window_reads(node: Pointwise, readers: list[str], nodes: dict[str, Node]) -> str | None:
    if isinstance(node.body, Load) or not op_count(node.body):
        return None
    for u in readers:
        reader = nodes[u]
        if isinstance(reader, (Pointwise, Reduction)):
            at = {ld.index for ld in loads(reader.body) if ld.buf == node.name}
            if len(at) > WINDOW_MAX_READS:
                return f"{u} reads it at {len(at)} positions (a window); inlined, each computes it"
    return None


def _loop_size(node: Node) -> int:
    """How many times `node`'s body runs (its elements, times the reduced ones); a symbolic
    count at its hint (storing or inlining is a speed decision, lower/symbolic.py's rule: a
    length known per call once kept Llama's rotary cos and sin inlined into every head)."""
    size = tuple(node_size(node)) + (tuple(node.reduce_size) if isinstance(node, Reduction) else ())
    return hint(math.prod(size))


def _broadcast_recompute(node: Pointwise, readers: list[Node]) -> str | None:
    """A reason to store `node` when readers that broadcast it would compute its costly ops
    again for each element they read it at (Llama's rotary cos and sin, [seq, dim], read by
    every batch and head of q and k: sixteen times each)."""
    costly = costly_count(node.body)
    if not costly:
        return None
    own = _loop_size(node)
    sizes = [_loop_size(r) for r in readers]
    if not any(n >= 2 * own for n in sizes):
        return None
    extra = sum(sizes) - own
    if extra < BROADCAST_RECOMPUTE_MIN:
        return None
    return (
        f"its {costly} costly op(s) would be computed {extra} more times by readers that "
        f"broadcast it ({sum(sizes)} reads of {own} values)"
    )


class _Lifetimes:
    """Where each buffer is last read, in graph order, as inlining moves reads: a pointwise
    inlined into its readers makes its inputs live until its own last reader.

    The rule it gives (`realize_reason`): a pointwise read after an extern call that follows it
    is stored when inlining would keep more of its inputs alive (by half again) than itself.
    Readers on both sides of an extern call cannot share one kernel, so inlining there only
    moves memory: in nanoGPT the residual stream `x + attn(x)`, inlined into every later layer,
    kept every earlier layer's projection output alive to the end of the graph.
    """

    def __init__(self, graph: LoopGraph, readers: dict[str, list[str]]) -> None:
        self.pos = {n.name: k for k, n in enumerate(graph.nodes)}
        end = len(graph.nodes)
        self.last = {
            name: max((end if u == "<output>" else self.pos[u]) for u in us)
            for name, us in readers.items()
        }
        self.externs = [  # bounds checks read two scalars: kernels fuse across them
            (k, n.name)
            for k, n in enumerate(graph.nodes)
            if isinstance(n, Extern) and not _is_check(n)
        ]
        self.pinned = set(graph.inputs) | set(graph.constants)
        self.pinned |= {o for o in graph.outputs if isinstance(o, str)}
        self.nodes = graph.node_map()

    def _bytes(self, name: str) -> int:
        node = self.nodes[name]
        # a speed decision: symbolic sizes count at their hints (lower/symbolic.py)
        return hint(math.prod(node_size(node))) * node_dtype(node).itemsize

    def held_inputs(self, node: Pointwise) -> tuple[int, str | None]:
        """(bytes of `node`'s inputs that inlining keeps alive past their own last reader,
        the extern call they are kept alive across) — (0, None) when no extern intervenes:
        readers before the next extern call can share a kernel with the inputs' producers."""
        end = self.last.get(node.name, self.pos[node.name])
        across = next((n for k, n in self.externs if self.pos[node.name] < k < end), None)
        if across is None:
            return 0, None
        held = sum(self._bytes(b) for b in self._inputs(node) if self.last.get(b, -1) < end)
        return held, across

    def _inputs(self, node: Pointwise) -> set[str]:
        return {ld.buf for ld in loads(node.body)} - self.pinned

    def inline(self, node: Pointwise) -> None:
        end = self.last.get(node.name, self.pos[node.name])
        for b in self._inputs(node):
            self.last[b] = max(self.last.get(b, -1), end)

    def realize_reason(self, node: Pointwise) -> str | None:
        held, across = self.held_inputs(node)
        own = self._bytes(node.name)
        if held > 1.5 * own:
            return (
                f"inlined into its readers after {across} it would keep {held} bytes of its "
                f"inputs alive; stored it holds {own}"
            )
        return None


def inline_pointwise(graph: LoopGraph, fuel: Fuel, many_programs: bool = False) -> LoopGraph:
    """The graph with every pointwise node that needs no buffer of its own (`_must_realize`)
    substituted into its readers; `many_programs`: the device computes one-value expressions
    once per program (`BROADCAST_RECOMPUTE_MIN`'s note)."""
    readers = users(graph)
    nodes = graph.node_map()
    indices = index_sources(graph)
    lifetimes = _Lifetimes(graph, readers)
    inlined: dict[str, Pointwise] = {}
    out: list[Node] = []
    memo: dict[int, tuple[Expr, Expr]] = {}
    for node in graph.nodes:
        if isinstance(node, (Pointwise, Reduction)):
            node = _with_body(node, _substitute_loads(node.body, inlined, memo))
        if isinstance(node, Pointwise):
            why = _must_realize(node, readers[node.name], nodes, indices, many_programs)
            why = why or lifetimes.realize_reason(node)
            if why is None and not fuel.take(f"inline {node.name}"):
                why = "out of fuel"
            if why is None:
                inlined[node.name] = node
                lifetimes.inline(node)
                continue
            if not (isinstance(node.body, Load) or "<output>" in readers[node.name]):
                kept = lambda n=node, w=why: f"{n.name}: kept in memory, {w}"  # mypy#15459
                logs.log("schedule", kept)
        out.append(node)
    return graph.replace(out)


def _with_body(node: Pointwise | Reduction, body: Expr) -> Pointwise | Reduction:
    if body is node.body:
        return node
    if isinstance(node, Pointwise):
        return Pointwise(node.name, node.size, node.dtype, body)
    return Reduction(node.name, node.size, node.dtype, node.reduce_type, node.reduce_size, body)


def _substitute_loads(
    expr: Expr, inlined: dict[str, Pointwise], memo: dict[int, tuple[Expr, Expr]]
) -> Expr:
    """`expr` with every load of an inlined node replaced by that node's body at the index."""
    if not inlined:
        return expr
    key = id(expr)
    hit = memo.get(key)
    if hit is not None and hit[0] is expr:
        return hit[1]
    if isinstance(expr, Load) and expr.buf in inlined:
        src = inlined[expr.buf]
        sub = dict(zip(index_vars(len(src.size)), expr.index))
        result = reindex(src.body, sub)
        if src.dtype in (torch.float16, torch.bfloat16):
            # Round as eager's stored intermediate would be, so fusion does not change results.
            result = Op("to", (Op("to", (result,), src.dtype),), expr.dtype)
    elif isinstance(expr, Op):
        args = tuple(_substitute_loads(a, inlined, memo) for a in expr.args)
        result = expr if args == expr.args else Op(expr.op, args, expr.dtype)
    else:
        result = expr
    memo[key] = (expr, result)
    return result

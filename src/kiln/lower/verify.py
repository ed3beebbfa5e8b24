"""The loop-IR verifier, run between passes when `debug.verify_ir` is on (STYLE.md item 8).

Takes a `LoopGraph`; gives nothing when it is well formed and raises `IRError` naming the node
and the broken rule otherwise. Rules: names are unique; every node refers only to nodes defined
before it; loads (and the reads of `Indirect` index terms) never go through a `View` and use
exactly the loaded buffer's rank; an indirect index reads an integer buffer; a body
uses only its own loop variables (`i*` for pointwise, `i*`/`r*` for reductions); ops have their
arity; outputs name existing buffers.

Why it exists: a scheduler bug that drops a producer or leaves a stale index would otherwise
surface as a wrong number deep inside generated C++.
"""

from __future__ import annotations

from typing import NoReturn

import sympy
import torch

from .indexing import index_vars, reduce_vars
from .ir import (
    Expr,
    Extern,
    ExternItem,
    IndexValue,
    Load,
    LoopGraph,
    Node,
    Op,
    Pointwise,
    Reduction,
    View,
    buf_refs,
    index_reads,
    node_dtype,
    node_size,
    walk,
)
from .ops import OPS


class IRError(AssertionError):
    pass


def _fail(node: object, rule: str) -> NoReturn:
    raise IRError(f"loop IR invalid at {getattr(node, 'name', node)}: {rule}\n  {node}")


def _check_read(node: Node, buf: str, index: tuple, defined: dict[str, Node], allowed: set) -> None:
    src = defined.get(buf)
    if src is None:
        _fail(node, f"loads {buf}, which is not defined before it")
    if isinstance(src, View):
        _fail(node, f"loads through view {buf} (views must be resolved to their base)")
    if len(index) != len(node_size(src)):
        _fail(node, f"loads {buf} with {len(index)} indices, it has rank {len(node_size(src))}")
    for ix in index:
        extra: set[sympy.Basic] = getattr(ix, "free_symbols", set()) - allowed
        if extra:
            _fail(node, f"index uses {sorted(map(str, extra))}, not loop variables here")


def _check_body(node: Node, body: Expr, defined: dict[str, Node], allowed: set) -> None:
    for e in walk(body):
        for ind in index_reads(e):
            _check_read(node, ind.buf, ind.index, defined, allowed)
            dtype = node_dtype(defined[ind.buf])
            if dtype.is_floating_point or dtype == torch.bool:
                _fail(node, f"indirect index reads {ind.buf} of dtype {dtype}")
        if isinstance(e, Load):
            _check_read(node, e.buf, e.index, defined, allowed)
        elif isinstance(e, IndexValue):
            extra = e.expr.free_symbols - allowed
            if extra:
                _fail(node, f"index value uses {sorted(map(str, extra))}")
        elif isinstance(e, Op):
            if OPS.get(e.op) != len(e.args):
                _fail(node, f"op {e.op} with {len(e.args)} arguments")
            if not isinstance(e.dtype, torch.dtype):
                _fail(node, f"op {e.op} has no dtype")


def verify(graph: LoopGraph) -> LoopGraph:
    defined: dict[str, Node] = {}
    for node in graph.nodes:
        if node.name in defined:
            _fail(node, "name defined twice")
        if isinstance(node, Pointwise):
            _check_body(node, node.body, defined, set(index_vars(len(node.size))))
        elif isinstance(node, Reduction):
            allowed = set(index_vars(len(node.size))) | set(reduce_vars(len(node.reduce_size)))
            _check_body(node, node.body, defined, allowed)
        elif isinstance(node, View):
            base = defined.get(node.base)
            if base is None or isinstance(base, View):
                _fail(node, f"view of {node.base}, which is undefined or itself a view")
            if len(node.index) != len(node_size(base)):
                _fail(node, "view index rank differs from its base's rank")
        elif isinstance(node, Extern):
            for ref in buf_refs((node.args, node.kwargs)):
                if ref.name not in defined:
                    _fail(node, f"extern argument {ref.name} is not defined before it")
        elif isinstance(node, ExternItem):
            if not isinstance(defined.get(node.base), Extern):
                _fail(node, f"item of {node.base}, which is not an extern call")
        defined[node.name] = node
    for out in graph.outputs:
        if isinstance(out, str) and out not in defined:
            raise IRError(f"loop IR invalid: output {out} is not defined")
    for name in graph.inputs:
        if name not in defined:
            raise IRError(f"loop IR invalid: input {name} is not defined")
    return graph

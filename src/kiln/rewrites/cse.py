"""Common-subexpression elimination over a functional ATen FX graph, before lowering.

Takes a `torch.fx.Graph` of `torch.ops.aten` calls (what `make_fx` gives).
`common_subexpressions` gives a map from each call node that repeats an earlier one (the same op
on equal arguments, once repeats are replaced by what they repeat) to that earlier node; the
rewrite `merge_repeats` points each repeat's readers at the earlier node and removes the repeat,
so the graph computes each value once.

Why it exists: a traced model repeats work that its Python code spells once per layer. HF
GPT-2 builds the same causal mask, from the same inputs and scalars, in each of its 12 layers:
12 identical 8x1x512x512 kernels where torch.compile builds one.

Never merged, each for a reason:
* anything, in a graph that writes a tensor in place (it is not functional: two equal
  `empty_like` calls then stand for two buffers that later writes fill differently);
* ops that mutate an argument or have side effects (`Node.is_impure`: a mutable schema, an
  assert, a registered effect): merging them would drop an effect;
* random ops (tagged `nondeterministic_seeded`: rand*, dropout, bernoulli, ...): two calls
  draw two different samples;
* a repeat whose value is a graph output, or is viewed by one: eager returns separate
  tensors, and merged outputs would share storage, so writing into one would change the other;
* calls with an argument this pass cannot compare exactly (symbolic sizes, say).

Scalar arguments are equal when their types are and, for floats, their bits are: 1, 1.0 and
True differ, -0.0 and 0.0 differ (1 / x tells them apart), and NaNs merge only bit for bit.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence

import torch
from torch.fx import Graph, Node

from .. import logs
from . import rewrite

# Leaf arguments compared by type and value (hashable, with exact equality).
_PLAIN = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NoKey(Exception):
    """An argument that cannot be compared exactly; the call is not merged."""


def common_subexpressions(graph: Graph) -> dict[Node, Node]:
    """{repeat: the earlier node it repeats}, for the call nodes of `graph` that may merge."""
    if any(_mutates(node) for node in graph.nodes):
        # two equal `empty_like`s each filled in place are two tensors; only values may merge
        logs.log("schedule", "common subexpressions: none merged, the graph writes in place")
        return {}
    escaping = _escaping(graph)
    first: dict[tuple, Node] = {}
    repeats: dict[Node, Node] = {}
    for node in graph.nodes:
        if not _mergeable(node):
            continue
        try:
            key = (node.target, _key(node.args, repeats), _key(node.kwargs, repeats))
        except _NoKey:
            continue
        earlier = first.get(key)
        if earlier is None:
            first[key] = node
        elif node not in escaping:
            repeats[node] = earlier
    if repeats:
        logs.log("schedule", lambda: f"common subexpressions: {_summary(repeats)}")
    return repeats


@rewrite("merge_repeats")
def merge_repeats(gm: torch.fx.GraphModule, example_inputs: Sequence[object] = ()) -> int:
    """Merge calls that repeat earlier equal ones (module doc); gives how many were merged."""
    repeats = common_subexpressions(gm.graph)
    for node, earlier in repeats.items():
        node.replace_all_uses_with(earlier)
    for node in reversed(list(repeats)):  # a repeat read only by later repeats goes first
        gm.graph.erase_node(node)
    if repeats:
        gm.recompile()
    return len(repeats)


def _mergeable(node: Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        return False  # Python functions may do anything
    if torch.Tag.nondeterministic_seeded in op.tags:
        return False
    return not node.is_impure()


def _mutates(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _key(value: object, repeats: dict[Node, Node]) -> object:
    """`value` as a hashable key that is equal only for equal arguments."""
    if isinstance(value, Node):
        return repeats.get(value, value)  # nodes compare by identity
    if isinstance(value, float):
        return (float, struct.pack("<d", value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_key(v, repeats) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _key(v, repeats)) for k, v in sorted(value.items())))
    raise _NoKey(type(value).__name__)


def _escaping(graph: Graph) -> set[Node]:
    """The nodes whose storage a graph output shares: the outputs, and what each view in that
    set views (walked backwards, so a view of a view reaches its base)."""
    out = set()
    for node in graph.nodes:
        if node.op == "output":
            out.update(node.all_input_nodes)
    for node in reversed(graph.nodes):
        if node in out and _is_view(node):
            out.update(node.all_input_nodes)
    return out


def _is_view(node: Node) -> bool:
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _summary(repeats: dict[Node, Node]) -> str:
    counts: dict[str, int] = {}
    for node in repeats:
        name = getattr(node.target, "__name__", str(node.target))
        counts[name] = counts.get(name, 0) + 1
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
    return f"merged {len(repeats)} nodes into earlier equal ones ({ops})"

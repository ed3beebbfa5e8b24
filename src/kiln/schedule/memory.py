"""Memory planning: when each buffer is allocated, freed, and whose storage it reuses.

Takes a `LoopGraph` and its fused steps (`Kernel`, `ExternCall`); gives the final step list
with `Alloc` before each kernel for the buffers it writes, `Alias` for each strided view an
extern call or the output needs, and `Free` after the last step that reads a buffer — inputs
included (not returned ones, not constants): a caller that hands its inputs over (a boxed
call, as the autograd runtime makes for saved activations) then has them freed mid-graph. A buffer
a kernel writes takes the storage of a freed kernel buffer of the same dtype and element count
when one is free (`Alloc.reuse`), so a chain of same-sized intermediates runs in two buffers.
Extern calls whose renderer writes into a given buffer (`out_externs`: matmuls, called with
`out=`) get an `Alloc` too and join the same pool: a transformer's projections and the
kernels between them then cycle through a few buffers instead of asking the allocator for
fresh megabytes each call, which the kernel hands back as page faults on first touch. A
kernel output may instead be stored over a buffer its own kernel reads for the last time
(`Alloc.over`, inplace.py `overwrites`): that buffer then never returns to the pool.

Why it exists: peak memory at most eager's (DESIGN.md §3) needs buffers to die as soon as
their last reader has run, and reuse saves the allocator round trip for large buffers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from .. import logs
from ..lower.ir import (
    Extern,
    ExternItem,
    LoopGraph,
    Node,
    View,
    buf_refs,
    contiguous_strides,
    loads,
    node_dtype,
    node_size,
)
from ..lower.symbolic import hint
from .fusion import ExternCall, Kernel, Step, member_node
from .inplace import overwrites


@dataclass(frozen=True)
class Alloc:
    name: str
    reuse: str | None = None  # the freed buffer whose storage this one takes
    into: str | None = None  # the mutated input this buffer is (inplace.py)
    # the intermediate its own kernel reads for the last time and stores it over (inplace.py
    # `overwrites`): that buffer's storage, still named until the kernel has run
    over: str | None = None

    def __str__(self) -> str:
        if self.into:
            return f"alloc {self.name} (is input {self.into}: written in place)"
        if self.over:
            return f"alloc {self.name} (over {self.over}, read last by its kernel)"
        return f"alloc {self.name}" + (f" (reuses {self.reuse})" if self.reuse else "")


@dataclass(frozen=True)
class Alias:
    name: str  # a `View` node rendered as a strided alias of its base

    def __str__(self) -> str:
        return f"alias {self.name}"


@dataclass(frozen=True)
class Free:
    name: str

    def __str__(self) -> str:
        return f"free {self.name}"


PlanStep = Union[Kernel, ExternCall, Alloc, Alias, Free]  # a schedule's steps, in order


def _reads(step: Step, nodes: dict[str, Node]) -> set[str]:
    if isinstance(step, Kernel):
        inside = {m.name for m in step.members}
        out: set[str] = set()
        for m in step.members:
            out.update(ld.buf for ld in loads(member_node(nodes, m.name).body))
        return out - (inside & step.local)
    node = nodes[step.name]
    assert isinstance(node, Extern)
    return {r.name for r in buf_refs((node.args, node.kwargs))}


def _key(node: Node) -> tuple:
    return node_dtype(node), math.prod(node_size(node))


def writes_into_alloc(node: Node, out_externs: Collection) -> bool:
    """An extern call the renderer gives a planned, contiguous output buffer (`out=`)."""
    return (
        isinstance(node, Extern)
        and node.target in out_externs
        and not node.multi
        and tuple(node.layout.stride) == contiguous_strides(node.layout.size)
    )


def plan_memory(
    graph: LoopGraph,
    steps: Sequence[Step],
    out_externs: frozenset = frozenset(),
    into: Mapping[str, str] | None = None,
) -> tuple[PlanStep, ...]:
    """`into`: {output: the input it is written into} (inplace.py); those take no storage."""
    into = into or {}
    nodes = graph.node_map()
    views = [n for n in graph.nodes if isinstance(n, View)]
    items: defaultdict[str, list[str]] = defaultdict(list)
    for n in graph.nodes:
        if isinstance(n, ExternItem):
            items[n.base].append(n.name)
    # The storage owner of a name: views live on their base's storage.
    owner = {v.name: v.base for v in views}
    returned = {o for o in graph.outputs if isinstance(o, str)}
    pinned = returned | {owner.get(o, o) for o in returned} | set(graph.constants)
    # An input some output is written into (inplace.py) is that output's storage: its name is
    # handed to the writing kernel, which may come after the input's last read.
    pinned |= set(into.values())
    # Freed after their last reader like any buffer (the view keeps the storage alive), but
    # never reused: the view may still be read after that.
    shared = viewed_by_externs(graph, owner)
    inputs = set(graph.inputs)
    last: dict[str, int] = {}
    first: dict[str, int] = {}  # the first step that reads each name
    for k, step in enumerate(steps):
        for name in _reads(step, nodes):
            last[owner.get(name, name)] = k
            last[name] = k
            first.setdefault(name, k)
    for name in list(last):
        if name in items:  # the tuple of an extern call dies with its last item
            last[name] = max([last[name]] + [last.get(i, -1) for i in items[name]])
    produced_at: dict[str, int] = {}
    for k, step in enumerate(steps):
        names = [m.name for m in step.members] if isinstance(step, Kernel) else [step.name]
        names += [i for n in names for i in items.get(n, [])]
        for name in names:
            produced_at[name] = k
    aliases_before, aliases_after = _alias_places(views, first, produced_at)

    local = {m for s in steps if isinstance(s, Kernel) for m in s.local}
    owned = (
        {
            n
            for s in steps
            for n in (
                [m.name for m in s.members if m.name not in s.local]
                if isinstance(s, Kernel)
                else [s.name]
                if writes_into_alloc(nodes[s.name], out_externs)
                else []
            )
        }
        - pinned
        - shared
        - inputs
        - set(into)
    )
    over = overwrites(graph, steps, owned, taken=set(into) | set(into.values()))
    live = _live_bytes(len(steps), nodes, produced_at, last, pinned, local)
    peak = max(live, default=0)

    out: list[PlanStep] = [Alias(v) for v in aliases_after[-1]]
    pool: dict[tuple, list[tuple[str, int]]] = defaultdict(list)  # key -> (name, freed after)
    reusable: set[str] = set()
    overwritten = set(over.values())  # their storage lives on as the buffer stored over them
    for k, step in enumerate(steps):
        if isinstance(step, Kernel):
            written = [m.name for m in step.members if m.name not in step.local]
        else:
            written = [step.name] if writes_into_alloc(nodes[step.name], out_externs) else []
        out.extend(Alias(v) for v in aliases_before[k])
        for name in written:
            if name in into:
                out.append(Alloc(name, into=into[name]))
                continue
            if name in over:
                out.append(Alloc(name, over=over[name]))
                reusable.add(name)
                continue
            reuse = _take(pool[_key(nodes[name])], k, live, peak, _bytes(nodes[name]))
            out.append(Alloc(name, reuse))
            reusable.add(name)
            if reuse:
                logs.log("schedule", f"{name} reuses the storage of {reuse}")
        out.append(step)
        out.extend(Alias(v) for v in aliases_after[k])
        for name in sorted(n for n, at in last.items() if at == k):
            # A view is dropped after its last reader too: it holds its base's storage.
            if name in pinned or (
                name not in produced_at and name not in owner and name not in inputs
            ):
                continue
            out.append(Free(name))
            if name in reusable and name not in shared and name not in overwritten:
                pool[_key(nodes[name])].append((name, k))
    return tuple(out)


def _alias_places(
    views: list[View], first: dict[str, int], produced_at: dict[str, int]
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """(views to alias just before step k, views to alias just after step k; k = -1: first).

    A view is made just before the first step that reads it, not as soon as its base exists: a
    transformer's wrapper transposes every weight matrix (72 views for BERT-base, 0.6 us each)
    and made them all before its first launch, so the device sat idle that long at each call.
    A view no step reads (a returned one) is made once its base exists. `first`: the first
    step reading each name."""
    before: defaultdict[int, list[str]] = defaultdict(list)
    after: defaultdict[int, list[str]] = defaultdict(list)
    for v in views:
        made = produced_at.get(v.base, -1)
        if first.get(v.name, -1) > made:
            before[first[v.name]].append(v.name)
        else:
            after[made].append(v.name)
    return before, after


def _bytes(node: Node) -> int:
    # Peak estimates only choose what reuses what (reuse needs equal element counts as
    # expressions, `_key`): symbolic sizes count at their hints.
    return hint(math.prod(node_size(node))) * node_dtype(node).itemsize


def _live_bytes(
    n: int,
    nodes: dict[str, Node],
    produced_at: dict[str, int],
    last: dict[str, int],
    pinned: set[str],
    local: set[str],
) -> list[int]:
    """Bytes of the graph's own buffers alive during each of the `n` steps when nothing is
    reused: from the step that produces a buffer to its last reader (returned ones and those
    never read: to the end). Views and a kernel's local values hold none. Inputs are left
    out: a module's parameters stay alive whatever the graph frees, so the memory they leave
    behind is no room to keep a buffer in."""
    live = [0] * n
    for name in produced_at:
        node = nodes[name]
        if name in local or isinstance(node, View):
            continue
        if isinstance(node, Extern) and (node.multi or node.layouts[0] is None):
            continue  # a tuple's items hold its memory; a check returns nothing
        start = produced_at.get(name, 0)
        end = n - 1 if name in pinned or name not in last else last[name]
        for t in range(start, end + 1):
            live[t] += _bytes(node)
    return live


def _take(free: list, k: int, live: list[int], peak: int, size: int) -> str | None:
    """A freed buffer for a buffer written at step `k`, the most recently freed first, if
    keeping it alive until then does not raise the plan's peak above `peak` (what it would be
    with no reuse at all): a buffer kept for reuse holds its bytes through the steps between.
    Taken, its bytes are added to those steps."""
    for pos in range(len(free) - 1, -1, -1):
        name, freed = free[pos]
        if max(live[freed + 1 : k], default=0) + size <= peak:
            for t in range(freed + 1, k):
                live[t] += size
            del free[pos]
            return name
    return None


# Ops that return a view of an input although their schema does not say so.
_UNANNOTATED_VIEWS = frozenset({"aten::_unsafe_view"})


def viewed_by_externs(graph: LoopGraph, owner: dict[str, str]) -> set[str]:
    """Buffers an extern call returns a view of (`as_strided`, `split`, ... kept as ATen
    calls): that view shares their storage, so they never go back to the pool for reuse, nor
    into the arena (the view may be returned)."""
    out: set[str] = set()
    for n in graph.nodes:
        if not isinstance(n, Extern):
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is not None and (
            schema.name in _UNANNOTATED_VIEWS
            or any(r.alias_info is not None for r in schema.returns)
        ):
            out.update(owner.get(r.name, r.name) for r in buf_refs((n.args, n.kwargs)))
    return out


__all__ = ["Alias", "Alloc", "ExternCall", "Extern", "Free", "Kernel", "plan_memory"]

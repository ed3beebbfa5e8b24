"""The arena: one block of memory, kept from call to call, that holds a graph's intermediates.

Takes a `LoopGraph` and its planned steps (memory.py); gives an `Arena`: for each buffer the
plan allocates fresh (`Alloc` without `reuse`) and that never escapes the call, a byte offset
into one block, and the block's size. Buffers that take a freed buffer's storage (`Alloc.reuse`)
stay on it, so a reuse chain is one slot of the arena; slots whose lifetimes do not overlap
share bytes (first fit, in order of allocation), so the block is about the plan's peak.

What may not live there: graph outputs and the buffers they are views of (the caller keeps
them), and buffers an extern call returns a view of (that view might be returned). Their
chains are allocated as before.

Symbolic sizes: slots whose bytes depend on the call's sizes are chosen at the hints and
stacked at offsets that are right for every size (`_stack`: symbols the wrapper computes each
call); the block is then sized per call and replaced by a larger one when a call needs more.

Why it exists: a graph that asks the allocator for its intermediates each call gets memory the
C library returned to the OS at the end of the last call, and the OS hands every page back
zeroed, on first touch: on BERT that was about a thousand page faults a call (16.4 -> 14.4 ms
a call single-threaded without them), and whether it happened changed with the allocation
history of the process. Kept, the block is written in place every call. The costs: the block
stays allocated between calls, like a parameter (so a profiler's count of one call's
allocations does not show it), and it may raise the call's peak a little (`PEAK_SLACK`).

The blocks themselves come from `runtime.arenas.new_block` (the wrapper's `_new_arena`), which
keeps a weak reference to each: `held_bytes()` there is what the process's arenas hold now, the
figure a memory measure adds to what one call allocates (`kiln bench`'s CPU peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from ..lower.hints import hint
from ..lower.indexing import FloorDiv
from ..lower.ir import Extern, ExternItem, LoopGraph, Node, View, node_dtype, node_size
from .fusion import ExternCall
from .memory import Alloc, Free, PlanStep, viewed_by_externs

Slot = tuple[int, int, str, int]  # (first step, last step, name, bytes)

ALIGN = 64  # bytes: every slot starts on a cache line (and suits every dtype's view)
# How far the arena may raise the call's peak (a fraction of the graph's own buffers at their
# peak) when an arena within the peak holds nothing, and then only with slots of LARGE_SLOT
# bytes or more (`_choose` says why): BERT's arena is empty without it (a slot held for the
# whole call is, at some step, memory the plan had freed); an eighth holds its 2 MiB
# intermediates and removes the faults.
PEAK_SLACK = 0.125
LARGE_SLOT = 1 << 20
REMOVE_TRIES = 8  # slots tried for removal per round (bounds planning time on large graphs)


@dataclass(frozen=True)
class Arena:
    offsets: dict[str, Any] = field(default_factory=dict)  # buffer name -> byte offset in the block
    nbytes: Any = 0
    # Symbolic sizes: the offsets and `nbytes` are symbols (`ao0`, ...) the wrapper computes each
    # call from these definitions, in order ({symbol: expression over sizes and earlier ones}).
    defs: dict = field(default_factory=dict)

    @property
    def grows(self) -> bool:
        """Does the block's size change with the call's sizes (symbolic sizes)?"""
        return bool(self.defs)

    def __str__(self) -> str:
        slots = ", ".join(f"{n}@{o}" for n, o in self.offsets.items())
        defs = "".join(f"; {k} = {v}" for k, v in self.defs.items())
        return f"arena {self.nbytes} bytes: {slots}{defs}"


def _span_bytes(node: Node) -> int:
    """Bytes from a buffer's first element to one past its last, as it is laid out."""
    assert not isinstance(node, View), "a view holds no slot: its base does"
    size, stride = tuple(node_size(node)), tuple(node.layout.stride)
    if any(s == 0 for s in size):
        return 0
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    return span * node_dtype(node).itemsize


def plan_arena(graph: LoopGraph, steps: Sequence[PlanStep]) -> Arena:
    slots, fixed = _slots(graph, steps)
    # A slot of one cache line gains nothing here (malloc serves it from its small bins, never
    # from fresh pages) and would be held between calls: an optimizer step's one-value bias
    # corrections stay per-call allocations, so a finished step holds what eager's holds.
    fixed += [s for s in slots if s not in fixed and isinstance(s[3], int) and s[3] <= ALIGN]
    if all(isinstance(s[3], int) for s in slots):
        return _choose(fixed, [s for s in slots if s not in fixed], len(steps))
    # Symbolic sizes: which slots go in is chosen at the hints (a memory decision), and they
    # are stacked at offsets that hold for every size (`_stack`); the block grows when a call
    # needs more.
    hinted = {s[2]: (s[0], s[1], s[2], hint(s[3])) for s in slots}
    fixed_h = [hinted[s[2]] for s in fixed]
    chosen = _choose(fixed_h, [h for n, h in hinted.items() if h not in fixed_h], len(steps))
    return _stack([s for s in slots if s[2] in chosen.offsets])


def plan_small_arena(graph: LoopGraph, steps: Sequence[PlanStep], max_bytes: int) -> Arena:
    """The arena of a device whose intermediates are otherwise allocated per call (a GPU's
    caching allocator gives memory back fast): only the slots of at most `max_bytes` bytes of
    static size that never escape, which add nothing worth counting to the peak.

    Why: an optimizer step over N parameters computes a few one-value intermediates per
    parameter (bias corrections, step sizes); GPT-2's AdamW step made about a hundred
    `empty_strided` calls for them each step, most of the host time of a step whose kernels
    are few."""
    slots, fixed = _slots(graph, steps)
    small = [s for s in slots if s not in fixed and isinstance(s[3], int) and 0 < s[3] <= max_bytes]
    return Arena(*_pack(small)) if small else Arena()


def _slots(graph: LoopGraph, steps: Sequence[PlanStep]) -> tuple[list, list]:
    """(every slot, those that may not live in an arena): one slot per reuse chain of fresh
    allocations, and one per buffer an extern call allocates (module doc)."""
    nodes = graph.node_map()
    owner = {n.name: n.base for n in graph.nodes if isinstance(n, View)}
    returned = {o for o in graph.outputs if isinstance(o, str)}
    escapes = returned | {owner.get(o, o) for o in returned}
    escapes |= viewed_by_externs(graph, owner)
    chain: dict[str, str] = {}  # buffer -> the first buffer of its reuse chain
    start: dict[str, int] = {}
    freed: dict[str, int] = {}
    members: dict[str, list[str]] = {}
    for k, step in enumerate(steps):
        if isinstance(step, Alloc):
            if step.into:  # an input's own memory
                continue
            prior = step.reuse or step.over
            root = chain[prior] if prior else step.name
            chain[step.name] = root
            members.setdefault(root, []).append(step.name)
            start.setdefault(root, k)
        elif isinstance(step, ExternCall):  # ATen allocates these: they are never slots
            for name in [step.name, *(i.name for i in _items(graph, step.name))]:
                if name not in chain and _holds_memory(nodes[name]):
                    members[name] = [name]
                    start[name] = k
        elif isinstance(step, Free):
            freed[step.name] = k
    slots = [  # a member never freed holds its bytes to the end of the call
        (start[root], max(freed.get(n, len(steps)) for n in names), root, _slot_bytes(nodes, names))
        for root, names in members.items()
    ]
    fixed = [s for s in slots if s[2] not in chain or any(n in escapes for n in members[s[2]])]
    return slots, fixed


def _items(graph: LoopGraph, name: str) -> list[ExternItem]:
    return [n for n in graph.nodes if isinstance(n, ExternItem) and n.base == name]


def _holds_memory(node: Node) -> bool:
    return not (isinstance(node, Extern) and (node.multi or node.layouts[0] is None))


def _choose(fixed: list[Slot], candidates: list[Slot], n: int) -> Arena:
    """The arena that does not raise the call's peak, if it holds anything; else the one of the
    large slots that raises it by at most `PEAK_SLACK` (the small ones stay outside).

    Why not the slack everywhere: the peak a plan sees is not the whole call's (parameters,
    and what ATen allocates inside an extern call, are not in it), and measured against
    eager's peak (`kiln bench`, CPU suite) the slack put nanoGPT's and the deep MLP's peaks
    above eager's, with no steady gain in speed: nanoGPT's page faults came and went with or
    without it, and the MLP's intermediates (half a MiB) never faulted. BERT's arena is empty
    without the slack, and its 2 MiB intermediates then fault every call."""
    within = _fit(fixed, candidates, n, slack=0.0)
    if within.nbytes:
        return within
    large = [s for s in candidates if s[3] >= LARGE_SLOT]
    return _fit(fixed + [s for s in candidates if s not in large], large, n, PEAK_SLACK)


def _fit(fixed: list[Slot], candidates: list[Slot], n: int, slack: float | None = None) -> Arena:
    """The arena of the candidate slots that raises the call's peak by at most `slack`
    (default `PEAK_SLACK`).

    A buffer in the arena holds its bytes for the whole call, not from its allocation to its
    last reader: next to the buffers that stay outside (outputs, what ATen allocates) it can
    raise the peak (nanoGPT's logits are allocated when every intermediate is dead). The
    bound: the packed arena plus the most that is ever alive outside it stays within the slack
    over the peak of all of them at their own times. Two greedy searches (grow from none,
    shrink from all; neither finds the best on every graph) and the one holding more wins."""

    def live(group: list[Slot]) -> list[int]:
        out = [0] * (n + 1)
        for begin, finish, _, size in group:
            for t in range(begin, min(finish, n) + 1):
                out[t] += size
        return out

    outside = live(fixed)
    slack = PEAK_SLACK if slack is None else slack
    bound = max(a + b for a, b in zip(outside, live(candidates))) * (1 + slack)

    def cost(chosen: list[Slot]) -> int:
        others = [s for s in candidates if s not in chosen]
        return _pack(chosen)[1] + max(a + b for a, b in zip(outside, live(others)))

    grown: list[Slot] = []  # add slots, largest first, each that keeps within the bound
    for slot in sorted(candidates, key=lambda s: (-s[3], s[0], s[2])):
        if cost(grown + [slot]) <= bound:
            grown.append(slot)
    shrunk = list(candidates)  # or start from all and drop the most helpful of the largest
    while shrunk and cost(shrunk) > bound:
        largest = sorted(shrunk, key=lambda s: (-s[3], s[0], s[2]))[:REMOVE_TRIES]
        shrunk.remove(min(largest, key=lambda s: cost([c for c in shrunk if c is not s])))
    chosen = max(grown, shrunk, key=lambda group: sum(s[3] for s in group))
    return Arena(*_pack(chosen)) if chosen else Arena()


def _slot_bytes(nodes: dict[str, Node], names: list[str]) -> Any:
    spans = [_span_bytes(nodes[n]) for n in names]
    if all(isinstance(b, int) for b in spans):
        return math.ceil(max(spans) / ALIGN) * ALIGN
    spans = [sympy.expand(b) for b in spans]
    span = spans[0] if all(b == spans[0] for b in spans) else sympy.Max(*spans)
    return ALIGN * FloorDiv(span + ALIGN - 1, ALIGN)


def _stack(slots: list) -> Arena:
    """Offsets for slots with symbolic bytes, right for every size: each slot, largest (at the
    hints) first, sits above every slot already placed whose steps overlap its own (no gap is
    reused: a gap at one size may be too small at another). Each offset is a symbol defined
    from earlier ones, so the wrapper computes each once per call. No slot: no arena (the
    wrapper then neither takes nor returns a block)."""
    if not slots:
        return Arena()
    placed: list = []  # (offset symbol, bytes, first, last)
    offsets: dict[str, Any] = {}
    defs: dict = {}
    for k, (begin, finish, name, size) in enumerate(
        sorted(slots, key=lambda s: (-hint(s[3]), s[0], s[2]))
    ):
        if not isinstance(size, int):  # each slot's bytes computed once a call
            nbytes = sympy.Symbol(f"ab{k}", integer=True, nonnegative=True)
            defs[nbytes] = size
            size = nbytes
        ends = [off + nb for off, nb, b, f in placed if b <= finish and begin <= f]
        sym = sympy.Symbol(f"ao{k}", integer=True, nonnegative=True)
        defs[sym] = _max(ends)
        placed.append((sym, size, begin, finish))
        offsets[name] = sym
    top = sympy.Symbol("ao_bytes", integer=True, nonnegative=True)
    defs[top] = _max([off + nb for off, nb, _, _ in placed])
    return Arena(offsets, top, defs)


def _max(values: list) -> Any:
    if not values:
        return sympy.Integer(0)
    return sympy.Max(*values, evaluate=False) if len(values) > 1 else values[0]


def _pack(slots: list[Slot]) -> tuple[dict[str, int], int]:
    """Offsets for (first step, last step, name, bytes) slots: largest first, each at the
    lowest offset clear of the slots already placed whose steps overlap its own (the greedy
    by size that tensor runtimes use; within a few percent of the peak on kiln's graphs)."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, first, last)
    offsets: dict[str, int] = {}
    top = 0
    for begin, finish, name, size in sorted(slots, key=lambda s: (-s[3], s[0], s[2])):
        at = 0
        for off, nbytes, _, _ in sorted(p for p in placed if p[2] <= finish and begin <= p[3]):
            if off - at >= size:
                break
            at = max(at, off + nbytes)
        placed.append((at, size, begin, finish))
        offsets[name] = at
        top = max(top, at + size)
    return offsets, top

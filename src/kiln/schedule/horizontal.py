"""Horizontal fusion: independent pointwise kernels combined into one kernel.

Takes a `LoopGraph` and its fused steps (fusion.py) and the device's argument cap; gives the
steps with runs of independent pointwise kernels replaced by one `Kernel` whose `parts` are
those kernels (its `members` are theirs, in order, so lifetimes, in-place planning and the
wrapper see the members as of any kernel). A renderer runs the parts side by side in one
launch: the C++ one in one OpenMP parallel region whose threads share out each part's loop
with no barrier between parts (codegen/cpp/horizontal.py), the Triton one as one kernel whose
program ids are split into a static range per part (codegen/triton/horizontal.py).

Why it exists: a foreach optimizer step is the same few ops over every parameter. Vertical
fusion makes one kernel per parameter size (a GPT-2 AdamW step: 36 kernels, one per distinct
shape), so the step pays one launch (or one thread fork and join, and one ctypes call, on the
CPU) per shape, most of them over a few thousand elements. Grouped, it pays a few.

Rules (each refusal is logged under `KILN_LOGS=schedule`, each grouping spends one unit of
fuel):
* a part is a kernel of pointwise members only (no reductions, no per-row members, no values
  kept inside the kernel), of more than zero elements, that reads nothing transposed (such a
  kernel is tiled alone on the GPU); graphs of symbolic sizes are not grouped;
* parts of one group have the same member dtypes (one group per dtype signature);
* a kernel joins a group only if every buffer it reads is computed before the group's first
  part: it never depends on a part (the parts run at once), and moving it up to that place
  moves no read before its write;
* groups never span an extern call (moved across one, a kernel's buffers would live across
  the call, raising its peak; fusion.py keeps work from moving back across calls likewise);
* a group's distinct buffer arguments stay within the device's cap (`Capabilities.horizontal`:
  a C function's or a Triton kernel's argument list, whose launch cost grows with it).
Parts of very different sizes may share a group: each part's work is divided among all
threads (CPU) or programs (GPU) of the launch, never one part to one thread, so a large part
does not leave the others' workers idle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import logs
from ..lower.ir import ExternItem, LoopGraph, Node, Pointwise, View, dtype_str, loads
from ..lower.symbolic import is_symbolic
from .fuel import Fuel
from .fusion import ExternCall, Kernel, Step, member_node, transposed_read


@dataclass
class _Group:
    first: int  # position of its first part among the steps
    key: tuple
    parts: list[int] = field(default_factory=list)
    args: set = field(default_factory=set)


def group_horizontally(
    graph: LoopGraph,
    steps: tuple[Step, ...],
    max_args: int,
    fuel: Fuel,
    mutations: Mapping[str, str] | None = None,
) -> tuple[Step, ...]:
    """`steps` with groups of independent pointwise kernels combined (module doc);
    `max_args` <= 0: no grouping (a device whose renderer has no horizontal kernels);
    `mutations` ({output: input}) as `kernel_args` counts them."""
    if max_args <= 0:
        return steps
    if graph.symbolic:
        # a static kernel may still index a buffer through symbolic strides; the renderers'
        # horizontal kernels take no size arguments
        logs.log("schedule", "no horizontal groups: the graph's sizes are symbolic")
        return steps
    nodes = graph.node_map()
    step_of = _step_of(steps, nodes)
    groups: list[_Group] = []
    open_: list[_Group] = []
    for pos, step in enumerate(steps):
        if isinstance(step, ExternCall):
            open_ = []  # no group spans an extern call
            continue
        assert isinstance(step, Kernel)
        why = not_a_part(step, nodes)
        if why:
            logs.log("schedule", f"{step.name} not grouped: {why}")
            continue
        reads = kernel_reads(step, nodes)
        args = kernel_args(step, nodes, mutations, reads)
        ready = max((step_of[b] for b in reads if b in step_of), default=-1)
        key = dtype_key(step, nodes)
        joined = None
        for g in open_:
            why = _refusal(step, g, key, ready, args, max_args, steps, reads, step_of)
            if not why and not fuel.take(f"group {step.name} with {steps[g.first].name}"):
                why = "out of fuel"
            if why:
                logs.log("schedule", f"{step.name} not grouped with {steps[g.first].name}: {why}")
                continue
            joined = g
            break
        if joined is None:
            joined = _Group(pos, key)
            groups.append(joined)
            open_.append(joined)
        joined.parts.append(pos)
        joined.args |= args
    return _combine(steps, [g for g in groups if len(g.parts) > 1])


def _step_of(steps: tuple[Step, ...], nodes: dict[str, Node]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pos, step in enumerate(steps):
        if isinstance(step, Kernel):
            out.update((m.name, pos) for m in step.members)
        else:
            out[step.name] = pos
    for node in nodes.values():  # an item of a tuple-returning call is ready with the call
        if isinstance(node, ExternItem) and node.base in out:
            out[node.name] = out[node.base]
    return out


def kernel_reads(kernel: Kernel, nodes: dict[str, Node]) -> set[str]:
    """Buffers the kernel reads from outside itself; a view counts as its base buffer."""
    inside = {m.name for m in kernel.members}
    out: set[str] = set()
    for m in kernel.members:
        for ld in loads(member_node(nodes, m.name).body):
            name = ld.buf
            while isinstance(nodes.get(name), View):
                out.add(name)
                name = nodes[name].base  # type: ignore[union-attr]
            if name not in inside:
                out.add(name)
    return out


def kernel_args(
    kernel: Kernel,
    nodes: dict[str, Node],
    mutations: Mapping[str, str] | None = None,
    reads: set[str] | None = None,
) -> set[str]:
    """The buffers the kernel takes as arguments; the new value of a mutated input
    (`mutations`: {output: input}) counts as the input, which it is most often written into
    (inplace.py) and then passed as (the Triton renderer passes the one pointer once). Where
    the write is refused, the kernel takes one argument more than counted."""
    mutations = mutations or {}
    reads = kernel_reads(kernel, nodes) if reads is None else reads
    return {mutations.get(b, b) for b in reads | {m.name for m in kernel.members}}


def dtype_key(kernel: Kernel, nodes: dict[str, Node]) -> tuple[str, ...]:
    """The member dtypes a group's parts share."""
    return tuple(sorted({dtype_str(member_node(nodes, m.name).dtype) for m in kernel.members}))


def not_a_part(kernel: Kernel, nodes: dict[str, Node]) -> str:
    """Why `kernel` cannot be a part of a horizontal kernel ("" when it can); the graph's
    symbolic sizes are checked apart (`group_horizontally`)."""
    if kernel.parts:
        return "already a group"
    if kernel.local:
        return "it keeps values inside itself"
    for m in kernel.members:
        node = nodes[m.name]
        if not isinstance(node, Pointwise) or m.per_row:
            return f"{m.name} is not an element-wise member"
        if any(is_symbolic(s) for s in node.size):
            return "its sizes are symbolic"
        if transposed_read(node, nodes):
            return f"{m.name} reads a buffer transposed (a tiled kernel of its own)"
    numel = kernel.outer * kernel.inner
    if is_symbolic(numel) or numel == 0:
        return "it computes no elements"
    return ""


def _refusal(
    kernel: Kernel,
    g: _Group,
    key: tuple,
    ready: int,
    args: set,
    max_args: int,
    steps: tuple[Step, ...],
    reads: set,
    step_of: dict[str, int],
) -> str:
    if key != g.key:
        return f"member dtypes {', '.join(key)} differ from the group's {', '.join(g.key)}"
    if ready >= g.first:
        late = next(b for b in sorted(reads) if step_of.get(b, -1) == ready)
        where = "a part of the group" if ready in g.parts else "a later step"
        return f"reads {late}, computed by {steps[ready].name} ({where})"
    if len(g.args | args) > max_args:
        return f"the group would take more than {max_args} buffer arguments"
    return ""


def _combine(steps: tuple[Step, ...], groups: list[_Group]) -> tuple[Step, ...]:
    """The steps with each group's parts replaced by one kernel at its first part's place."""
    at = {g.first: g for g in groups}
    moved = {p for g in groups for p in g.parts}
    out: list[Step] = []
    for pos, step in enumerate(steps):
        if pos in at:
            parts = tuple(steps[p] for p in at[pos].parts)
            out.append(horizontal_kernel(parts))  # type: ignore[arg-type]
            names = ", ".join(p.name for p in parts)
            logs.log("schedule", f"{out[-1].name}: horizontal group [{names}]")
        elif pos not in moved:
            out.append(step)
    return tuple(out)


def horizontal_kernel(parts: tuple[Kernel, ...]) -> Kernel:
    """One kernel running `parts` side by side: named after its first part, its members
    theirs in order, one row over all of their elements."""
    members = tuple(m for p in parts for m in p.members)
    total = sum(p.outer * p.inner for p in parts)
    return Kernel(parts[0].name, 1, total, members, frozenset(), parts)

"""Wide kernels split into their independent parts.

Takes a `LoopGraph` and its fused steps (fusion.py) and the device's argument cap (the one
horizontal.py keeps a group within); gives the steps with every kernel of more buffer
arguments than the cap split into kernels of its independent member sets (members that read no
value another set computes), each a kernel of its own at the wide kernel's place, so that
horizontal grouping (horizontal.py) can run them side by side, each in its own programs.

Why it exists: fusion puts the same op on tensors of one size into one kernel (fusion.py's
same-size candidates), which a foreach optimizer step over many tensors of one shape makes a
single straight-line kernel of hundreds of buffers: GPT-2 small's AdamW step had one of 594
arguments over its 74 vectors of 768 elements. Triton's build time grows faster than a
kernel's length (that kernel took 37 s to build for sm_90, twelve tensors' worth 1 s), and its
768 elements ran as one program on one multiprocessor. Split, each tensor's update is a part
of a horizontal kernel of its own program ids.

On a device of many short programs (a GPU: `Capabilities.many_programs`) every such kernel
whose sets can be horizontal parts is split, within the cap too: one after another in each
program, the sets made each program move their bytes all together (twelve tensors' updates,
344 KB a program for GPT-2's 768 x 3072 AdamW tensors), so a launch was a few long programs
whose last wave left most of the device idle (twelve 2304-element vectors ran as three
programs, 2304 x 768 matrices as 2304 programs, one wave and a ninth); as parts, each
tensor's blocks are programs of their own.

Elsewhere (the CPU) a kernel within the cap keeps its members, reordered so that each
independent set's members come one after another: in graph order, a foreach step's kernel
computed every tensor's first moment, then every second moment, then every update, and kept
each tensor's values live across all the others' (GPT-2's twelve 768 x 3072 tensors in one
kernel: 255 registers and 712 bytes of spills a thread on sm_90, built for 2 warps; 218
registers at 4); a set at a time, only one tensor's values are live at once.

Rules: only kernels of pointwise members are split or reordered (a reduction's rows are not
independent work); a member stays with every member it reads and every member that reads it
(through views too), so each new kernel computes what it did before, in the same order; sets are
never merged back past the cap, each is its own kernel (horizontal.py packs them). A kernel at
or under the cap is only reordered (but for `many_programs`); a cap of 0 (a device without
horizontal kernels) leaves every kernel alone. Each split is logged under `KILN_LOGS=schedule`.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import logs
from ..lower.ir import LoopGraph, Node, Pointwise, View, loads
from .fusion import Kernel, Step
from .horizontal import dtype_key, kernel_args, not_a_part


def split_wide(
    graph: LoopGraph,
    steps: tuple[Step, ...],
    max_args: int,
    many_programs: bool = False,
    mutations: Mapping[str, str] | None = None,
) -> tuple[Step, ...]:
    """`steps` with kernels over `max_args` buffer arguments split (module doc), every kernel
    of independent sets split on a device of `many_programs`; arguments are counted as
    horizontal.py `kernel_args` counts them (`mutations`: {output: input})."""
    if max_args <= 0:
        return steps
    nodes = graph.node_map()
    out: list[Step] = []
    split = False
    for step in steps:
        if not isinstance(step, Kernel) or step.parts:
            out.append(step)
            continue
        pieces = _independent(step, nodes)
        if len(pieces) == 1:
            out.append(step)
            continue
        args = len(kernel_args(step, nodes, mutations))
        if args <= max_args and not (many_programs and _groupable(graph, pieces, nodes)):
            # one kernel, its sets one after another
            members = tuple(m for p in pieces for m in p.members)
            out.append(Kernel(step.name, step.outer, step.inner, members, step.local))
            continue
        split = True
        why = (
            f"it would take {args} buffer arguments, more than the device's {max_args}"
            if args > max_args
            else "each set runs in programs of its own (a device of many short programs)"
        )
        logs.log("schedule", f"{step.name} split into {len(pieces)} independent kernels: {why}")
        out += pieces
    return tuple(_renumbered(out)) if split else tuple(out)


def _independent(kernel: Kernel, nodes: dict[str, Node]) -> list[Kernel]:
    """The kernel's members in sets that share no value, one kernel each, in the order of each
    set's first member; the kernel itself if it holds anything but pointwise members."""
    if not all(isinstance(nodes[m.name], Pointwise) for m in kernel.members):
        return [kernel]
    parent = {m.name: m.name for m in kernel.members}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for m in kernel.members:
        for ld in loads(nodes[m.name].body):  # type: ignore[union-attr]
            name = ld.buf
            while isinstance(nodes.get(name), View) and name not in parent:
                name = nodes[name].base  # type: ignore[union-attr]
            if name in parent:
                parent[root(m.name)] = root(name)
    sets: dict[str, list] = {}
    for m in kernel.members:
        sets.setdefault(root(m.name), []).append(m)
    if len(sets) == 1:
        return [kernel]
    return [
        Kernel(
            kernel.name,
            kernel.outer,
            kernel.inner,
            tuple(ms),
            kernel.local & {m.name for m in ms},
        )
        for ms in sets.values()
    ]


def _groupable(graph: LoopGraph, pieces: list[Kernel], nodes: dict[str, Node]) -> bool:
    """Could horizontal.py run the pieces side by side as parts (one group: parts of one
    member-dtype signature)? Else split they would be a launch each (a graph of symbolic sizes
    has no horizontal kernels)."""
    if graph.symbolic or any(not_a_part(p, nodes) for p in pieces):
        return False
    return len({dtype_key(p, nodes) for p in pieces}) == 1


def _renumbered(steps: list[Step]) -> list[Step]:
    """Kernels named kernel0, kernel1, ... in order again (the pieces of a split share its
    name); nothing before this pass refers to a kernel by its name."""
    out: list[Step] = []
    n = 0
    for s in steps:
        if isinstance(s, Kernel):
            s = Kernel(f"kernel{n}", s.outer, s.inner, s.members, s.local, s.parts)
            n += 1
        out.append(s)
    return out

"""In-place outputs: the new value of a mutated input written straight into that input.

Takes a `LoopGraph`, its fused steps and `mutations` ({output buffer: input name}: the output
is the value the runtime would copy into that input after the call); gives the outputs whose
kernel may store into the input's own memory, {output: input}. memory.py then gives such an
output `Alloc(into=input)`: the wrapper hands the input itself to the kernel and returns it,
and the runtime (autograd/runtime.py) sees the input come back and copies nothing.

Why it exists: an optimizer step mutates every parameter and two or three state tensors per
parameter. Written to fresh buffers and copied back, each step read and wrote all of that
memory twice more, and made one allocation and one copy call per tensor (AdamW over GPT-2's
148 parameters: 592 copies a step).

An output is written in place only when no read of the old value can come after the write:
every node that reads the input (or a view of it) runs in an earlier step, or is a pointwise
member of the writing kernel placed no later than the output and reading the input at the
element it computes itself (so each element is read before it is overwritten), and no member
after a per-row member or reduction (a later pass over the row, where an earlier member's
element value is recomputed from the inputs) reads it, directly or through members. The output
must be a pointwise kernel member (not kernel-local), returned once, read in no other part
of a horizontal kernel (horizontal.py: the parts run at once), with exactly the input's
size, strides and dtype, and the input must not be returned itself. Each refusal is logged
under `KILN_LOGS=schedule`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from .. import logs
from ..lower.indexing import index_vars
from ..lower.ir import Input, LoopGraph, Node, Pointwise, View, loads
from .fusion import Kernel, Step, member_node
from .realize import users


def inplace_outputs(
    graph: LoopGraph, steps: Sequence[Step], mutations: Mapping[str, str]
) -> dict[str, str]:
    if not mutations:
        return {}
    nodes = graph.node_map()
    readers = users(graph)
    step_of: dict[str, int] = {}
    for k, step in enumerate(steps):
        for name in [m.name for m in step.members] if isinstance(step, Kernel) else [step.name]:
            step_of[name] = k
    returned = [o for o in graph.outputs if isinstance(o, str)]
    out: dict[str, str] = {}
    for name, inp in mutations.items():
        why = _refusal(name, inp, nodes, readers, steps, step_of, returned)
        if why:
            logs.log("schedule", f"{name} is not written into input {inp}: {why}")
            continue
        logs.log("schedule", f"{name} is written into input {inp} (no copy back)")
        out[name] = inp
    return out


def _refusal(
    name: str,
    inp: str,
    nodes: dict[str, Node],
    readers: dict[str, list[str]],
    steps: Sequence[Step],
    step_of: dict[str, int],
    returned: list[str],
) -> str:
    node, source = nodes.get(name), nodes.get(inp)
    if not isinstance(node, Pointwise) or name not in step_of:
        return "not computed by a kernel"
    if not isinstance(source, Input):
        return "not an input"
    if (tuple(node.layout.size), tuple(node.layout.stride), node.layout.dtype) != (
        tuple(source.layout.size),
        tuple(source.layout.stride),
        source.layout.dtype,
    ) or source.layout.offset != 0:
        return "its layout differs from the input's"
    if returned.count(name) != 1:
        return "returned more than once"
    at = step_of[name]
    kernel = steps[at]
    assert isinstance(kernel, Kernel)
    if name in kernel.local:
        return "kept inside its kernel"
    order = [m.name for m in kernel.members]
    again = _read_in_a_later_pass(kernel, inp, nodes)
    if again:
        return f"{again} reads it again in a later pass of {kernel.name}"
    for reader, via in _readers(inp, nodes, readers):
        if reader == "<output>":
            return f"the input is returned ({via})"
        k = step_of.get(reader)
        if k is None:  # a view, or a node fused into nothing: read at no known step
            return f"{reader} reads it outside any kernel"
        if k < at:
            continue
        if k > at:
            return f"{reader} reads it after {kernel.name} writes it"
        if kernel.parts and _part(kernel, reader) != _part(kernel, name):
            # the parts of a horizontal kernel run at once: no order between them
            return f"{reader} reads it in another part of {kernel.name} (horizontal.py)"
        if order.index(reader) > order.index(name):
            return f"{reader} reads it after {name} in {kernel.name}"
        if via != inp or not _reads_own_element(member_node(nodes, reader), inp, node):
            return f"{reader} reads it at another element than it computes"
    return ""


def _read_in_a_later_pass(kernel: Kernel, inp: str, nodes: dict[str, Node]) -> str:
    """A member that comes after a per-row member or a reduction of `kernel` (a later pass
    over the row) and reads `inp`, directly or through earlier members (a renderer recomputes
    an element value of an earlier pass from its inputs rather than re-reading what the
    kernel stored: codegen/triton/renderer.py); "" if none. The first pass's store into the
    input would have overwritten what that recomputation reads."""
    names = {m.name for m in kernel.members}
    reads_inp: dict[str, bool] = {}

    def reads(name: str) -> bool:
        if name not in reads_inp:
            reads_inp[name] = False  # (no cycles among members; guards the recursion)
            bufs = [ld.buf for ld in loads(member_node(nodes, name).body)]
            reads_inp[name] = any(b == inp or (b in names and reads(b)) for b in bufs)
        return reads_inp[name]

    later = False
    for m in kernel.members:
        if later and reads(m.name):
            return m.name
        later = later or m.per_row or not isinstance(nodes[m.name], Pointwise)
    return ""


def _part(kernel: Kernel, name: str) -> int:
    return next(i for i, p in enumerate(kernel.parts) if any(m.name == name for m in p.members))


def _readers(
    inp: str, nodes: dict[str, Node], readers: dict[str, list[str]]
) -> Iterator[tuple[str, str]]:
    """(reader, the name it reads) for every node reading `inp` or a view of it."""
    todo, seen = [inp], set()
    while todo:
        cur = todo.pop()
        for r in readers.get(cur, ()):
            if isinstance(nodes.get(r), View):
                if r not in seen:
                    seen.add(r)
                    todo.append(r)
                yield r, cur  # a view is read at no known step: refused unless dead
            else:
                yield r, cur


def _reads_own_element(reader: Node, inp: str, out: Pointwise) -> bool:
    if not isinstance(reader, Pointwise) or tuple(reader.size) != tuple(out.size):
        return False
    own = index_vars(len(reader.size))
    return all(tuple(ld.index) == tuple(own) for ld in loads(reader.body) if ld.buf == inp)

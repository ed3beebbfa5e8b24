"""In-place outputs: the new value of a mutated input written straight into that input, and
a kernel output stored over an intermediate its own kernel reads for the last time.

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

`overwrites` applies the same order rules to intermediates: a pointwise kernel output may take
the storage of a buffer the plan allocated (a kernel's output, a matmul's `out=` buffer) that
its kernel reads for the last time, with the output's dtype, element count and contiguous
layout (shapes may differ: the reads are compared as memory positions, through views), never
returned or viewed by an extern call. memory.py gives it `Alloc(over=...)`; the C++ renderer
drops `__restrict__` from both names. This is what a GELU or SiLU after a matmul needs to run
in one buffer, as torch.compile's in-place kernels do.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import sympy

from .. import logs
from ..lower.indexing import index_vars
from ..lower.ir import (
    Input,
    Layout,
    LoopGraph,
    Node,
    Pointwise,
    View,
    contiguous_strides,
    loads,
    node_size,
    numel,
)
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


def overwrites(
    graph: LoopGraph, steps: Sequence[Step], owned: Collection[str], taken: Collection[str] = ()
) -> dict[str, str]:
    """{kernel output: the intermediate it is stored over}: a buffer the kernel reads for the
    last time, of the output's bytes and contiguous layout, each element read (by this kernel)
    only where the output's same element is then stored. `owned`: the intermediates whose
    memory the plan gives out (memory.py: kernel outputs and `out=` extern results) and that
    nothing else shares (not returned, not viewed by an extern call); `taken`: buffers already
    spoken for (mutated inputs' outputs and their inputs).

    Why: a pointwise kernel after a matmul (BERT's GELU, Llama's SiLU-times-up) otherwise
    writes a second buffer as large as its input while the input dies: twice the bytes in
    cache, and one more large allocation a call, which the C library may hand back as fresh
    pages (page faults) each time."""
    nodes = graph.node_map()
    readers = users(graph)
    step_of: dict[str, int] = {}
    for k, step in enumerate(steps):
        for name in [m.name for m in step.members] if isinstance(step, Kernel) else [step.name]:
            step_of[name] = k
    returned = {o for o in graph.outputs if isinstance(o, str)}
    used = set(taken)
    out: dict[str, str] = {}
    for k, kernel in enumerate(steps):
        if not isinstance(kernel, Kernel) or kernel.parts:
            continue
        for m in kernel.members:
            node = nodes[m.name]
            if not isinstance(node, Pointwise) or m.name in kernel.local:
                continue
            if m.name in returned or m.name in used:
                continue
            for src in _bases_read(node, nodes):
                if src in used or src not in owned or step_of.get(src, k) >= k:
                    continue
                if not _same_bytes(nodes[src], node):
                    continue
                why = _order_refusal(m.name, src, nodes, readers, steps, step_of)
                if why:
                    logs.log("schedule", f"{m.name} is not stored over {src}: {why}")
                    continue
                logs.log("schedule", f"{m.name} is stored over {src} (its last read)")
                out[m.name] = src
                used.update((m.name, src))
                break
    return out


def _bases_read(node: Pointwise, nodes: dict[str, Node]) -> list[str]:
    """The buffers `node` reads, views followed to their bases, in order of first read."""
    out: dict[str, None] = {}
    for ld in loads(node.body):
        name, view = ld.buf, nodes.get(ld.buf)
        while isinstance(view, View):
            name, view = view.base, nodes.get(view.base)
        out[name] = None
    return list(out)


def _same_bytes(src: Node, out: Pointwise) -> bool:
    """One contiguous layout of the same dtype and element count (shapes may differ)."""
    lay = getattr(src, "layout", None)
    if not isinstance(lay, Layout) or lay.offset != 0 or lay.dtype != out.layout.dtype:
        return False
    if tuple(lay.stride) != tuple(contiguous_strides(lay.size)):
        return False
    return sympy.expand(numel(lay.size) - numel(out.layout.size)) == 0


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
    return _order_refusal(name, inp, nodes, readers, steps, step_of)


def _order_refusal(
    name: str,
    src: str,
    nodes: dict[str, Node],
    readers: dict[str, list[str]],
    steps: Sequence[Step],
    step_of: dict[str, int],
) -> str:
    """Why `name`'s kernel may not store it over `src` ("" if it may): some read of `src`
    could come after the store (module doc)."""
    at, out = step_of[name], nodes[name]
    kernel = steps[at]
    assert isinstance(kernel, Kernel) and isinstance(out, Pointwise)
    if name in kernel.local:
        return "kept inside its kernel"
    order = [m.name for m in kernel.members]
    again = _read_in_a_later_pass(kernel, src, nodes)
    if again:
        return f"{again} reads it again in a later pass of {kernel.name}"
    for reader, via in _readers(src, nodes, readers):
        if reader == "<output>":
            return f"the input is returned ({via})"
        k = step_of.get(reader)
        if k is None:  # a view, or a node fused into nothing: read at no known step
            if isinstance(nodes.get(reader), View):
                continue  # an alias: its own readers are checked (`_readers` yields them)
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
        split = {m.name: m.split for m in kernel.members}
        if split[reader] != split[name] or not _reads_own_element(
            member_node(nodes, reader), via, src, out, nodes
        ):
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


def _reads_own_element(
    reader: Node, via: str, src: str, out: Pointwise, nodes: dict[str, Node]
) -> bool:
    """Does `reader` (a member of `out`'s kernel, of `out`'s size) read `src`, through `via`
    (`src` or a view of it), only at the memory position where `out` stores the element it
    computes? `src` and `out` have one contiguous layout of equal bytes (callers check)."""
    if not isinstance(reader, Pointwise) or tuple(reader.size) != tuple(out.size):
        return False
    own = index_vars(len(reader.size))
    at = _flat(own, contiguous_strides(out.size))
    for ld in loads(reader.body):
        if ld.buf != via:
            continue
        pos = _position(ld.index, via, src, nodes)
        if pos is None or sympy.expand(pos - at) != 0:
            return False
    return True


def _flat(index: Sequence, stride: Sequence) -> sympy.Expr:
    return sympy.expand(sum((sympy.sympify(i) * s for i, s in zip(index, stride)), sympy.S.Zero))


def _position(index: tuple, via: str, src: str, nodes: dict[str, Node]) -> sympy.Expr | None:
    """The element offset in `src`'s (contiguous) memory that `via[index]` reads; None when a
    view on the way is not a plain index map."""
    while via != src:
        view = nodes.get(via)
        if not isinstance(view, View):
            return None
        sub = dict(zip(index_vars(len(view.size)), index))
        index = tuple(sympy.sympify(e).xreplace(sub) for e in view.index)
        via = view.base
    return _flat(index, contiguous_strides(node_size(nodes[src])))

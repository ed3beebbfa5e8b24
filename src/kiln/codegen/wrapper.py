"""The wrapper program: one Python function per graph that allocates, calls kernels, frees.

Takes a `Schedule` and the rendered kernels (their argument buffers); gives `WrapperProgram`:
the Python source of `call(arg0, arg1, ...)` and the names it expects in its namespace
(`kernel0`, `aten_mm_default`, constants). The program checks each input's shape and strides
against the ones the kernels were built for (a differently strided input is copied, a
differently shaped one is an error), then runs the steps in order: `Alloc` ->
`torch.empty_strided` (or a view of a dead buffer's storage), `Kernel` -> a `ctypes` call with
data pointers, `ExternCall` -> the ATen op, `Alias` -> `as_strided`, `Free` -> `del`.

Symbolic sizes (lower/symbolic.py): the program first binds each size symbol from the call's
arguments (`s0 = arg0.size(1)`, or an integer argument), then checks, allocates and passes
sizes as Python expressions over them (`_empty((2*s0, 16), (16, 1), ...)`, `kernel0(..., s0)`),
so one program serves every size.

Why it exists: the one place the whole compiled graph is readable as code — what
`KILN_LOGS=output_code` prints, next to the C++ source.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from ..lower import GraphUnsupported
from ..lower.indexing import FloorDiv, IndexPrinter, index_vars, linearize
from ..lower.ir import (
    BufRef,
    Extern,
    ExternItem,
    View,
    node_dtype,
    node_size,
)
from ..lower.symbolic import TrueDiv
from ..schedule import Alias, Alloc, ExternCall, Free, Kernel, Schedule


@dataclass(frozen=True)
class WrapperProgram:
    source: str
    externs: dict  # namespace name -> OpOverload


class _PyPrinter(IndexPrinter):
    """Size expressions as Python (the wrapper computes sizes from the symbols it binds)."""

    for_whom = " in the wrapper"

    def floordiv(self, a: str, b: str) -> str:
        return f"{a}//{b}"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'min' if is_min else 'max'}({a}, {b})"

    def doprint(self, e) -> str:
        # float arithmetic on sizes (a SymFloat argument of an extern call: matrix_rank's
        # tolerance eps * max(m, n)) is Python arithmetic here, as in eager
        if isinstance(e, sympy.Number) and not e.is_Integer:
            return repr(float(e))
        if isinstance(e, TrueDiv):
            return f"({self.doprint(e.args[0])} / {self.doprint(e.args[1])})"
        if isinstance(e, (sympy.Min, sympy.Max)):  # one call, however many arguments
            args = ", ".join(self.doprint(a) for a in e.args)
            return f"{'min' if isinstance(e, sympy.Min) else 'max'}({args})"
        return super().doprint(e)


_PY = _PyPrinter()


def py_expr(value) -> str:
    """An int or a size expression as Python source over the bound size symbols."""
    if isinstance(value, int):
        return str(int(value))
    return _PY.doprint(value)


def _tuple(values) -> str:
    values = [py_expr(v) for v in values]
    return "(" + ", ".join(values) + ("," if len(values) == 1 else "") + ")"


def bind_sizes(graph, nodes: dict) -> list[str]:
    """Lines binding each size symbol of a symbolic graph from the call's arguments: an integer
    input that is the symbol, else the first input dimension (then stride) that is exactly it.
    A symbol no argument gives alone (only `2*s0` is seen) is a refusal, with the reason."""
    symbols: set = set()
    sources: dict = {}
    for name, value in graph.scalars.items():
        if isinstance(value, sympy.Basic):
            symbols |= value.free_symbols
            if value.is_Symbol:
                sources.setdefault(value, name)
    for attr in ("size", "stride"):
        for name in graph.inputs:
            lay = nodes[name].layout
            for d, v in enumerate(getattr(lay, attr)):
                if isinstance(v, sympy.Basic):
                    symbols |= v.free_symbols
                    if v.is_Symbol:
                        sources.setdefault(v, f"{name}.{attr}({d})")
    missing = sorted(str(s) for s in symbols - set(sources))
    if missing:
        raise GraphUnsupported(
            f"size symbols {', '.join(missing)} are not a size, stride or integer input of "
            "their own, so the wrapper cannot read them from the arguments"
        )
    return [f"    {s} = {src}" for s, src in sorted(sources.items(), key=lambda kv: str(kv[0]))]


def strides_differ(name: str, size, stride) -> str | None:
    """The test that tensor `name` is not strided as compiled, where it matters: a dimension of
    size 1 is never stepped along, so its stride is whatever ATen chose (a (1, N) matmul result
    comes back with stride (N, 1) or (1, 1) by cuBLAS's choice; comparing whole stride tuples
    copied 48 such results a GPT-2 decode step). None: nothing to compare."""
    keep = [d for d, s in enumerate(size) if s != 1]
    if len(keep) == len(size):
        return f"{name}.stride() != {_tuple(stride)}"
    if not keep:
        return None
    got = "(" + "".join(f"{name}.stride({d}), " for d in keep) + ")"
    return f"{got} != {_tuple([stride[d] for d in keep])}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32"


def _arg(value) -> str:
    if isinstance(value, BufRef):
        return value.name
    if isinstance(value, sympy.Basic):  # a symbolic size argument
        return py_expr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_arg(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(_arg(v) + ", " for v in value) + ")"
    if isinstance(value, torch.dtype):
        return _dtype(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, float) and value != value:
        return "float('nan')"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return f"float('{value}')"
    return repr(value)


def _extern_name(target) -> str:
    return "aten_" + str(target).replace("aten.", "").replace(".", "_")


def boxed_header(inputs) -> list[str]:
    """The wrapper takes its inputs as one list and empties it (the boxed convention): then
    `del argN` after an input's last reader frees it — a backward releases each saved
    activation as soon as it is used, not when the whole graph returns."""
    unpack = "".join(f"{name}, " for name in inputs)
    if not inputs:
        return ["def call(args):", "    args.clear()"]
    return ["def call(args):", f"    {unpack}= args", "    args.clear()"]


def indexed_by_layout(sched: Schedule, nodes: dict, kernel_params) -> set[str]:
    """Buffers indexed with the strides the fake tensors predicted: those kernels read, and the
    bases of strided aliases. An extern output among them is copied into those strides when
    ATen returns another layout than its meta function said."""
    read = {p for params in kernel_params for p in params}
    return read | {nodes[s.name].base for s in sched.steps if isinstance(s, Alias)}


def input_checks(
    inputs, nodes: dict, checked=frozenset(), device: bool = False, host=frozenset()
) -> list[str]:
    """Lines checking each input's shape and strides (and, `device`, that it is on the graph's
    device), copying a differently strided one into place; inputs in `checked` are left to
    the caller's guards (capture's checks of the tensors it passes: a ResNet-50 passes 268,
    and each check cost ~1 us), with a comment saying how many; inputs in `host` stay on whatever
    device they come on (scalars only extern calls read, see triton/wrapper.py)."""
    n = sum(name in checked for name in inputs)
    lines = [f"    # {n} inputs' layouts are checked by capture's guards, not here"] if n else []
    for name in inputs:
        if name in checked:
            continue
        lay = nodes[name].layout
        size, stride = _tuple(lay.size), _tuple(lay.stride)
        tests = [strides_differ(name, lay.size, lay.stride), f"{name}.shape != {size}"]
        to_device = device and name not in host
        if to_device:
            tests.append(f"{name}.get_device() != _device_index")
        fix = f"_fix_input({name}, {name!r}, {size}, {stride}{', device' if to_device else ''})"
        lines.append(f"    if {' or '.join(t for t in tests if t)}: {name} = {fix}")
    return lines


def render_wrapper(
    sched: Schedule,
    kernel_params: dict[str, tuple[str, ...]],
    checked=frozenset(),
    out_variants=None,
    kernel_sizes: dict[str, tuple[str, ...]] | None = None,
) -> WrapperProgram:
    """The C++ device's wrapper. `out_variants`: the device's `Capabilities.out_variants`, the
    extern ops called with `out=` into the buffer the memory plan gave them."""
    graph = sched.graph
    nodes = graph.node_map()
    lines = boxed_header(graph.args)
    if graph.symbolic:
        lines += bind_sizes(graph, nodes)
    lines += input_checks(graph.inputs, nodes, checked)
    lines.extend(_arena_header(sched, nodes))
    kept = {s.reuse for s in sched.steps if isinstance(s, Alloc) and s.reuse}
    read_by_kernel = indexed_by_layout(sched, nodes, kernel_params.values())
    externs: dict = {}
    allocated: set[str] = set()
    for step in sched.steps:
        if isinstance(step, Alloc):
            node = nodes[step.name]
            size, stride = _tuple(node_size(node)), _tuple(node.layout.stride)
            allocated.add(step.name)
            if step.into:  # the kernel writes the mutated input itself (schedule/inplace.py)
                lines.append(f"    {step.name} = {step.into}")
            elif step.reuse:
                lines.append(f"    {step.name} = {step.reuse}.view({size}); del {step.reuse}")
            elif step.over:  # freed (`del`) after the kernel that reads it last
                lines.append(f"    {step.name} = {step.over}.view({size})")
            elif step.name in sched.arena.offsets:
                dtype = node_dtype(node)
                offset = sched.arena.offsets[step.name]
                at = py_expr(
                    offset // dtype.itemsize
                    if isinstance(offset, int)
                    else FloorDiv(offset, dtype.itemsize)
                )
                lines.append(
                    f"    {step.name} = _as_strided({_arena_view(dtype)}, {size}, {stride}, {at})"
                )
            else:
                dtype = _dtype(node_dtype(node))
                lines.append(f"    {step.name} = _empty({size}, {stride}, {dtype})")
        elif isinstance(step, Kernel):
            sizes = (kernel_sizes or {}).get(step.name, ())
            ptrs = ", ".join([f"{p}.data_ptr()" for p in kernel_params[step.name]] + list(sizes))
            members = ", ".join(m.name for m in step.members)
            lines.append(f"    {step.name}({ptrs})  # {members}")
        elif isinstance(step, ExternCall):
            node = nodes[step.name]
            into = node.name in allocated  # the plan gave it a buffer: call the out= variant
            target = out_variants[node.target] if into else node.target
            fn = _extern_name(target)
            externs[fn] = target
            args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs]
            if into:
                lines.append(f"    {fn}({', '.join(args + [f'out={node.name}'])})")
            else:
                lines.append(f"    {node.name} = {fn}({', '.join(args)})")
                lines.extend(_extern_outputs(node, nodes, read_by_kernel))
        elif isinstance(step, Alias):
            lines.append(f"    {step.name} = {_alias(nodes[step.name], nodes)}")
        elif isinstance(step, Free):
            if step.name in kept:
                continue
            lines.append(f"    del {step.name}")
    if sched.arena.nbytes:  # (a symbolic size is a symbol: true)
        lines.append("    _arenas.append(_arena)")
    outs = [o if isinstance(o, str) else _arg(o) for o in graph.outputs]
    lines.append(f"    return ({''.join(o + ', ' for o in outs)})")
    return WrapperProgram("\n".join(lines) + "\n", externs)


def _arena_header(sched: Schedule, nodes: dict) -> list[str]:
    """Take the graph's arena (schedule/arena.py) from the ones kept by earlier calls, or make
    one (the first call, or a call while another is running), and one typed view of it per
    dtype placed in it."""
    if not sched.arena.nbytes:
        return []
    if sched.arena.grows:
        # Offsets computed from this call's sizes; a block kept from an earlier call is used if
        # large enough, else a new one a quarter larger than needed replaces it (growing sizes,
        # a decode's KV length, then reallocate now and then, not every call).
        lines = [f"    {k} = {py_expr(v)}" for k, v in sched.arena.defs.items()]
        need = sched.arena.nbytes
        lines.append("    _arena = _arenas.pop() if _arenas else None")
        lines.append(
            f"    if _arena is None or _arena.numel() < {need}: "
            f"_arena = _new_arena({need} * 5 // 4 // 64 * 64 + 64)"
        )
    else:
        lines = [f"    _arena = _arenas.pop() if _arenas else _new_arena({sched.arena.nbytes})"]
    for dtype in dict.fromkeys(node_dtype(nodes[n]) for n in sched.arena.offsets):
        lines.append(f"    {_arena_view(dtype)} = _arena.view({_dtype(dtype)})")
    return lines


def _arena_view(dtype: torch.dtype) -> str:
    return "_arena_" + str(dtype).replace("torch.", "")


def _extern_outputs(node: Extern, nodes: dict, read_by_kernel: set) -> list[str]:
    lines = []
    items = [n for n in nodes.values() if isinstance(n, ExternItem) and n.base == node.name]
    for item in items:
        lines.append(f"    {item.name} = {node.name}[{item.index}]")
    if node.multi:
        lines.append(f"    del {node.name}")
    for n in items if node.multi else [node]:
        if n.name not in read_by_kernel:  # kernels index with the layout predicted
            continue
        test = strides_differ(n.name, n.layout.size, n.layout.stride)
        if test:
            stride, size = _tuple(n.layout.stride), _tuple(n.layout.size)
            lines.append(
                f"    if {test}: {n.name} = _fix_input({n.name}, {n.name!r}, {size}, {stride})"
            )
    return lines


def _alias(view: View, nodes: dict) -> str:
    from ..lower.indexing import view_form

    pos = linearize(view.index, nodes[view.base].layout.stride)
    form = view_form(pos, index_vars(len(view.size)), view.size)
    assert form is not None, f"{view.name}: kept as an alias by the schedule, but not strided"
    coeffs, rel = form  # offsets relative to the base tensor's own storage offset
    strides = [c if s != 1 else 0 for c, s in zip(coeffs, view.size)]
    head = f"_as_strided({view.base}, {_tuple(view.size)}, {_tuple(strides)}"
    if rel == 0:  # torch.as_strided keeps the base's own storage offset when given none
        return head + ")"
    return head + f", {view.base}.storage_offset() + {py_expr(rel)})"

"""The wrapper program of a Triton graph: one Python function that allocates, launches, frees.

Takes a `Schedule` and the rendered Triton kernels (their pointer arguments and launch plans);
gives `WrapperProgram` (the C++ path's type): the source of `call(arg0, arg1, ...)` and the
ATen ops it calls. Like the C++ wrapper (codegen/wrapper.py, whose step spellings for extern
calls, views and frees this reuses) it checks each input's shape and strides, then runs the
steps in order; what differs is the small part that is Triton's:

* buffers are allocated on the graph's device (the one its example inputs were on; an input
  elsewhere, such as a CPU scalar tensor, is copied there), so the same program runs CUDA
  tensors on the GPU and CPU tensors under `TRITON_INTERPRET=1`;
* a kernel step is a launch, `kernel0[grid](buf0, arg0, XBLOCK=1024, num_warps=4)`, with the
  grid and block sizes of its plan written out, so `KILN_LOGS=output_code` shows them;
* the body runs under `_device_guard(device)`, which selects the inputs' GPU when it is not the
  current one (Triton launches on the current device).

Symbolic sizes: as the C++ wrapper, the program binds the size symbols from the call's
arguments (`bind_sizes`) and allocates by expression; a launch's grid is an expression over
them, evaluated per call, and the kernel takes the symbols it uses after its buffers
(`kernel0[((8*s0 + 1023)//1024,)](arg0, buf1, s0, XBLOCK=1024, num_warps=4)`). A persistent
reduction over a symbolic row length is launched when the call's rows fit its block, its looped
twin otherwise (`if s0 <= 1024: ... else: ...`).

Why it exists: the whole compiled graph stays readable as code, as DESIGN.md §2 asks.
"""

from __future__ import annotations

import sympy

from ...lower.ir import Extern
from ...schedule import Alias, Alloc, ExternCall, Free, Kernel, Schedule
from ..wrapper import (
    WrapperProgram,
    _alias,
    _arg,
    _dtype,
    _extern_name,
    _extern_outputs,
    _tuple,
    bind_sizes,
    boxed_header,
    indexed_by_layout,
    input_checks,
    py_expr,
)
from .renderer import TritonKernel


def _scalars_for_externs(inputs, nodes: dict, read_by_kernel: set) -> frozenset:
    """Zero-dimensional inputs that no kernel reads (`indexed_by_layout`): left on whatever
    device they come on, since ATen's ops take a CPU scalar tensor beside GPU ones, as eager
    passes them. A memory-efficient attention returns its random seed and offset as CPU scalars
    and its backward takes them back; the device check copied them to the GPU on every call,
    and each copy waited for the GPU to drain (twelve times a nanoGPT training step). The fake
    tensors the graph was compiled from place them on the GPU, so the wrapper cannot go by
    those."""
    return frozenset(n for n in inputs if not nodes[n].layout.size and n not in read_by_kernel)


def _launch(kernel: TritonKernel, members: str) -> list[str]:
    """The launch of `kernel`; a split reduction's also allocates its partials' scratch
    buffers, launches the kernel that adds them, and frees them (split.py); a persistent one
    with a looped twin launches the twin for rows longer than its block."""
    p = kernel.plan
    consts = "".join(f", {k}={v}" for k, v in p.constexprs.items())
    args = ", ".join(kernel.params + kernel.sizes)
    launch = f"{kernel.name}[{_tuple(p.grid)}]({args}{consts}, num_warps={p.num_warps})"
    if kernel.looped is not None:
        fits = f"{py_expr(p.rnumel)} <= {p.RBLOCK}"
        longer = _launch(kernel.looped, members + " (rows longer than the block)")
        return [f"if {fits}: {launch}  # {members}", *[f"else: {line}" for line in longer]]
    if kernel.finish is None:
        return [f"{launch}  # {members}"]
    lines = [
        f"{name} = _empty({_tuple(size)}, {_tuple((size[1], 1))}, {_dtype(dtype)}, device)"
        for name, size, dtype in kernel.workspaces
    ]
    lines.append(f"{launch}  # partial sums of {members}")
    lines += _launch(kernel.finish, members)
    lines += [f"del {name}" for name, _, _ in kernel.workspaces]
    return lines


def _index_check(kernels) -> list[str]:
    """A kernel of symbolic sizes indexes with 32 bits when the size hints allowed it; past
    2**31 elements it would overflow, so the call stops with the reason and the fix instead
    (one comparison a call: `_index_limit` is 2**31 - 1, load.py)."""
    reach = list(dict.fromkeys(e for k in kernels for e in k.reach))
    reach = [e for e in reach if not any(f is not e and _at_least(f, e) for f in reach)]
    if not reach:
        return []
    largest = (
        py_expr(next(iter(reach))) if len(reach) == 1 else f"max({', '.join(map(py_expr, reach))})"
    )
    return [f"    if {largest} >= _index_limit: _too_large({largest})"]


def _at_least(f, e) -> bool:
    """Is `f >= e` for every size (symbols >= 1): `f / e` a polynomial with nonnegative
    coefficients, as `s0*s1` over `s1`? (False when unsure, e.g. under a floor division.)"""
    q = sympy.cancel(f / e)
    if not q.is_polynomial() or q.has(sympy.Function):
        return False
    coeffs = sympy.Poly(q, *sorted(q.free_symbols, key=str)).coeffs() if q.free_symbols else [q]
    return all(c.is_number and c >= 0 for c in coeffs) and q != 0 and f != e


def _kept_header(sched: Schedule, nodes: dict) -> list[str]:
    """The small intermediates kept between calls (schedule/arena.py `plan_small_arena`):
    views of one block, made on the first call and taken back from the graph's kept sets on
    later ones, so those buffers cost the call no allocation (`_take_kept`, load.py)."""
    offsets = sched.arena.offsets
    if not offsets:
        return []
    layouts = []
    for name, offset in offsets.items():
        node = nodes[name]
        size, stride = _tuple(node.size), _tuple(node.layout.stride)
        layouts.append(f"({offset // node.dtype.itemsize}, {size}, {stride}, {_dtype(node.dtype)})")
    return [
        f"_kept = _take_kept(_kept_sets, device, {sched.arena.nbytes}, ({', '.join(layouts)},))",
        f"{', '.join(offsets)}, = _kept[2:]",
    ]


def render_wrapper(
    sched: Schedule, kernels: dict[str, TritonKernel], checked=frozenset()
) -> WrapperProgram:
    graph = sched.graph
    nodes = graph.node_map()
    read_by_kernel = indexed_by_layout(sched, nodes, (k.params for k in kernels.values()))
    lines = boxed_header(graph.args) + ["    device = _default_device"]
    if graph.symbolic:
        lines += bind_sizes(graph, nodes)
        lines += _index_check(kernels.values())
    host = _scalars_for_externs(graph.inputs, nodes, read_by_kernel)
    lines += input_checks(graph.inputs, nodes, checked, device=True, host=host)
    lines.append("    with _device_guard(device):")
    body: list[str] = _kept_header(sched, nodes)
    kept = {s.reuse for s in sched.steps if isinstance(s, Alloc) and s.reuse}
    externs: dict = {}
    for step in sched.steps:
        if isinstance(step, Alloc):
            node = nodes[step.name]
            size, stride = _tuple(node.size), _tuple(node.layout.stride)
            if step.into:  # the kernel writes the mutated input itself (schedule/inplace.py)
                body.append(f"{step.name} = {step.into}")
            elif step.name in sched.arena.offsets:
                continue  # bound by `_kept_header`
            elif step.reuse:
                body.append(f"{step.name} = {step.reuse}.view({size}); del {step.reuse}")
            elif step.over:  # freed (`del`) after the kernel that reads it last
                body.append(f"{step.name} = {step.over}.view({size})")
            else:
                body.append(f"{step.name} = _empty({size}, {stride}, {_dtype(node.dtype)}, device)")
        elif isinstance(step, Kernel):
            if step.name in kernels:  # kernels over zero elements are not launched
                members = ", ".join(m.name for m in step.members)
                body.extend(_launch(kernels[step.name], members))
        elif isinstance(step, ExternCall):
            node: Extern = nodes[step.name]
            fn = _extern_name(node.target)
            externs[fn] = node.target
            args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs]
            body.append(f"{node.name} = {fn}({', '.join(args)})")
            body.extend(line.strip() for line in _extern_outputs(node, nodes, read_by_kernel))
        elif isinstance(step, Alias):
            body.append(f"{step.name} = {_alias(nodes[step.name], nodes)}")
        elif isinstance(step, Free):
            if step.name not in kept:
                body.append(f"del {step.name}")
    if sched.arena.nbytes:
        body.append("_give_kept(_kept_sets, _kept)")
    outs = [o if isinstance(o, str) else _arg(o) for o in graph.outputs]
    body.append(f"return ({''.join(o + ', ' for o in outs)})")
    lines.extend("        " + b for b in body)
    return WrapperProgram("\n".join(lines) + "\n", externs)

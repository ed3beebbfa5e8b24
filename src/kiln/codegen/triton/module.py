"""The Triton module of a graph: every kernel of a `Schedule` in one Python source.

Takes a `Schedule`; gives `TritonModule` (kernel.py): each kernel rendered by renderer.py, or
by horizontal.py for a horizontal kernel, with the prelude of ops.py; kernels whose code is
another's bar names are defined once (`_canonical`).

Why it exists: the one place that picks a kernel's renderer, so that renderer.py and
horizontal.py (which builds on it) need not import each other.
"""

from __future__ import annotations

import dataclasses
import re

from ... import trace
from ...lower.symbolic import is_symbolic, using_hints
from ...schedule import Alloc, Kernel, Schedule
from .horizontal import render_group
from .kernel import TritonKernel, TritonModule
from .ops import prelude
from .renderer import render_kernel


def _writes_nothing(kernel: Kernel, nodes: dict) -> bool:
    return all(
        any(not is_symbolic(d) and int(d) == 0 for d in nodes[m.name].size) for m in kernel.members
    )


@trace.timed("render")
def render_module(
    sched: Schedule, emulate_casts: bool = False, interpret: bool = False
) -> TritonModule:
    """All kernels of `sched`; `emulate_casts`: round half-typed intermediates like eager;
    `interpret`: for Triton's interpreter (see ops.prelude)."""
    nodes = sched.graph.node_map()
    with using_hints(sched.graph.hints):  # plans of symbolic sizes are made for the hints
        kernels = tuple(
            part
            for k in sched.kernels
            if not _writes_nothing(k, nodes)
            for main in [
                render_group(k, nodes, emulate_casts)
                if k.parts
                else render_kernel(k, nodes, emulate_casts)
            ]
            for part in (main, main.finish, main.looped)
            if part is not None
        )
    into = {s.name: s.into for s in sched.steps if isinstance(s, Alloc) and s.into}
    kernels = tuple(_into_inputs(k, into) for k in kernels)
    first: dict[str, TritonKernel] = {}
    same_as: dict[str, str] = {}
    parts = []
    for k in kernels:
        original = first.setdefault(_canonical(k), k)
        if original is k:
            parts.append(k.source)
        else:
            same_as[k.name] = original.name
            parts.append(f"{k.name} = {original.name}  # the same code as {original.name}")
    source = prelude(interpret) + "\n\n" + "\n\n\n".join(parts) + "\n"
    return TritonModule(kernels, source, same_as)


def _into_inputs(kernel: TritonKernel, into: dict[str, str]) -> TritonKernel:
    """`kernel` with each output written into a mutated input (schedule/inplace.py: the
    wrapper binds `buf = arg`) read and written through the input's own parameter: one pointer
    argument where there were two, so a horizontal kernel takes a parameter, not three, for
    each of an optimizer's in-place tensors (schedule/horizontal.py `kernel_args` counts so).
    (The input stays bound in the wrapper to its end: memory.py pins an input written into.)"""
    if not any(p in into for p in kernel.params):
        return kernel
    names = {p: into[p] for p in kernel.params if p in into}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    source = pattern.sub(lambda m: names[m.group(0)], kernel.source)
    head = re.search(r"def \w+\((.*?)\):", source, re.S)
    assert head is not None, kernel.name
    args = ", ".join(dict.fromkeys(a.strip() for a in head.group(1).split(",")))
    source = source[: head.start(1)] + args + source[head.end(1) :]
    return dataclasses.replace(
        kernel,
        params=tuple(dict.fromkeys(names.get(p, p) for p in kernel.params)),
        source=source,
        finish=kernel.finish and _into_inputs(kernel.finish, into),
        looped=kernel.looped and _into_inputs(kernel.looped, into),
    )


def _canonical(kernel: TritonKernel) -> str:
    """The kernel's code with its name and parameters named by position. The layers of a
    transformer or the blocks of a ResNet stage give kernels that differ only there; each is
    defined and compiled once (GPT-2's 54 kernels a forward are a handful of distinct ones)."""
    args = kernel.params + kernel.sizes
    names = {kernel.name: "K", **{p: f"p{i}" for i, p in enumerate(args)}}
    pattern = r"\b(" + "|".join(re.escape(n) for n in names) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(0)], kernel.source)

"""The C++ module of a graph: every kernel of a `Schedule` in one translation unit.

Takes a `Schedule`; gives `CppModule` (renderer.py's type): each kernel rendered by
renderer.py, or by horizontal.py for a horizontal kernel, after one shared prelude.

Why it exists: the one place that picks a kernel's renderer, so that renderer.py and
horizontal.py (which builds on it) need not import each other.
"""

from __future__ import annotations

from ... import trace
from ...lower.symbolic import using_hints
from ...schedule import Alloc, Schedule
from .horizontal import render_group
from .ops import PRELUDE
from .renderer import CppModule, render_kernel


@trace.timed("render")
def render_module(sched: Schedule) -> CppModule:
    nodes = sched.graph.node_map()
    with using_hints(sched.graph.hints):
        into = [
            (a.name, a.into or a.over)
            for a in sched.steps
            if isinstance(a, Alloc) and (a.into or a.over)
        ]
        aliased = frozenset(name for pair in into for name in pair)
        kernels = tuple(
            render_group(k, nodes, aliased) if k.parts else render_kernel(k, nodes, aliased)
            for k in sched.kernels
        )
    source = PRELUDE + "\n" + "\n\n".join(k.source for k in kernels) + "\n"
    return CppModule(kernels, source)

"""schedule/: loop IR -> kernels, in order, with a memory plan.

In: a `LoopGraph` from lower/ and the compile options. Out: a `Schedule` — the graph after
inlining, and the ordered steps (`Alloc`, `Kernel`, `ExternCall`, `Alias`, `Free`) that
codegen renders one-to-one into the wrapper program and the kernels.

Files: realize.py (dead code, views, which pointwise nodes get a buffer, inlining),
fusion.py (kernels: which nodes share a loop, and why not), wide.py (kernels over the
device's argument cap split into independent ones), horizontal.py (independent
pointwise kernels run side by side in one), inplace.py (mutated inputs
written in place), memory.py (lifetimes and reuse),
arena.py (the block that holds intermediates from call to call), fuel.py (the optimization
budget for bisecting miscompiles).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import logs, trace
from ..lower.ir import LoopGraph
from ..lower.symbolic import using_hints
from ..lower.verify import verify
from .arena import Arena, plan_arena, plan_small_arena
from .fuel import Fuel
from .fusion import ExternCall, Kernel, Member, fuse
from .horizontal import group_horizontally
from .inplace import inplace_outputs
from .memory import Alias, Alloc, Free, PlanStep, plan_memory
from .realize import eliminate_dead, inline_pointwise, materialize_views
from .wide import split_wide


@dataclass(frozen=True)
class Schedule:
    graph: LoopGraph
    steps: tuple[PlanStep, ...]
    arena: Arena = field(default_factory=Arena)  # offsets of buffers kept from call to call

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)


@trace.timed("schedule")
def schedule(
    graph: LoopGraph,
    *,
    fuel: int | None = None,
    verify_ir: bool = False,
    out_externs: frozenset = frozenset(),
    arena: bool = False,
    mutations: Mapping[str, str] | None = None,
    horizontal: int = 0,
    small_arena: int = 0,
    many_programs: bool = False,
) -> Schedule:
    """`out_externs`: extern targets the renderer calls with `out=` (see memory.py);
    `arena`: place the intermediates in one block the wrapper keeps between calls (arena.py);
    `mutations`: {output: input} for outputs that are new values of mutated inputs, which
    the caller would copy into them (written in place where safe: inplace.py);
    `horizontal`: the most buffer arguments of a horizontal kernel (horizontal.py), 0 for
    none; `small_arena` (without `arena`): the largest intermediate, in bytes, kept in a block
    between calls (arena.py `plan_small_arena`), 0 for none; `many_programs`: the device runs
    kernels as many short programs (devices `Capabilities.many_programs`: one-value producers
    recomputed by their readers, realize.py; independent member sets as parts, wide.py)."""
    with using_hints(graph.hints):
        return _schedule(
            graph,
            fuel,
            verify_ir,
            out_externs,
            arena,
            mutations or {},
            horizontal,
            small_arena,
            many_programs,
        )


def _schedule(
    graph: LoopGraph,
    fuel: int | None,
    verify_ir: bool,
    out_externs: frozenset,
    arena: bool,
    mutations: Mapping[str, str],
    horizontal: int = 0,
    small_arena: int = 0,
    many_programs: bool = False,
) -> Schedule:
    budget = Fuel(fuel)

    def after(name: str, g: LoopGraph) -> LoopGraph:  # verified (debug) and shown (passes)
        logs.log("passes", lambda: f"after schedule pass {name}:\n{g}")
        return verify(g) if verify_ir else g

    graph = after("eliminate_dead", eliminate_dead(graph))
    graph = after("materialize_views", materialize_views(graph))
    graph = after("inline_pointwise", inline_pointwise(graph, budget, many_programs))
    graph = after("eliminate_dead", eliminate_dead(graph))
    # a GPU's renderer passes a mutated input and the new value written into it as one
    # argument (codegen/triton/module.py); the C++ one passes both
    one_arg = mutations if many_programs else None
    fused = split_wide(graph, fuse(graph, budget), horizontal, many_programs, one_arg)
    fused = group_horizontally(graph, fused, horizontal, budget, one_arg)
    steps = plan_memory(graph, fused, out_externs, inplace_outputs(graph, fused, mutations))
    if arena:
        kept = plan_arena(graph, steps)
    else:
        kept = plan_small_arena(graph, steps, small_arena) if small_arena else Arena()
    result = Schedule(graph, steps, kept)
    logs.log("schedule", lambda: f"schedule ({budget}):\n{result}\n{result.arena}")
    return result


__all__ = [
    "Alias",
    "Arena",
    "Alloc",
    "ExternCall",
    "Free",
    "Fuel",
    "Kernel",
    "Member",
    "PlanStep",
    "Schedule",
    "schedule",
]

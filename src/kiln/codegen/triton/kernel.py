"""The rendered Triton kernels of a graph: `TritonKernel` (one kernel and its launch plan) and
`TritonModule` (all of a graph's kernels in one source).

Takes nothing; gives the two frozen types the renderer (renderer.py, split.py) makes and the
wrapper and builder read. Why it exists: split.py makes kernels too, so the types live apart
from the renderer that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .heuristics import Plan


@dataclass(frozen=True)
class TritonKernel:
    name: str
    params: tuple[str, ...]  # buffer names, in argument order
    plan: Plan
    source: str
    # a split reduction (split.py): scratch buffers (name, size, dtype) the wrapper allocates
    # around the launch, and the kernel that adds their partials, launched right after
    workspaces: tuple = ()
    finish: TritonKernel | None = None
    # symbolic sizes: the size symbols passed after the buffers, in order
    sizes: tuple[str, ...] = ()
    # a persistent reduction over a symbolic row length: the looped kernel the wrapper launches
    # instead when a call's rows are longer than `plan.RBLOCK` (renderer.py)
    looped: TritonKernel | None = None
    # 32-bit indices chosen at the size hints: size expressions the wrapper checks stay below
    # 2**31 on every call (renderer._reach)
    reach: tuple = ()


@dataclass(frozen=True)
class TritonModule:
    kernels: tuple[TritonKernel, ...]
    source: str
    # kernel -> the earlier kernel whose code it is, bar names (defined once, compiled once)
    same_as: dict = field(default_factory=dict)

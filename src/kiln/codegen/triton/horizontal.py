"""Triton horizontal kernels: independent pointwise kernels in one launch, programs split by part.

Takes a horizontal `Kernel` (schedule/horizontal.py: static sizes, pointwise parts that read
nothing another part writes) and the graph's nodes; gives one `TritonKernel` whose grid is the
sum of its parts' blocks.

Shape: every part is rendered as a flat kernel of its own (renderer.py, one `XBLOCK` for all
of them), and the group kernel picks the part by its program id against static boundaries:

    gpid = tl.program_id(0)
    if gpid < 3:                        # part 0: blocks 0..2
        xindex = (gpid - 0) * XBLOCK + tl.arange(0, XBLOCK) ...
    if (gpid >= 3) & (gpid < 7):        # part 1: blocks 3..6
        ...

Each part is an `if` of its own, not an `elif` of the one before: a chain of `elif`s is a
nest as deep as the parts, and Triton's build time grew with that depth (128 one-value parts
of a GPT-2 AdamW step's counts: 22.5 s to build for sm_90 as a chain, 5.2 s as siblings).

Each part keeps its own masks, so the last block of every part is masked at that part's end.
Each part's local names carry its number (`tmp3_p1`): Triton merges a name bound in two
branches of an `if`, and the parts' values need not have one type.

Why it exists: a foreach optimizer step was one launch per parameter size (GPT-2's AdamW: 36,
most over a few thousand elements, each launch costing more than its work).
"""

from __future__ import annotations

import re

from ...schedule import Kernel
from .heuristics import FLAT_XBLOCK, Plan, cdiv, next_pow2, warps_for
from .kernel import TritonKernel
from .renderer import render_kernel

_LOCAL = re.compile(r"\b(tmp\d+|xindex|xmask|xnumel)\b")


def render_group(kernel: Kernel, nodes: dict, emulate_casts: bool = False) -> TritonKernel:
    sizes = [int(p.outer * p.inner) for p in kernel.parts]
    xb = min(FLAT_XBLOCK, next_pow2(max(sizes)))
    lines = ["    gpid = tl.program_id(0)"]
    params: dict[str, None] = {}
    start = 0
    for i, (part, numel) in enumerate(zip(kernel.parts, sizes)):
        one = render_kernel(part, nodes, emulate_casts, Plan("flat", numel, XBLOCK=xb))
        assert one.plan.kind == "flat" and not one.sizes and one.finish is None
        params.update(dict.fromkeys(one.params))
        end = start + cdiv(numel, xb)
        test = f"gpid < {end}" if i == 0 else f"(gpid >= {start}) & (gpid < {end})"
        lines.append(f"    if {test}:  # {part.name}: {numel} elements")
        body = one.source.split("\n")[2:]  # after the decorator and the def line
        body = [_LOCAL.sub(lambda m, i=i: f"{m.group(1)}_p{i}", b) for b in body]
        body = [b.replace("tl.program_id(0)", f"(gpid - {start})") for b in body]
        lines += ["    " + b for b in body]
        start = end
    args = ", ".join(params)
    source = "\n".join(["@triton.jit", f"def {kernel.name}({args}, XBLOCK: tl.constexpr):", *lines])
    plan = Plan("flat", start * xb, XBLOCK=xb, num_warps=warps_for(xb))
    return TritonKernel(kernel.name, tuple(params), plan, source)

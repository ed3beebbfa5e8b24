"""Split reductions: sums across many rows, shared among programs along the rows as well.

Takes a kernel whose plan has `split` (heuristics.splittable: floating-point sums alone, each
stored, none read by another member, few outputs and many rows); gives two pieces. In the main
kernel each program reduces `rchunk` rows of `XBLOCK` outputs and stores its partial sum into a
scratch buffer `<name>_part` of `[split, outputs]` (compute type: float32 for half types); the
kernel `<kernel>_sum`, launched right after it, adds each output's `split` partials in a fixed
order and stores the result in the output's dtype and layout. The wrapper allocates the scratch
buffers around the two launches (wrapper.py).

Why: a column sum of a [8192, 768] gradient (a layer norm's weight and bias, a linear layer's
bias) has 768 outputs; one program per tile of outputs walking all 8192 rows leaves most of
the GPU idle (24 programs of 32 outputs: 190 us; 96 of 8: 76 us for three such sums, H200).
The partials keep the result deterministic (no atomics), as eager's is.
"""

from __future__ import annotations

import torch

from ...lower.indexing import index_vars
from .heuristics import Plan, next_pow2, warps_for
from .indexing import XINDEX, store_index, tl_str
from .kernel import TritonKernel
from .ops import HALF_TYPES, store_cast

# elements of partials one program of `<kernel>_sum` adds: its outputs x the split
FINISH_ELEMENTS = 4096


def partial_name(node_name: str) -> str:
    return node_name + _PART


def node_of_partial(name: str) -> str:
    return name[: -len(_PART)]


_PART = "_part"


def store_partial(ctx, node, var: str) -> None:
    """Store a program's partial sum of `node` (a [XBLOCK, 1] block) into its scratch row."""
    p = ctx.plan
    name = ctx.param(partial_name(node.name), True)
    dtype = torch.float32 if node.body.dtype in HALF_TYPES else node.body.dtype  # compute type
    ctx.workspaces.append((name, (p.split, p.xnumel), dtype))
    mask = ", mask=xmask" if XINDEX in ctx.masked else ""
    ctx.line(f"tl.store({name} + (tl.program_id(1) * {p.xnumel} + xindex), {var}{mask})")


def render_finish(kernel_name: str, workspaces: list, nodes: dict, p: Plan):
    """The kernel that adds the partials of each sum of `kernel_name` (see the module doc)."""
    name = f"{kernel_name}_sum"
    sp = next_pow2(p.split)
    xb = max(1, min(FINISH_ELEMENTS // sp, next_pow2(p.xnumel)))
    xmask = p.xnumel % xb != 0
    masks = [m for m, on in (("(sindex < %d)" % p.split, sp != p.split), ("xmask", xmask)) if on]
    load_mask = f", mask={' & '.join(masks)}, other=0" if masks else ""
    store_mask = ", mask=xmask" if xmask else ""
    lines = [
        "xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
        f"sindex = tl.arange(0, {sp})[:, None]",
    ]
    if xmask:
        lines.append(f"xmask = xindex < {p.xnumel}")
    params = []
    for i, (ws, _, _) in enumerate(workspaces):
        node = nodes[node_of_partial(ws)]
        params += [ws, node.name]
        size = tuple(node.size)
        pos = store_index(size, [(index_vars(len(size)), size, XINDEX)])
        lines += [
            f"part{i} = tl.load({ws} + (sindex * {p.xnumel} + xindex){load_mask})",
            f"sum{i} = tl.sum(part{i}, 0, keep_dims=True)",
            f"tl.store({node.name} + ({tl_str(pos)}), "
            f"{store_cast(node.dtype).format(f'sum{i}')}{store_mask})",
        ]
    head = ["@triton.jit", f"def {name}({', '.join(params)}, XBLOCK: tl.constexpr):"]
    finish_plan = Plan("flat", p.xnumel, XBLOCK=xb, num_warps=warps_for(xb * sp))
    source = "\n".join(head + ["    " + x for x in lines])
    return TritonKernel(name, tuple(params), finish_plan, source)

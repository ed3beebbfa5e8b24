"""Launch plans: which shape of Triton kernel a scheduled kernel becomes, its blocks and warps.

Takes a `Kernel` from the scheduler and the graph's nodes; gives a `Plan`:

* `flat` — a pointwise-only kernel, one 1-D block of `XBLOCK` elements per program;
* `tiled` — a pointwise-only kernel that reads some input transposed: 2-D `YBLOCK x XBLOCK`
  tiles, so both the transposed read and the contiguous write are coalesced (Triton converts
  the layout in shared memory);
* `persistent` — a kernel with reductions (or per-row members) whose row fits in one block:
  each program holds `XBLOCK` whole rows in registers and every member is one pass over them
  (softmax and layer norm read their input once);
* `looped` — rows too long for that: members loop over the row in `RBLOCK` chunks.

Block sizes and `num_warps` are simple rules by size and kind (no autotuning yet), chosen so a
memory-bound kernel moves 4 KiB-16 KiB per program.

Symbolic sizes (lower/symbolic.py): a plan's `xnumel`/`rnumel`/`ynumel` may be size expressions
(the kernel computes them from its size arguments; `grid` is then an expression the wrapper
evaluates per call), and every choice above is made from the size hints (the sizes first
seen), which only costs speed when wrong. What correctness depends on stays static: tiles only
where the grid's y extent is static (its limit is 65535), split reductions only over static
sizes; a persistent kernel over a symbolic row length is correct only while the row fits its
block, so the renderer pairs it with a looped kernel the wrapper launches past that
(`looped_plan`, renderer.py).

Why it exists: one place to tune; the renderer only prints what the plan says.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ...lower.indexing import FloorDiv, index_vars, memory_steps, reduce_vars
from ...lower.ir import Pointwise, Reduction, loads
from ...lower.symbolic import hint, is_symbolic
from ...schedule import Kernel
from ...schedule.fusion import transposed_read

FLAT_XBLOCK = 1024
PERSISTENT_MAX_RBLOCK = 4096  # a longer row is reduced in a loop
LOOPED_RBLOCK = 2048
TILE = 32
# reductions across rows (heuristics._reduces_across_rows): a tile of XBLOCK outputs x RBLOCK
# rows, loops over the rows; only worth it for a reduced extent of at least OUTER_MIN_RNUMEL
OUTER_XBLOCK = 32
OUTER_RBLOCK = 128
OUTER_MIN_RNUMEL = 64
# ...but with fewer outputs than OUTER_XBLOCK x OUTER_MIN_PROGRAMS, narrower tiles (down to
# 8 outputs: one 32-byte sector of float32) of more rows, so that more programs share the work:
# a layer norm's weight and bias gradients over 8192 x 768 took 190 us as 24 programs of 32
# outputs and 76 us as 96 programs of 8 outputs x 256 rows, 8 warps (H200)
OUTER_MIN_PROGRAMS = 128
OUTER_NARROW_XBLOCK = 8
OUTER_NARROW_ELEMENTS = 2048
MAX_GRID_Y = 65535
# ...and a kernel of such sums alone (nothing else reads them in it) over many rows splits its
# rows among programs as well: each adds a chunk of rows into a partial, and a second kernel
# adds the partials (split.py). A layer norm's three weight and bias sums over 8192 x 768 were
# 76 us as 96 programs of narrow tiles, the whole of each column in one program. About 2048
# programs: a column sum of 8192 x 3072 float32 (a GPT-2 MLP's bias gradient) took 47 us with
# 512 of them (6 chunks of 1408 rows), 28 us with 2048 and 26 us with 4096; 8192 x 2304 took
# 20, 22 and 22 us; 8192 x 768 7.5, 6.0 and 6.1 us (H200; benchmarks/gpu_column_sums.py's
# scratch version, benchmarks/RESULTS.md, eleventh session).
SPLIT_MIN_RNUMEL = 1024
SPLIT_TARGET_PROGRAMS = 2048
SPLIT_RBLOCK = 64


def cdiv(a, b: int):
    """ceil(a / b) of an int, or of a size expression (evaluated per call)."""
    if isinstance(a, int):
        return -(-a // b)
    return FloorDiv(a + (b - 1), b)


@dataclass(frozen=True)
class Plan:
    kind: str  # "flat" | "tiled" | "persistent" | "looped"
    xnumel: int | sympy.Expr  # an expression where sizes are symbolic (module doc)
    rnumel: int | sympy.Expr = 1
    ynumel: int | sympy.Expr = 1
    XBLOCK: int = 1
    RBLOCK: int = 1
    YBLOCK: int = 1
    num_warps: int = 4
    tile_split: int = 0  # tiled: members' dims [0, split) are y, the rest x
    split: int = 0  # looped: programs along the rows (each reduces `rchunk` rows), or 0
    rchunk: int = 0

    @property
    def grid(self) -> tuple:
        gx = cdiv(self.xnumel, self.XBLOCK)
        if self.kind == "tiled":
            return (gx, cdiv(self.ynumel, self.YBLOCK))
        if self.split:
            return (gx, self.split)
        return (gx,)

    @property
    def constexprs(self) -> dict[str, int]:
        if self.kind == "flat":
            return {"XBLOCK": self.XBLOCK}
        if self.kind == "tiled":
            return {"YBLOCK": self.YBLOCK, "XBLOCK": self.XBLOCK}
        return {"XBLOCK": self.XBLOCK, "RBLOCK": self.RBLOCK}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def warps_for(elements: int) -> int:
    """`num_warps` for a block of `elements` (split.py's finishing kernels use it too)."""
    if elements >= 8192:
        return 8
    if elements >= 2048:
        return 4
    if elements >= 512:
        return 2
    return 1


def _steps(ld, nodes: dict, names) -> list | None:
    """How far in memory load `ld` moves per step of each loop variable in `names`; None when
    its position is not affine in them alone."""
    return memory_steps(ld.index, nodes[ld.buf].layout.stride, names)


def _tile_split(kernel: Kernel, nodes: dict) -> int:
    """A split point that makes a transposed read coalesced, or 0 (no tiling)."""
    if len({tuple(nodes[m.name].size) for m in kernel.members}) != 1:
        return 0
    for m in kernel.members:
        hit = transposed_read(nodes[m.name], nodes)
        if hit:
            return hit[1] + 1
    return 0


def _reduces_across_rows(kernel: Kernel, nodes: dict) -> bool:
    """Do the kernel's reductions read memory that is contiguous along the kept dimension and
    strided along the reduced one (a column sum: a bias's or a norm weight's gradient, sum over
    the batch of a [rows, width] tensor)? Then a program reducing one output alone reads one
    element per cache line; `OUTER_XBLOCK` neighbouring outputs read whole lines together."""
    votes = []
    for m in kernel.members:
        node = nodes[m.name]
        if not isinstance(node, Reduction):
            continue
        xs = [v for v, n in zip(index_vars(len(node.size)), node.size) if n != 1]
        rs = [v for v, n in zip(reduce_vars(len(node.reduce_size)), node.reduce_size) if n != 1]
        if not xs or not rs:
            continue
        for ld in loads(node.body):
            coeffs = _steps(ld, nodes, xs + rs)
            if coeffs is None:
                continue
            x_step, r_step = coeffs[len(xs) - 1], coeffs[-1]
            if x_step or r_step:
                votes.append(x_step == 1 and r_step not in (0, 1))
    return bool(votes) and sum(votes) * 2 > len(votes)


def outer_blocks(outer: int, inner: int) -> tuple[int, int, int]:
    """(XBLOCK, RBLOCK, num_warps) of a reduction across rows: `outer` outputs, `inner` rows."""
    xb = min(OUTER_XBLOCK, next_pow2(outer))
    if -(-outer // xb) >= OUTER_MIN_PROGRAMS:
        rb = min(OUTER_RBLOCK, next_pow2(inner))
        return xb, rb, warps_for(xb * rb)
    while xb > OUTER_NARROW_XBLOCK and -(-outer // xb) < OUTER_MIN_PROGRAMS:
        xb //= 2
    rb = min(OUTER_NARROW_ELEMENTS // xb, next_pow2(inner))
    return xb, rb, 8 if xb * rb >= OUTER_NARROW_ELEMENTS else warps_for(xb * rb)


def splittable(kernel: Kernel, nodes: dict) -> bool:
    """Sums alone: every member a floating-point sum that is stored and that no other member
    reads (a partial sum is all a program has)."""
    names = {m.name for m in kernel.members}
    for m in kernel.members:
        node = nodes[m.name]
        if not isinstance(node, Reduction) or node.reduce_type != "sum" or m.per_row:
            return False
        if m.name in kernel.local or not node.dtype.is_floating_point:
            return False
        if any(ld.buf in names for ld in loads(node.body)):
            return False
    return True


def _split_plan(outer: int, inner: int) -> Plan | None:
    xb = min(OUTER_XBLOCK, next_pow2(outer))
    gx = -(-outer // xb)
    if gx >= OUTER_MIN_PROGRAMS:
        return None
    rb = min(SPLIT_RBLOCK, next_pow2(inner))
    split = min(-(-SPLIT_TARGET_PROGRAMS // gx), -(-inner // (4 * rb)))
    per_program = -(-inner // max(split, 1))
    chunk = -(-per_program // rb) * rb  # rows per program, in whole RBLOCKs
    split = -(-inner // chunk)
    if split < 2:
        return None
    return Plan("looped", outer, inner, 1, xb, rb, 1, warps_for(xb * rb), split=split, rchunk=chunk)


def plan(kernel: Kernel, nodes: dict) -> Plan:
    """The kernel's plan; sizes may be symbolic (module doc: choices read hints)."""
    numel = kernel.outer * kernel.inner
    pointwise_only = all(
        isinstance(nodes[m.name], Pointwise) and not m.per_row for m in kernel.members
    )
    if pointwise_only:
        split = _tile_split(kernel, nodes)
        if split:
            size = tuple(_static(s) for s in nodes[kernel.members[0].name].size)
            ynumel = 1
            for s in size[:split]:
                ynumel *= s
            xnumel = numel // ynumel if isinstance(numel, int) else sympy.Mul(*size[split:])
            yb, xb = min(TILE, next_pow2(hint(ynumel))), min(TILE, next_pow2(hint(xnumel)))
            # (a symbolic y extent could pass the grid's limit at some size: no tiles)
            if isinstance(ynumel, int) and -(-ynumel // yb) <= MAX_GRID_Y:
                return Plan("tiled", xnumel, 1, ynumel, xb, 1, yb, warps_for(xb * yb), split)
        xb = min(FLAT_XBLOCK, next_pow2(hint(numel)))
        return Plan("flat", numel, XBLOCK=xb, num_warps=warps_for(xb))
    inner, outer = kernel.inner, kernel.outer
    if hint(outer) > 1 and hint(inner) >= OUTER_MIN_RNUMEL and _reduces_across_rows(kernel, nodes):
        static = isinstance(inner, int) and isinstance(outer, int)
        if static and inner >= SPLIT_MIN_RNUMEL and splittable(kernel, nodes):
            split_plan = _split_plan(outer, inner)
            if split_plan is not None:
                return split_plan
        xb, rb, warps = outer_blocks(hint(outer), hint(inner))
        return Plan("looped", outer, inner, 1, xb, rb, 1, warps)
    rb = next_pow2(hint(inner))
    if rb <= PERSISTENT_MAX_RBLOCK:
        xb = min(next_pow2(hint(outer)), max(1, 2048 // rb), 64)
        return Plan("persistent", outer, inner, 1, xb, rb, 1, warps_for(xb * rb))
    return Plan("looped", outer, inner, 1, 1, LOOPED_RBLOCK, 1, warps_for(LOOPED_RBLOCK))


def looped_plan(persistent: Plan) -> Plan:
    """The looped twin of a persistent plan over a symbolic row length (module doc): the same
    tile of rows x RBLOCK, walked along rows of any length (a few steps for rows somewhat
    longer than the hint, as a decode's growing attention rows are)."""
    p = persistent
    return Plan("looped", p.xnumel, p.rnumel, 1, p.XBLOCK, p.RBLOCK, 1, p.num_warps)


def _static(s):
    """A size as an int where it is one (sympy's Integer too), else the expression."""
    return s if is_symbolic(s) else int(s)

"""The Triton renderer: scheduled kernels -> one Python module of `@triton.jit` functions.

Takes a `Schedule`; gives `TritonModule`: the source of every kernel of the graph (one module,
with the helper prelude of ops.py) and, per kernel, its pointer arguments (buffer names, in
order) and its launch plan (heuristics.py).

Shape of a kernel (schedule/fusion.py has the model): a pointwise-only kernel computes a block
of elements (`flat`) or a 2-D tile (`tiled`); a kernel with reductions gives each program
`XBLOCK` rows and walks each row with `rindex` — in one pass over registers when the row fits
(`persistent`), in `RBLOCK` chunks otherwise (`looped`). Members run in the scheduler's order;
a value one member reads from an earlier one of the same row stays in registers (in a looped
kernel an element value from an earlier loop is recomputed, never re-read from memory the same
kernel wrote). Expressions are emitted once per kernel, keyed by their text, so softmax's
`exp(x - max)` and its load of `x` are shared by the sum and the output. Half types are loaded
to float32, computed in float32 and rounded on store (values passed between members of a
kernel stay float32 unless they are explicit conversions; see `rounded`); masks appear only on
accesses whose block index overhangs its range.

Symbolic sizes (lower/symbolic.py): a kernel whose sizes or strides are size expressions takes
the size symbols it uses as integer arguments after its buffers (`TritonKernel.sizes`) and
computes `xnumel`, `rnumel` and indices from them; every block whose extent is symbolic is
masked (unless the extent is a provable multiple of the block). A persistent reduction over a
symbolic row length gets a looped twin (`TritonKernel.looped`) that the wrapper launches when a
call's rows are longer than the persistent block. Static kernels are rendered exactly as before.

Why it exists: the renderer half of the cuda device (STYLE.md item 5); it knows Triton syntax
and nothing about compiling or launching.
"""

from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ...lower.indexing import index_vars, linearize, reduce_vars
from ...lower.ir import Const, IndexValue, Load, Op, Pointwise, Reduction, reindex, walk
from ...lower.symbolic import hint, is_symbolic
from ...schedule import Kernel
from .heuristics import Plan, looped_plan, plan
from .indexing import (
    RINDEX,
    XINDEX,
    YINDEX,
    bind,
    extent,
    mask_for,
    size_symbols,
    store_index,
    symbolic_extent,
    tl_str,
)
from .kernel import TritonKernel
from .ops import (
    BITS,
    HALF_TYPES,
    REDUCE_ACCUMULATE,
    REDUCE_BLOCK,
    TL_TYPES,
    compute_tl,
    op_template,
    reduce_identity,
    render_const,
    store_cast,
)
from .split import render_finish, store_partial


class _KernelContext:
    def __init__(self, kernel: Kernel, nodes: dict, p: Plan, emulate_casts: bool = False) -> None:
        self.kernel, self.nodes, self.plan = kernel, nodes, p
        self.emulate_casts = emulate_casts  # round every half-typed member value, as eager does
        self.members = {m.name: m for m in kernel.members}
        self.lines: list[str] = []
        self.indent = "    "
        self.cache: dict[str, str] = {}  # emitted text -> variable holding it
        self.values: dict[str, str] = {}  # member -> variable with its value (row or element)
        self.params: dict[str, bool] = {}  # buffer -> written by this kernel
        self.workspaces: list[tuple] = []  # split reductions: (name, size, dtype) of partials
        self.masked: set = set()  # block indices whose blocks overhang their range
        self.rank = 1 if p.kind == "flat" else 2
        self.sizes: set = set()  # size symbols the kernel's text uses (its size arguments)
        self._ids = 0

    def tl(self, e) -> str:
        """`tl_str(e)`, noting the size symbols it uses."""
        self.sizes |= size_symbols(e)
        return tl_str(e)

    def fresh(self, prefix: str = "tmp") -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    def line(self, text: str) -> None:
        self.lines.append(self.indent + text)

    def assign(self, text: str, prefix: str = "tmp") -> str:
        hit = self.cache.get(text)
        if hit is not None:
            return hit
        var = self.fresh(prefix)
        self.line(f"{var} = {text}")
        self.cache[text] = var
        return var

    def param(self, name: str, written: bool = False) -> str:
        self.params[name] = self.params.get(name, False) or written
        return name

    def full(self, value, dtype: torch.dtype) -> str:
        shape = "[" + ", ".join(["1"] * self.rank) + "]"
        if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
            # Triton builds a constant equal to 0 as +0.0 whatever its sign, and negates by
            # subtracting from 0: -0.0 is spelled as its bits (the sign bit alone)
            ty = compute_tl(dtype)
            bits = (
                ("-9223372036854775808", "tl.int64")
                if ty == "tl.float64"
                else ("-2147483648", "tl.int32")
            )
            return f"tl.full({shape}, {bits[0]}, {bits[1]}).to({ty}, bitcast=True)"
        return f"tl.full({shape}, {render_const(value, dtype)}, {compute_tl(dtype)})"

    # -- expressions ------------------------------------------------------------------------
    def emit(self, expr, groups) -> str:
        names: dict = {}
        for e in walk(expr):
            if isinstance(e, Const):
                names[e] = self.assign(self.full(e.value, e.dtype))
            elif isinstance(e, Load):
                names[e] = self.load(e, groups)
            elif isinstance(e, IndexValue):
                idx = bind(e.expr, groups)
                if idx.free_symbols:
                    names[e] = self.assign(f"({self.tl(idx)}).to({compute_tl(e.dtype)})")
                else:
                    names[e] = self.assign(self.full(int(idx), e.dtype))
            else:
                assert isinstance(e, Op)
                args = [names[a] for a in e.args]
                if self._keeps_float32(e):
                    names[e] = args[0]
                    continue
                arg_dtype = e.args[1].dtype if e.op == "where" else e.args[0].dtype
                tpl = op_template(e.op, arg_dtype, e.dtype)
                text = tpl.format(
                    *args, T=compute_tl(e.dtype), H=TL_TYPES[e.dtype], bits=BITS.get(e.dtype, 64)
                )
                names[e] = self.assign(text)
        return names[expr]

    def _keeps_float32(self, e: Op) -> bool:
        """A conversion to a half type of a computed value (an inlined op's result) is not
        rounded unless `emulate_casts`: see `rounded`."""
        return (
            e.op == "to"
            and e.dtype in HALF_TYPES
            and not self.emulate_casts
            and isinstance(e.args[0], Op)
            and e.args[0].dtype == torch.float32
        )

    def load(self, ld: Load, groups) -> str:
        if ld.buf in self.values:
            return self.values[ld.buf]
        node = self.nodes[ld.buf]
        if ld.buf in self.members:
            # An element value of an earlier loop of this kernel: recompute, do not re-read.
            body = reindex(node.body, dict(zip(index_vars(len(node.size)), ld.index)))
            return self.rounded(self.emit(body, groups), node)
        lay = node.layout
        # No `lay.offset`: a kernel's pointer argument is the tensor's data_ptr(), which
        # already points at its first element (an input slice, a split returned by an extern
        # call). Adding the storage offset again read another chunk, or past the buffer.
        pos = bind(linearize(ld.index, lay.stride), groups)
        mask = mask_for(pos, self.masked)
        extra = f", mask={mask}, other=0" if mask else ""
        text = f"tl.load({self.param(ld.buf)} + ({self.tl(pos)}){extra})"
        if lay.dtype in HALF_TYPES:
            text += ".to(tl.float32)"
        return self.assign(text)

    def rounded(self, var: str, node) -> str:
        """A member's value as a later member of the kernel reads it.

        A half-typed result of arithmetic stays float32 in registers (as torch.compile does:
        more accurate than eager, which rounds every op's result, and cheaper); an explicit
        conversion to a half type (a member that only loads and converts) is rounded, so
        `x.to(torch.bfloat16)` means what the user wrote. `emulate_casts` rounds everything."""
        explicit = isinstance(node, Pointwise) and _is_conversion(node.body)
        if node.dtype in HALF_TYPES and (self.emulate_casts or explicit):
            return self.assign(op_template("to", torch.float32, node.dtype).format(var))
        return var

    def store(self, node, var: str, groups) -> None:
        if node.name in self.kernel.local:
            return
        pos = store_index(tuple(node.size), groups)
        mask = mask_for(pos, self.masked)
        extra = f", mask={mask}" if mask else ""
        ptr = self.param(node.name, True)
        # a single element still needs a block pointer when its value is a block
        where = self.tl(pos) if pos.free_symbols else f"{self.tl(pos)} + 0*xindex"
        self.line(f"tl.store({ptr} + ({where}), {store_cast(node.dtype).format(var)}{extra})")


# -- member groups: how a member's loop variables come from the block indices ----------------


def _groups(ctx: _KernelContext, node, member):
    vs = index_vars(len(node.size))
    size = tuple(node.size)
    p = ctx.plan
    if p.kind == "flat":
        return [(vs, size, XINDEX)]
    if p.kind == "tiled":
        k = p.tile_split
        return [(vs[:k], size[:k], YINDEX), (vs[k:], size[k:], XINDEX)]
    if isinstance(node, Reduction):
        return [(vs, size, XINDEX), (reduce_vars(len(node.reduce_size)), node.reduce_size, RINDEX)]
    if member.per_row:
        return [(vs, size, XINDEX)]
    k = member.split
    return [(vs[:k], size[:k], XINDEX), (vs[k:], size[k:], RINDEX)]


def _pointwise(ctx: _KernelContext, member) -> None:
    node = ctx.nodes[member.name]
    groups = _groups(ctx, node, member)
    var = ctx.emit(node.body, groups)
    ctx.store(node, var, groups)
    ctx.values[node.name] = ctx.rounded(var, node)


def _block(ctx: _KernelContext, var: str, dtype: torch.dtype) -> str:
    return ctx.assign(f"tl.broadcast_to({var}, [XBLOCK, RBLOCK])")


def _identity_literal(rtype: str, dtype: torch.dtype):
    text = reduce_identity(rtype, dtype)
    return eval(text, {"float": float})  # a literal from ops.py's table, never user input


def _reduce_persistent(ctx: _KernelContext, member) -> str:
    node = ctx.nodes[member.name]
    groups = _groups(ctx, node, member)
    bdt = node.body.dtype
    value = _block(ctx, ctx.emit(node.body, groups), bdt)
    rtype = node.reduce_type
    if rtype in ("argmax", "argmin"):
        value = _masked_value(ctx, value, rtype, bdt)
        ridx = ctx.assign("tl.broadcast_to(rindex, [XBLOCK, RBLOCK])")
        res = ctx.fresh("red")
        ctx.line(f"_, {res} = tl.reduce(({value}, {ridx}), 1, _{rtype}_combine, keep_dims=True)")
        return ctx.assign(f"{res}.to(tl.int64)")
    value = _masked_value(ctx, value, rtype, bdt)
    return ctx.assign(REDUCE_BLOCK[rtype].format(v=value), "red")


def _masked_value(ctx: _KernelContext, value: str, rtype: str, dtype: torch.dtype) -> str:
    if RINDEX not in ctx.masked:
        return value
    ident = ctx.assign(ctx.full(_identity_literal(rtype, dtype), dtype))
    return ctx.assign(f"tl.where(rmask, {value}, {ident})")


def _reduce_looped(ctx: _KernelContext, member) -> str:
    node = ctx.nodes[member.name]
    groups = _groups(ctx, node, member)
    bdt = node.body.dtype
    rtype = node.reduce_type
    arg = rtype in ("argmax", "argmin")
    acc = ctx.fresh("acc")
    ident = render_const(_identity_literal(rtype, bdt), bdt)
    acc_t = "tl.int1" if rtype in ("any", "all") else compute_tl(bdt)
    ctx.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {ident}, {acc_t})")
    if arg:
        ctx.line(f"{acc}_i = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int32)")
    saved = dict(ctx.cache)
    _loop_head(ctx)
    value = _masked_value(ctx, _block(ctx, ctx.emit(node.body, groups), bdt), rtype, bdt)
    if arg:
        ridx = ctx.assign("tl.broadcast_to(rindex, [XBLOCK, RBLOCK])")
        ctx.line(f"{acc}, {acc}_i = _{rtype}_combine({acc}, {acc}_i, {value}, {ridx})")
    else:
        ctx.line(f"{acc} = " + REDUCE_ACCUMULATE[rtype].format(acc=acc, v=value))
    _loop_tail(ctx, saved)
    if arg:
        res = ctx.fresh("red")
        ctx.line(f"_, {res} = tl.reduce(({acc}, {acc}_i), 1, _{rtype}_combine, keep_dims=True)")
        return ctx.assign(f"{res}.to(tl.int64)")
    return ctx.assign(REDUCE_BLOCK[rtype].format(v=acc), "red")


def _loop_head(ctx: _KernelContext) -> None:
    p = ctx.plan
    ctx.line(f"for roffset in range(0, {ctx.tl(p.rchunk if p.split else p.rnumel)}, RBLOCK):")
    ctx.indent += "    "
    ctx.line("rindex = rstart + roffset + rbase" if p.split else "rindex = roffset + rbase")
    if RINDEX in ctx.masked:
        ctx.line(f"rmask = rindex < {ctx.tl(ctx.plan.rnumel)}")


def _loop_tail(ctx: _KernelContext, saved: dict) -> None:
    ctx.indent = ctx.indent[:-4]
    ctx.cache = saved  # values computed inside the loop do not outlive it


def _reduction(ctx: _KernelContext, member) -> None:
    node = ctx.nodes[member.name]
    if ctx.plan.kind == "looped":
        var = _reduce_looped(ctx, member)
    else:
        var = _reduce_persistent(ctx, member)
    if ctx.plan.split:
        store_partial(ctx, node, var)
        return
    ctx.store(node, var, [(index_vars(len(node.size)), tuple(node.size), XINDEX)])
    ctx.values[node.name] = ctx.rounded(var, node)


def _header(ctx: _KernelContext, wide: bool) -> list[str]:
    p = ctx.plan
    pid = "tl.program_id({})" + (".to(tl.int64)" if wide else "")
    out = []
    for n in (p.xnumel, p.ynumel, p.rnumel):
        ctx.sizes |= size_symbols(n)
    if p.kind == "flat":
        xindex = f"xindex = {pid.format(0)} * XBLOCK + tl.arange(0, XBLOCK)"
        out += [f"xnumel = {tl_str(p.xnumel)}", xindex]
        if XINDEX in ctx.masked:
            out.append("xmask = xindex < xnumel")
        return out
    if p.kind == "tiled":
        out += [
            f"ynumel = {tl_str(p.ynumel)}",
            f"xnumel = {tl_str(p.xnumel)}",
            f"yindex = {pid.format(1)} * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
            f"xindex = {pid.format(0)} * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
        ]
        out += ["ymask = yindex < ynumel"] if YINDEX in ctx.masked else []
        out += ["xmask = xindex < xnumel"] if XINDEX in ctx.masked else []
        return out
    out += [
        f"xnumel = {tl_str(p.xnumel)}",
        f"xindex = {pid.format(0)} * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
    ]
    out += ["xmask = xindex < xnumel"] if XINDEX in ctx.masked else []
    if p.kind == "persistent":
        out.append("rindex = tl.arange(0, RBLOCK)[None, :]")
        out += [f"rmask = rindex < {tl_str(p.rnumel)}"] if RINDEX in ctx.masked else []
    else:
        out.append("rbase = tl.arange(0, RBLOCK)[None, :]")
        if p.split:  # this program's chunk of the rows (split.py)
            out.append(f"rstart = {pid.format(1)} * {p.rchunk}")
    return out


def _overhangs(n, block: int) -> bool:
    """Does the last block of `block` over `n` elements overhang? A size expression does
    unless it is a multiple of `block` for every value of its symbols (`64*s0` of 32)."""
    if is_symbolic(n):
        return block != 1 and sympy.Mod(n, block) != 0
    return bool(n % block)


def _masked_blocks(p: Plan) -> set:
    out = set()
    if _overhangs(p.xnumel, p.XBLOCK):
        out.add(XINDEX)
    if p.kind == "tiled" and _overhangs(p.ynumel, p.YBLOCK):
        out.add(YINDEX)
    # a symbolic row length may be 0 (or shorter than a block) at some call: always masked
    rows = p.kind in ("persistent", "looped")
    if rows and (is_symbolic(p.rnumel) or p.rnumel % p.RBLOCK or p.rnumel == 0):
        out.add(RINDEX)
    if p.split and p.split * p.rchunk != p.rnumel:  # the last chunk overhangs
        out.add(RINDEX)
    return out


def _wide(kernel: Kernel, nodes: dict, names) -> bool:
    """64-bit indices when some buffer this kernel touches spans 2**31 elements or more."""
    limit = 2**31 - 1
    return hint(kernel.outer * kernel.inner) >= limit or any(
        extent(nodes[n].layout) >= limit for n in names
    )


def _reach(kernel: Kernel, nodes: dict, names, sizes: set) -> tuple:
    """The size expressions a 32-bit kernel over symbolic sizes must keep below 2**31 (its
    element count, the extents of the buffers it touches): `_wide` decided by the hints, and
    the wrapper checks these per call (wrapper.py). Only expressions over the kernel's own size
    arguments, which the wrapper has bound."""
    out = [kernel.outer * kernel.inner] + [symbolic_extent(nodes[n].layout) for n in names]
    return tuple(dict.fromkeys(e for e in out if is_symbolic(e) and size_symbols(e) <= sizes))


def _is_conversion(body) -> bool:
    while isinstance(body, Op) and body.op == "to":
        body = body.args[0]
    return isinstance(body, (Load, Const))


def render_kernel(
    kernel: Kernel, nodes: dict, emulate_casts: bool = False, p: Plan | None = None
) -> TritonKernel:
    p = p if p is not None else plan(kernel, nodes)
    ctx = _KernelContext(kernel, nodes, p, emulate_casts)
    ctx.masked = _masked_blocks(p)
    members = list(kernel.members)
    while members:
        m = members.pop(0)
        node = nodes[m.name]
        if isinstance(node, Reduction):
            _reduction(ctx, m)
        elif p.kind != "looped" or m.per_row:
            _pointwise(ctx, m)
        else:
            group = [m]
            while (
                members and not members[0].per_row and isinstance(nodes[members[0].name], Pointwise)
            ):
                group.append(members.pop(0))
            saved, saved_values = dict(ctx.cache), dict(ctx.values)
            _loop_head(ctx)
            for g in group:
                _pointwise(ctx, g)
            _loop_tail(ctx, saved)
            ctx.values = saved_values  # element values are only valid inside their loop
    params = tuple(ctx.params)
    buffers = [x for x in params if x in nodes]
    wide = _wide(kernel, nodes, buffers)
    consts = ", ".join(f"{k}: tl.constexpr" for k in p.constexprs)
    header = ["    " + h for h in _header(ctx, wide)]
    # (after the header, which notes the symbols of the numels it prints)
    reach = () if wide else _reach(kernel, nodes, buffers, ctx.sizes)
    sizes = tuple(sorted(map(str, ctx.sizes), key=_symbol_order))
    args = ", ".join(params + sizes)
    lines = ["@triton.jit", f"def {kernel.name}({args}, {consts}):", *header, *ctx.lines]
    source = "\n".join(lines)
    if not p.split:
        looped = None
        if p.kind == "persistent" and is_symbolic(p.rnumel):
            # correct only while a row fits RBLOCK: longer rows take a looped twin
            twin = dataclasses.replace(kernel, name=kernel.name + "_looped")
            looped = render_kernel(twin, nodes, emulate_casts, looped_plan(p))
        return TritonKernel(kernel.name, params, p, source, sizes=sizes, looped=looped, reach=reach)
    finish = render_finish(kernel.name, ctx.workspaces, nodes, p)
    return TritonKernel(kernel.name, params, p, source, tuple(ctx.workspaces), finish)


def _symbol_order(name: str) -> tuple:
    return (len(name), name)  # s2 before s10

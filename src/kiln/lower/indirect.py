"""Lowerings of indexing ops that read at indices loaded from memory: embedding, gather,
index_select, take and advanced indexing (`aten.index.Tensor`).

Takes ATen calls through the registry; gives one `Pointwise` whose body loads the source at an
index holding an `Indirect` term (`wte[indirect(idx[i0, i1], 50257), i2]`), so the gather fuses
with whatever reads it (embedding + add + layer norm is one kernel) — and, once per index
tensor, a bounds check: two reductions over the indices (is any out of range, and the largest
one that is) and an extern call to `kiln.check_index`, which raises the error eager raises
(IndexError; RuntimeError for gather) with the bad index in the message. Renderers clamp every
indirect index into range, so the kernels never read outside a buffer whatever order the check
runs in.

An index tensor that is a pure function of position (an `arange`) needs no memory read: its
expression is substituted, and when it provably stays in range there is no check either; nor
is there one for indices that are argmax/argmin positions within the indexed dimension.

Why it exists: as extern calls these ops each wrote a full tensor that the next kernel read
back; lowered, the gathered rows go straight into the consumer's registers. Only devices whose
renderer supports `Indirect` get these lowerings (`LoweringContext.indirect_loads`); the others
keep the extern call, with that reason logged.
"""

from __future__ import annotations

import math

import sympy
import torch

from ..devices.runtime_ops import CHECK_INDEX
from . import ops
from .hints import is_symbolic
from .indexing import (
    Indirect,
    affine_coefficients,
    delinearize,
    index_vars,
    is_affine,
    reduce_vars,
)
from .ir import BufRef, Expr, Extern, IndexValue, Op, Pointwise, Reduction, View, compute_dtype
from .registry import Unsupported, register_lowering

INDEX_DTYPES = (torch.int64, torch.int32)
INT64_MIN = -(2**63)

# -- the run-time check (the op itself: devices/runtime_ops.py) -------------------------------


def _add_check(ctx, idx: BufRef, size: int, wrap: bool, dim: int) -> None:
    """Raise at run time, as eager does, if an element of `idx` is outside the dimension."""
    index_error = "gather" not in str(ctx.op)  # eager's gather raises RuntimeError
    key = (idx.name, size, wrap, index_error)
    if key in ctx.checks and ctx.checks[key] in ctx.nodes:  # (nodes roll back on Unsupported)
        return
    shape = ctx.size(idx)
    v = ctx.load(idx, reduce_vars(len(shape)), torch.int64)
    lo = -size if wrap else 0
    bad = ops.op("logical_or", ops.op("lt", v, _i64(lo)), ops.op("ge", v, _i64(size)))
    flag = ctx.reduction((), torch.bool, "any", shape, bad)
    worst = ctx.reduction((), torch.int64, "max", shape, ops.where(bad, v, _i64(INT64_MIN)))
    name = ctx.fresh("check")
    args = (flag, worst, str(ctx.op), dim, size, index_error)
    ctx.add(Extern(name, CHECK_INDEX, args, (), (None,), False, "bounds check of indices"))
    ctx.checks[key] = name


def _i64(v):
    if is_symbolic(v):  # a symbolic size: its value, read per call
        return ops.IndexValue(v, torch.int64)
    return ops.const(v, torch.int64)


# -- index values ------------------------------------------------------------------------------


def index_term(ctx, idx: BufRef, at, size: int, *, wrap: bool, dim: int, ranges: dict):
    """The index `idx[at]` into a dimension of `size`, as a sympy term of the loop index.

    `ranges` gives the extent of each loop variable in `at` (to prove a positional index in
    range). Adds the bounds check when the value is read from memory."""
    if not ctx.indirect_loads:
        raise Unsupported("this device's renderer has no indirect loads (Triton keeps the call)")
    if ctx.dtype(idx) not in INDEX_DTYPES:
        raise Unsupported(f"indices of dtype {ctx.dtype(idx)}")
    if size == 0:
        raise Unsupported("indexing an empty dimension (an error in eager for any index)")
    at = tuple(sympy.sympify(a) for a in at)
    positional = _positional(ctx, idx, at)
    if positional is not None:
        if wrap:
            positional = _wrapped(positional, size, ranges)
        if positional is not None and _in_range(positional, size, ranges):
            return positional
    node, at = _resolved(ctx, idx, at)
    if not _positions_of_at_most(node, size):
        _add_check(ctx, idx, size, wrap, dim)
    return Indirect.make(node.name, at, size, wrap)


def _resolved(ctx, idx: BufRef, at):
    """(the node holding `idx`'s values, the index into it): a view is read at its base."""
    node = ctx.nodes[idx.name]
    if isinstance(node, View):
        sub = dict(zip(index_vars(len(node.size)), at))
        return ctx.nodes[node.base], tuple(e.xreplace(sub) for e in node.index)
    return node, at


def _positions_of_at_most(node, size: int) -> bool:
    """True if every value of `node` is a position in [0, size): argmax/argmin over no more
    than `size` elements (`x.gather(1, x.argmax(1, keepdim=True))` needs no check)."""
    if not isinstance(node, Reduction) or node.reduce_type not in ("argmax", "argmin"):
        return False
    count = math.prod(node.reduce_size)
    if is_symbolic(count) or is_symbolic(size):  # equal expressions: provably within
        return count == size
    return count <= size


def _positional(ctx, idx: BufRef, at):
    """`idx[at]` as an index expression if `idx` is computed from positions only (arange)."""
    node, at = _resolved(ctx, idx, at)
    body: Expr | None = node.body if isinstance(node, Pointwise) else None
    while isinstance(body, Op) and body.op == "to" and not body.dtype.is_floating_point:
        body = body.args[0]
    if not isinstance(body, IndexValue):
        return None
    return body.expr.xreplace(dict(zip(index_vars(len(node.size)), at)))


def _bounds(expr, ranges: dict):
    """(min, max) of an affine `expr` over the loop variables' ranges, or None."""
    vs = sorted(expr.free_symbols, key=str)
    if any(v not in ranges or is_symbolic(ranges[v]) for v in vs) or not is_affine(expr, vs):
        return None  # (a symbolic extent: unknown bounds, so the index is checked)
    coeffs, const = affine_coefficients(expr, vs)
    lo = const + sum(min(0, c * (ranges[v] - 1)) for c, v in zip(coeffs, vs))
    hi = const + sum(max(0, c * (ranges[v] - 1)) for c, v in zip(coeffs, vs))
    return lo, hi


def _in_range(expr, size: int, ranges: dict) -> bool:
    b = _bounds(expr, ranges)
    return b is not None and not is_symbolic(size) and 0 <= b[0] and b[1] < size


def _wrapped(expr, size: int, ranges: dict):
    b = _bounds(expr, ranges)
    if b is None:
        return None
    if b[0] >= 0:
        return expr
    return expr + size if b[1] < 0 else None


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _gathered(ctx, src: BufRef, index) -> BufRef:
    out_dtype = ctx.out_dtype
    return ctx.pointwise(ctx.out_size, out_dtype, ctx.load(src, index, compute_dtype(out_dtype)))


def _ranges(size) -> dict:
    return dict(zip(index_vars(len(size)), size))


# -- lowerings ---------------------------------------------------------------------------------


@register_lowering("embedding.default")
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if len(ctx.size(weight)) != 2:
        raise Unsupported("embedding weight is not 2-D")
    out = ctx.out_size
    vs = index_vars(len(out))
    rows = ctx.size(weight)[0]
    row = index_term(ctx, indices, vs[:-1], rows, wrap=False, dim=0, ranges=_ranges(out))
    return _gathered(ctx, weight, (row, vs[-1]))


@register_lowering("index_select.default")
def _index_select(ctx, x, dim, index):
    own = ctx.size(x)
    if not own:  # a 0-d tensor is one element: every index must be 0
        at = index_vars(len(ctx.size(index)))
        index_term(ctx, index, at, 1, wrap=False, dim=0, ranges=_ranges(ctx.size(index)))
        return _gathered(ctx, x, ())
    dim = _dim(dim, len(own))
    out = ctx.out_size
    vs = list(index_vars(len(out)))
    at = (vs[dim],) if len(ctx.size(index)) == 1 else ()
    vs[dim] = index_term(ctx, index, at, own[dim], wrap=False, dim=dim, ranges=_ranges(out))
    return _gathered(ctx, x, vs)


@register_lowering("take.default")
def _take(ctx, x, index):
    """`x.flatten()[index]`, negative indices counting from the end."""
    own = ctx.size(x)
    out = ctx.out_size
    n = math.prod(own)
    flat = index_term(ctx, index, index_vars(len(out)), n, wrap=True, dim=0, ranges=_ranges(out))
    return _gathered(ctx, x, delinearize(flat, own) if own else ())


@register_lowering("gather.default")
def _gather(ctx, x, dim, index, sparse_grad=False):
    own, isz = ctx.size(x), ctx.size(index)
    out = ctx.out_size
    if not own or not isz:  # a 0-d tensor counts as one of size 1
        if len(own) > 1 or len(isz) > 1:
            raise Unsupported("gather between a 0-d and a multi-dimensional tensor")
        at = index_vars(len(isz))
        v = index_term(ctx, index, at, own[0] if own else 1, wrap=False, dim=0, ranges=_ranges(isz))
        return _gathered(ctx, x, (v,) if own else ())
    if len(isz) != len(own):
        raise Unsupported("gather with index and source of different ranks")
    dim = _dim(dim, len(own))
    vs = list(index_vars(len(out)))
    vs[dim] = index_term(ctx, index, vs, own[dim], wrap=False, dim=dim, ranges=_ranges(out))
    return _gathered(ctx, x, vs)


@register_lowering("index.Tensor")
def _index(ctx, x, indices):
    """Advanced indexing: tensor indices broadcast together to a shape B; B's dims replace the
    indexed dims where they are adjacent, else they come first (numpy's rule)."""
    own = ctx.size(x)
    indices = list(indices) + [None] * (len(own) - len(indices))
    picked = [d for d, t in enumerate(indices) if t is not None]
    if not picked:
        raise Unsupported("no tensor index")
    for d in picked:
        if ctx.dtype(indices[d]) not in INDEX_DTYPES:
            raise Unsupported(f"a {ctx.dtype(indices[d])} index (a mask: data-dependent shape)")
    shape_b = tuple(torch.broadcast_shapes(*(ctx.size(indices[d]) for d in picked)))
    rest = [d for d in range(len(own)) if d not in picked]
    adjacent = picked == list(range(picked[0], picked[-1] + 1))
    first = picked[0] if adjacent else 0
    out = ctx.out_size
    expected = [own[d] for d in rest]
    expected[first:first] = shape_b
    if tuple(expected) != tuple(out):
        raise Unsupported(f"unexpected output shape {out} (expected {tuple(expected)})")
    vs = index_vars(len(out))
    b_vars = vs[first : first + len(shape_b)]
    rest_vars = vs[:first] + vs[first + len(shape_b) :]
    index = [None] * len(own)
    for d, v in zip(rest, rest_vars):
        index[d] = v
    for d in picked:
        t_size = ctx.size(indices[d])
        lead = len(shape_b) - len(t_size)
        at = [
            0 if s == 1 and shape_b[lead + k] != 1 else b_vars[lead + k]
            for k, s in enumerate(t_size)
        ]
        index[d] = index_term(ctx, indices[d], at, own[d], wrap=True, dim=d, ranges=_ranges(out))
    return _gathered(ctx, x, index)

"""Lowerings of view ops (index remappings, no copy), `cat`, padding, scatters and creation ops.

Takes ATen calls through the registry; gives `View` nodes for `view`/`reshape`/`permute`/
`transpose`/`expand`/`slice`/`select`/`squeeze`/`unsqueeze`, a tuple of them for `split`/
`split_with_sizes`/`chunk`/`unbind` (one view a piece, so the wrapper calls nothing), and
`Pointwise` nodes for `cat`, `constant_pad_nd`, `slice_scatter`/`select_scatter`, `full`,
`arange` and friends (created on the graph's device only).

Why it exists: a view costs nothing when a kernel reads through it, so views are index
expressions, not buffers. Ops that pick between inputs by position (`cat`, pads, scatters)
clamp every branch's index into range before `where` chooses, so no branch ever reads out of
bounds even though the C++ renderer evaluates all of them.
"""

from __future__ import annotations

import sympy
import torch

from . import ops
from .indexing import clamp, index_vars, reshape_indexer
from .ir import BufRef, compute_dtype
from .registry import Unsupported, register_lowering
from .symbolic import from_torch, is_symbolic, size_bounds


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@register_lowering("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(ctx, x, size):
    new = ctx.out_size
    old = ctx.size(x)
    return ctx.view(x, new, reshape_indexer(old, new, index_vars(len(new))))


@register_lowering("alias.default", "detach.default", "lift_fresh.default")
def _alias(ctx, x):
    return x


@register_lowering("permute.default")
def _permute(ctx, x, dims):
    n = len(ctx.size(x))
    dims = [_dim(d, n) for d in dims]
    vs = index_vars(n)
    index = [None] * n
    for k, d in enumerate(dims):
        index[d] = vs[k]
    return ctx.view(x, ctx.out_size, index)


@register_lowering("transpose.int")
def _transpose(ctx, x, d0, d1):
    n = len(ctx.size(x))
    if n == 0:
        return x
    d0, d1 = _dim(d0, n), _dim(d1, n)
    vs = list(index_vars(n))
    vs[d0], vs[d1] = vs[d1], vs[d0]
    return ctx.view(x, ctx.out_size, vs)


@register_lowering("t.default")
def _t(ctx, x):
    n = len(ctx.size(x))
    return ctx.view(x, ctx.out_size, list(reversed(index_vars(n))))


@register_lowering("expand.default")
def _expand(ctx, x, size, implicit=False):
    out = ctx.out_size
    own = ctx.size(x)
    vs = index_vars(len(out))
    lead = len(out) - len(own)
    index = [0 if own[k] == 1 and out[lead + k] != 1 else vs[lead + k] for k in range(len(own))]
    return ctx.view(x, out, index)


@register_lowering("slice.Tensor")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    own = ctx.size(x)
    dim = _dim(dim, len(own))
    start = 0 if start is None else start
    start = start + own[dim] if start < 0 else start
    if not is_symbolic(own[dim]) and not is_symbolic(start):
        start = max(0, min(own[dim], start))
    # (symbolic: the shape environment's guards say the start is within the dimension, as the
    # fake output's size says; a start past the end gives an empty result that reads nothing)
    vs = list(index_vars(len(own)))
    vs[dim] = start + step * vs[dim]
    return ctx.view(x, ctx.out_size, vs)


@register_lowering("select.int")
def _select(ctx, x, dim, index):
    own = ctx.size(x)
    dim = _dim(dim, len(own))
    index = index + own[dim] if index < 0 else index
    vs = list(index_vars(len(own) - 1))
    return ctx.view(x, ctx.out_size, vs[:dim] + [sympy.Integer(index)] + vs[dim:])


@register_lowering(
    "split.Tensor",
    "split_with_sizes.default",
    "unsafe_split.Tensor",
    "unsafe_split_with_sizes.default",
    "chunk.default",
)
def _split(ctx, x, _sizes, dim=0):
    # Consecutive pieces along `dim`, each a view at its offset; their sizes are read off
    # eager's outputs, which settles the rounding of `split` and `chunk` once.
    n = len(ctx.size(x))
    dim = _dim(dim, n)
    pieces, start = [], 0
    for out in ctx.out:
        vs = list(index_vars(n))
        vs[dim] = start + vs[dim]
        pieces.append(ctx.view(x, out.shape, vs))
        start += from_torch(out.shape[dim])
    return tuple(pieces)


@register_lowering("unbind.int")
def _unbind(ctx, x, dim=0):
    n = len(ctx.size(x))
    dim = _dim(dim, n)
    vs = list(index_vars(n - 1))
    return tuple(
        ctx.view(x, out.shape, vs[:dim] + [sympy.Integer(k)] + vs[dim:])
        for k, out in enumerate(ctx.out)
    )


@register_lowering("squeeze.dim", "squeeze.dims", "squeeze.default", "unsqueeze.default")
def _squeeze(ctx, x, *dims):
    # Both are reshapes that only add or drop size-1 dims; the reshape indexer maps them.
    new = ctx.out_size
    return ctx.view(x, new, reshape_indexer(ctx.size(x), new, index_vars(len(new))))


@register_lowering("cat.default")
def _cat(ctx, tensors, dim=0):
    size, out_dtype = ctx.out_size, ctx.out_dtype
    compute = compute_dtype(out_dtype)
    tensors = [t for t in tensors if not (len(ctx.size(t)) == 1 and ctx.size(t)[0] == 0)]
    if not tensors:
        raise Unsupported("cat of empty tensors only")
    dim = _dim(dim, len(size))
    vs = index_vars(len(size))
    pieces, offset = [], 0
    for t in tensors:
        extent = ctx.size(t)[dim]
        if extent == 0:
            continue
        idx = list(vs)
        idx[dim] = clamp(vs[dim] - offset, 0, extent - 1, {vs[dim]: size[dim]})
        pieces.append((offset + extent, ctx.load(t, idx, compute)))
        offset += extent
    body = pieces[-1][1]
    for end, value in reversed(pieces[:-1]):
        body = ops.where(_lt(vs[dim], end), value, body)
    return ctx.pointwise(size, out_dtype, body)


def _lt(var, bound):
    return ops.op("lt", ops.IndexValue(var, torch.int64), _int(bound))


def _int(value):
    """An integer operand: a constant, or a size expression's value (symbolic sizes)."""
    if is_symbolic(value):
        return ops.IndexValue(value, torch.int64)
    return ops.const(value, torch.int64)


def _in_range(var, lo, hi):
    a = ops.op("ge", ops.IndexValue(var, torch.int64), _int(lo))
    return ops.op("logical_and", a, _lt(var, hi))


@register_lowering("constant_pad_nd.default")
def _pad(ctx, x, pad, value=0):
    size, out_dtype = ctx.out_size, ctx.out_dtype
    own = ctx.size(x)
    if any(size_bounds(p)[0] < 0 for p in pad):
        raise Unsupported("negative padding (or a symbolic one not provably nonnegative)")
    vs = index_vars(len(size))
    idx, inside = list(vs), None
    for k in range(len(pad) // 2):
        d = len(size) - 1 - k
        lo = pad[2 * k]
        idx[d] = clamp(vs[d] - lo, 0, own[d] - 1, {vs[d]: size[d]})
        cond = _in_range(vs[d], lo, lo + own[d])
        inside = cond if inside is None else ops.op("logical_and", inside, cond)
    compute = compute_dtype(out_dtype)
    body = ctx.load(x, idx, compute)
    if inside is not None:
        body = ops.where(inside, body, ops.const(value, compute))
    return ctx.pointwise(size, out_dtype, body)


@register_lowering("slice_scatter.default")
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    size, out_dtype = ctx.out_size, ctx.out_dtype
    dim = _dim(dim, len(size))
    start = 0 if start is None else (start + size[dim] if start < 0 else start)
    extent = ctx.size(src)[dim]
    vs = index_vars(len(size))
    compute = compute_dtype(out_dtype)
    idx = list(vs)
    pos = vs[dim] - start
    idx[dim] = clamp(pos, 0, (extent - 1) * step, {vs[dim]: size[dim]})
    if step != 1:
        from .indexing import FloorDiv, ModularIndexing

        idx[dim] = FloorDiv(idx[dim], step)
        on_grid = ops.op(
            "eq",
            ops.IndexValue(ModularIndexing(sympy.Max(pos, 0), step), torch.int64),
            ops.const(0, torch.int64),
        )
    else:
        on_grid = None
    cond = _in_range(vs[dim], start, start + (extent - 1) * step + 1) if extent else None
    if cond is None:
        return ctx.elementwise([x], lambda a: a)
    if on_grid is not None:
        cond = ops.op("logical_and", cond, on_grid)
    body = ops.where(cond, ctx.load(src, idx, compute), ctx.load(x, vs, compute))
    return ctx.pointwise(size, out_dtype, body)


@register_lowering("select_scatter.default")
def _select_scatter(ctx, x, src, dim, index):
    size, out_dtype = ctx.out_size, ctx.out_dtype
    dim = _dim(dim, len(size))
    index = index + size[dim] if index < 0 else index
    vs = index_vars(len(size))
    compute = compute_dtype(out_dtype)
    src_idx = list(vs[:dim]) + list(vs[dim + 1 :])
    cond = ops.op("eq", ops.IndexValue(vs[dim], torch.int64), ops.const(index, torch.int64))
    body = ops.where(cond, ctx.load(src, src_idx, compute), ctx.load(x, vs, compute))
    return ctx.pointwise(size, out_dtype, body)


# ---------------------------------------------------------------------------------------------
# Creation
# ---------------------------------------------------------------------------------------------


def _check_device(ctx, kwargs):
    """A factory's kernel runs on the graph's device, so it may only create tensors there (a CPU
    scalar in a CUDA graph stays an ATen call; graph.py refuses any op whose output is on
    another device, this names the argument)."""
    device = kwargs.get("device")
    if device is not None and not ctx.on_graph_device(torch.device(device)):
        raise Unsupported(f"tensor created on device {device}, not the graph's {ctx.device}")


@register_lowering("full.default", "full_like.default")
def _full(ctx, size_or_x, fill_value, **kwargs):
    _check_device(ctx, kwargs)
    if not isinstance(fill_value, (bool, int, float)):
        raise Unsupported("fill value is not a Python number")
    return ctx.pointwise(ctx.out_size, ctx.out_dtype, ops.const(fill_value, _cd(ctx)))


@register_lowering("new_full.default")
def _new_full(ctx, x, size, fill_value, **kwargs):
    # `lerp(a, b, weight=float)` and friends reach ATen as a 0-d `new_full` of the weight: as
    # an extern call it was one ATen call and one allocation per call per tensor
    return _full(ctx, size, fill_value, **kwargs)


def _cd(ctx):
    return compute_dtype(ctx.out_dtype)


@register_lowering(
    "zeros.default",
    "zeros_like.default",
    "empty.memory_format",
    "empty_like.default",
    "new_zeros.default",
    "new_empty.default",
)
def _zeros(ctx, *args, **kwargs):
    _check_device(ctx, kwargs)
    return ctx.pointwise(ctx.out_size, ctx.out_dtype, ops.const(0, _cd(ctx)))


@register_lowering("ones.default", "ones_like.default", "new_ones.default")
def _ones(ctx, *args, **kwargs):
    _check_device(ctx, kwargs)
    return ctx.pointwise(ctx.out_size, ctx.out_dtype, ops.const(1, _cd(ctx)))


@register_lowering("scalar_tensor.default")
def _scalar_tensor(ctx, value, **kwargs):
    _check_device(ctx, kwargs)
    return ctx.pointwise((), ctx.out_dtype, ops.const(value, _cd(ctx)))


@register_lowering("fill.Scalar")
def _fill(ctx, x, value):
    return ctx.pointwise(ctx.out_size, ctx.out_dtype, ops.const(value, _cd(ctx)))


@register_lowering("arange.start_step", "arange.default", "arange.start")
def _arange(ctx, *args, **kwargs):
    _check_device(ctx, kwargs)
    nums = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    start: int | float = 0
    step: int | float = 1
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) == 3:
        step = nums[2]
    (i0,) = index_vars(1)
    compute = _cd(ctx)
    if isinstance(start, int) and isinstance(step, int):
        body = ops.cast(ops.IndexValue(start + step * i0, torch.int64), compute)
    else:
        pos = ops.cast(ops.IndexValue(i0, torch.int64), torch.float64)
        body = ops.add(
            ops.const(start, torch.float64), ops.mul(pos, ops.const(step, torch.float64))
        )
        body = ops.cast(body, compute)
    return ctx.pointwise(ctx.out_size, ctx.out_dtype, body)


def is_tensor(v) -> bool:
    return isinstance(v, BufRef)

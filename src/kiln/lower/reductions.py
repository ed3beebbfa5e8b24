"""Lowerings of reductions and the ops built from them: softmax, log_softmax, layer norm, var.

Takes ATen calls through the registry; gives `Reduction` nodes (one per reduced quantity, kept
dims only, `keepdim` added back as a `View`) plus the `Pointwise` nodes that read them. A
softmax is three nodes — `amax`, `sum(exp(x - max))` and `exp(x - max) / sum` — that share one
iteration space, so the scheduler puts all three in one kernel, one row at a time.

Why it exists: lowering composite ops straight to these few nodes (instead of an extern call)
is what lets softmax and layer norm become single fused kernels.
"""

from __future__ import annotations

import math

import sympy
import torch

from . import ops
from .indexing import index_vars, reduce_vars
from .ir import BufRef, compute_dtype
from .ops import const, op
from .registry import Unsupported, register_lowering
from .symbolic import is_symbolic


class Axes:
    """How a reduction over `dims` of a tensor of `size` splits its index into kept/reduced."""

    def __init__(self, size: tuple, dims) -> None:
        n = len(size)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(n))
        elif isinstance(dims, int):
            dims = [dims]
        self.size = size
        self.dims = sorted({d + n if d < 0 else d for d in dims} if n else set())
        self.kept = [d for d in range(n) if d not in self.dims]
        self.kept_size = tuple(size[d] for d in self.kept)
        self.reduce_size = tuple(size[d] for d in self.dims)
        self.count = math.prod(self.reduce_size)

    def reduce_index(self) -> list:
        """Index into the input for a reduction body: kept dims -> i vars, reduced -> r vars."""
        iv, rv = index_vars(len(self.kept)), reduce_vars(len(self.dims))
        index = [None] * len(self.size)
        for k, d in enumerate(self.kept):
            index[d] = iv[k]
        for k, d in enumerate(self.dims):
            index[d] = rv[k]
        return index

    def kept_of(self, full_index) -> list:
        """Index into a reduction's result for a full-size index of the input."""
        return [full_index[d] for d in self.kept]


def reduce(ctx, x: BufRef, axes: Axes, rtype: str, out_dtype, body=None, compute=None):
    compute = compute or compute_dtype(out_dtype)
    value = ctx.load(x, axes.reduce_index(), compute)
    if body is not None:
        value = body(value)
    return ctx.reduction(axes.kept_size, out_dtype, rtype, axes.reduce_size, value)


def keepdim_view(ctx, ref: BufRef, axes: Axes) -> BufRef:
    size = tuple(1 if d in axes.dims else s for d, s in enumerate(axes.size))
    vs = index_vars(len(size))
    return ctx.view(ref, size, [vs[d] for d in axes.kept])


def _finish(ctx, ref, axes, keepdim):
    return keepdim_view(ctx, ref, axes) if keepdim else ref


def _scale(ctx, ref: BufRef, axes: Axes, out_dtype, factor) -> BufRef:
    vs = index_vars(len(axes.kept))
    c = compute_dtype(out_dtype)
    if is_symbolic(factor):  # a symbolic count: divide by it (see `_inverse`)
        return ctx.pointwise(
            axes.kept_size, out_dtype, _times_inverse(ctx.load(ref, vs, c), factor, c)
        )
    return ctx.pointwise(axes.kept_size, out_dtype, ops.mul(ctx.load(ref, vs, c), const(factor, c)))


@register_lowering("sum.dim_IntList", "sum.default")
def _sum(ctx, x, dim=None, keepdim=False, dtype=None):
    axes = Axes(ctx.size(x), dim)
    if ctx.out_dtype == torch.bool:
        raise Unsupported("sum to bool")
    return _finish(ctx, reduce(ctx, x, axes, "sum", ctx.out_dtype), axes, keepdim)


@register_lowering("mean.dim", "mean.default")
def _mean(ctx, x, dim=None, keepdim=False, dtype=None):
    axes = Axes(ctx.size(x), dim)
    if not ctx.out_dtype.is_floating_point:
        raise Unsupported("mean of integers")
    acc = compute_dtype(ctx.out_dtype)
    total = reduce(ctx, x, axes, "sum", acc)
    return _finish(
        ctx, _scale(ctx, total, axes, ctx.out_dtype, _inverse(axes.count)), axes, keepdim
    )


def _inverse(count):
    """1 / count as a scalar: a float for a static count (nan for none), else the reciprocal
    of the count's value, computed in the kernel (a symbolic size)."""
    if is_symbolic(count):
        return count
    return 1.0 / count if count else math.nan


def _times_inverse(value, count, c):
    """`value * (1 / count)` in compute type `c` (see `_inverse`)."""
    inv = _inverse(count)
    if is_symbolic(inv):
        return ops.div(value, ops.cast(ops.IndexValue(inv, torch.int64), c))
    return ops.mul(value, const(inv, c))


@register_lowering("prod.default", "prod.dim_int")
def _prod(ctx, x, dim=None, keepdim=False, dtype=None):
    axes = Axes(ctx.size(x), dim)
    return _finish(ctx, reduce(ctx, x, axes, "prod", ctx.out_dtype), axes, keepdim)


@register_lowering("amax.default", "amin.default", "max.default", "min.default")
def _amax(ctx, x, dim=None, keepdim=False):
    axes = Axes(ctx.size(x), dim)
    if axes.count == 0:
        raise Unsupported("max/min of an empty tensor (an error in eager)")
    rtype = "max" if "max" in str(ctx.op) else "min"
    return _finish(ctx, reduce(ctx, x, axes, rtype, ctx.out_dtype), axes, keepdim)


@register_lowering("max.dim", "min.dim")
def _max_dim(ctx, x, dim, keepdim=False):
    axes = Axes(ctx.size(x), dim)
    if axes.count == 0:
        raise Unsupported("max/min of an empty dimension (an error in eager)")
    rtype = "max" if "max" in str(ctx.op) else "min"
    values = reduce(ctx, x, axes, rtype, ctx.dtype(x))
    c = compute_dtype(ctx.dtype(x))
    idx = reduce(ctx, x, axes, "arg" + rtype, torch.int64, compute=c)
    return (_finish(ctx, values, axes, keepdim), _finish(ctx, idx, axes, keepdim))


@register_lowering("argmax.default", "argmin.default")
def _argmax(ctx, x, dim=None, keepdim=False):
    size = ctx.size(x)
    axes = Axes(size, dim)
    if axes.count == 0:
        raise Unsupported("argmax/argmin of an empty tensor (an error in eager)")
    rtype = "argmax" if "argmax" in str(ctx.op) else "argmin"
    out = reduce(ctx, x, axes, rtype, torch.int64, compute=compute_dtype(ctx.dtype(x)))
    if dim is None and keepdim:
        return ctx.view(out, (1,) * len(size), [])
    return _finish(ctx, out, axes, keepdim)


@register_lowering("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")
def _any(ctx, x, dim=None, keepdim=False):
    axes = Axes(ctx.size(x), dim)
    rtype = "any" if "any" in str(ctx.op) else "all"
    if ctx.out_dtype != torch.bool:
        raise Unsupported("any/all of uint8 returns uint8")
    return _finish(ctx, reduce(ctx, x, axes, rtype, torch.bool, compute=torch.bool), axes, keepdim)


def _mean_and_var(ctx, x, axes: Axes, correction, acc):
    """(mean, var) as Pointwise nodes over the kept dims: two passes, sum then sum of squares."""
    vs = index_vars(len(axes.kept))
    total = reduce(ctx, x, axes, "sum", acc)
    mean = ctx.pointwise(
        axes.kept_size, acc, _times_inverse(ctx.load(total, vs, acc), axes.count, acc)
    )
    mean_at = ctx.load(mean, vs, acc)

    def square_dev(v):
        d = ops.sub(v, mean_at)
        return ops.mul(d, d)

    sq = reduce(ctx, x, axes, "sum", acc, body=square_dev)
    if is_symbolic(axes.count):  # divided by max(n - correction, 0) in the kernel: x/0 = inf
        denom = sympy.Max(axes.count - correction, 0)
        var = ctx.pointwise(axes.kept_size, acc, _times_inverse(ctx.load(sq, vs, acc), denom, acc))
        return mean, var
    denom = max(axes.count - correction, 0)
    scale = 1.0 / denom if denom else math.inf
    var = ctx.pointwise(axes.kept_size, acc, ops.mul(ctx.load(sq, vs, acc), const(scale, acc)))
    return mean, var


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


@register_lowering("var.correction", "var.dim", "std.correction", "std.dim", "var_mean.correction")
def _var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(unbiased, bool) is False and unbiased is not None:
        raise Unsupported("unexpected unbiased argument")
    out = ctx.out[0] if isinstance(ctx.out, (tuple, list)) else ctx.out
    if not out.dtype.is_floating_point or out.dtype != ctx.dtype(x):
        raise Unsupported("var/std of a non-float or complex tensor")
    axes = Axes(ctx.size(x), dim)
    acc = compute_dtype(out.dtype)
    mean, var = _mean_and_var(ctx, x, axes, _correction(correction, unbiased), acc)
    name = str(ctx.op)
    vs = index_vars(len(axes.kept))
    if "std" in name:
        var = ctx.pointwise(axes.kept_size, out.dtype, op("sqrt", ctx.load(var, vs, acc)))
    elif out.dtype != acc:
        var = ctx.pointwise(axes.kept_size, out.dtype, ctx.load(var, vs, acc))
    if "var_mean" in name:
        if out.dtype != acc:
            mean = ctx.pointwise(axes.kept_size, out.dtype, ctx.load(mean, vs, acc))
        return (_finish(ctx, var, axes, keepdim), _finish(ctx, mean, axes, keepdim))
    return _finish(ctx, var, axes, keepdim)


def _row_softmax(ctx, x, dim, out_dtype, log: bool):
    size = ctx.size(x)
    axes = Axes(size, dim)
    acc = compute_dtype(out_dtype)
    full = index_vars(len(size))
    m = reduce(ctx, x, axes, "max", acc)
    m_row = ctx.load(m, index_vars(len(axes.kept)), acc)
    s = reduce(ctx, x, axes, "sum", acc, body=lambda v: op("exp", ops.sub(v, m_row)))
    xv = ctx.load(x, full, acc)
    mv = ctx.load(m, axes.kept_of(full), acc)
    sv = ctx.load(s, axes.kept_of(full), acc)
    shifted = ops.sub(xv, mv)
    if log:
        body = ops.sub(shifted, op("log", sv))
    else:
        # Times the reciprocal of the row sum, as ATen's vectorized softmax does: one division
        # per row instead of one per element.
        body = ops.mul(op("exp", shifted), op("reciprocal", sv))
    return ctx.pointwise(size, out_dtype, body)


@register_lowering("_softmax.default", "_log_softmax.default")
def _softmax(ctx, x, dim, half_to_float=False):
    log = "log_softmax" in str(ctx.op)
    return _row_softmax(ctx, x, dim, ctx.out_dtype, log)


@register_lowering("softmax.int", "log_softmax.int")
def _softmax_int(ctx, x, dim, dtype=None):
    log = "log_softmax" in str(ctx.op)
    if dtype is not None and dtype != ctx.dtype(x):
        raise Unsupported("softmax with a dtype argument")
    return _row_softmax(ctx, x, dim, ctx.out_dtype, log)


@register_lowering("_softmax_backward_data.default", "_log_softmax_backward_data.default")
def _softmax_backward(ctx, grad, out, dim, input_dtype):
    size = ctx.size(grad)
    axes = Axes(size, dim)
    acc = compute_dtype(ctx.out_dtype)
    full = index_vars(len(size))
    log = "log_softmax" in str(ctx.op)
    if log:
        s = reduce(ctx, grad, axes, "sum", acc)
        sv = ctx.load(s, axes.kept_of(full), acc)
        y = op("exp", ctx.load(out, full, acc))
        body = ops.sub(ctx.load(grad, full, acc), ops.mul(y, sv))
    else:
        out_r = ctx.load(out, axes.reduce_index(), acc)
        s = reduce(ctx, grad, axes, "sum", acc, body=lambda g: ops.mul(g, out_r))
        sv = ctx.load(s, axes.kept_of(full), acc)
        y = ctx.load(out, full, acc)
        body = ops.mul(y, ops.sub(ctx.load(grad, full, acc), sv))
    return ctx.pointwise(size, ctx.out_dtype, body)


@register_lowering("native_layer_norm.default")
def _layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    size = ctx.size(x)
    out_dtype = ctx.out[0].dtype
    axis = len(size) - len(normalized_shape)
    axes = Axes(size, list(range(axis, len(size))))
    acc = compute_dtype(out_dtype)
    mean, var = _mean_and_var(ctx, x, axes, 0, acc)
    vs = index_vars(len(axes.kept))
    rstd = ctx.pointwise(
        axes.kept_size, acc, op("rsqrt", ops.add(ctx.load(var, vs, acc), const(eps, acc)))
    )
    full = index_vars(len(size))
    body = ops.mul(
        ops.sub(ctx.load(x, full, acc), ctx.load(mean, axes.kept_of(full), acc)),
        ctx.load(rstd, axes.kept_of(full), acc),
    )
    inner = full[axis:]
    if weight is not None:
        body = ops.mul(body, ctx.load(weight, inner, acc))
    if bias is not None:
        body = ops.add(body, ctx.load(bias, inner, acc))
    out = ctx.pointwise(size, out_dtype, body)
    stat_dtype = ctx.out[1].dtype
    if stat_dtype != acc:
        mean = ctx.pointwise(axes.kept_size, stat_dtype, ctx.load(mean, vs, acc))
        rstd = ctx.pointwise(axes.kept_size, stat_dtype, ctx.load(rstd, vs, acc))
    return (out, keepdim_view(ctx, mean, axes), keepdim_view(ctx, rstd, axes))


@register_lowering("logsumexp.default")
def _logsumexp(ctx, x, dim, keepdim=False):
    axes = Axes(ctx.size(x), dim)
    if not ctx.out_dtype.is_floating_point:
        raise Unsupported("logsumexp of integers")
    acc = compute_dtype(ctx.out_dtype)
    vs = index_vars(len(axes.kept))
    m = reduce(ctx, x, axes, "max", acc)
    m_safe = ops.where(op("isinf", ctx.load(m, vs, acc)), const(0, acc), ctx.load(m, vs, acc))
    safe = ctx.pointwise(axes.kept_size, acc, m_safe)
    s = reduce(
        ctx, x, axes, "sum", acc, body=lambda v: op("exp", ops.sub(v, ctx.load(safe, vs, acc)))
    )
    out = ops.add(op("log", ctx.load(s, vs, acc)), ctx.load(safe, vs, acc))
    return _finish(ctx, ctx.pointwise(axes.kept_size, ctx.out_dtype, out), axes, keepdim)

"""Lowerings of pooling: `max_pool2d_with_indices` as pointwise code over the output.

Takes the ATen call; gives two `Pointwise` nodes, the maxima and their flat positions in the
input plane (`ih * W + iw`, what ATen returns), each computed by unrolling the window: every
output element loads its `kh x kw` inputs (clamped into range, masked by whether the window
position falls inside the input) and keeps the largest, NaN winning, the first position on
ties — the rule ATen's CPU and CUDA kernels follow. An inference graph that never reads the
positions loses that node to dead-code elimination, and the maxima fuse with the batch norm
and ReLU before them (a channels-last ResNet-50's stem: ATen's pooling kernel took 112 us of
a 1.65 ms forward on the H200; fused, the stem's pointwise kernel grows by a few us).

Why it exists: an `Extern` call can fuse with nothing and costs a launch; windows up to
`MAX_WINDOW` elements are cheap to unroll. Larger windows stay extern calls, with that reason.
"""

from __future__ import annotations

import torch

from . import ops
from .indexing import clamp, index_vars
from .ir import Expr, compute_dtype
from .registry import Unsupported, register_lowering
from .symbolic import from_torch
from .views import _in_range  # lo <= index < hi, as a loop-IR condition

MAX_WINDOW = 25  # unrolled window elements per output (5 x 5)


def _pair(v, default=None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else _too_many(v)


def _too_many(v):
    raise Unsupported(f"pooling parameter {v!r} has more than two entries")


@register_lowering("max_pool2d_with_indices.default")
def _max_pool2d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > MAX_WINDOW:
        raise Unsupported(f"a {kh}x{kw} window (more than {MAX_WINDOW} elements to unroll)")
    # symbolic output sizes stay expressions: `int()` would bake the first call's sizes in
    size = tuple(from_torch(s) for s in ctx.out[0].shape)
    height, width = ctx.size(x)[-2:]
    if any(s == 0 for s in size) or height == 0 or width == 0:
        raise Unsupported("pooling an empty tensor")
    vs = index_vars(len(size))
    lead, oh, ow = list(vs[:-2]), vs[-2], vs[-1]
    compute = compute_dtype(ctx.dtype(x))
    # Each step reads the running maximum once (NaN-propagating `maximum`) and the position
    # chain reads it once more: the expressions grow linearly and quadratically with the
    # window, where a `where` on `v > best` for the values too grew exponentially (25 steps
    # are 2**25 nodes to anything that walks the tree without sharing).
    best: Expr = ops.const(float("-inf"), compute)
    at: Expr = ops.const(0, torch.int64)
    seen: Expr | None = None
    for i in range(kh):
        ih = oh * sh - ph + i * dh
        for j in range(kw):
            iw = ow * sw - pw + j * dw
            valid = ops.op("logical_and", _in_range(ih, 0, height), _in_range(iw, 0, width))
            clamped = [
                clamp(ih, 0, height - 1, {oh: size[-2]}),
                clamp(iw, 0, width - 1, {ow: size[-1]}),
            ]
            v = ctx.load(x, lead + clamped, compute)
            pos = ops.IndexValue(ih * width + iw, torch.int64)
            if seen is None:  # the first window position: taken when inside
                take, seen = valid, valid
            else:
                larger = ops.op("logical_or", ops.op("gt", v, best), ops.op("isnan", v))
                first = ops.op("logical_not", seen)  # nothing inside yet: take this one
                take = ops.op("logical_and", valid, ops.op("logical_or", first, larger))
                seen = ops.op("logical_or", seen, valid)
            at = ops.where(take, pos, at)
            inside = ops.where(valid, v, ops.const(float("-inf"), compute))
            best = ops.op("maximum", inside, best)
    values = ctx.pointwise(size, ctx.out[0].dtype, best)
    positions = ctx.pointwise(size, torch.int64, at)
    return values, positions

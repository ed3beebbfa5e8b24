"""Store a lowered result in the memory order eager gives it.

Takes the `Pointwise` node a lowering just added and the node's fake value; gives the same
values stored in eager's dimension order: a contiguous `Pointwise` over the permuted size and a
`View` that reads it back in logical order. Eager's elementwise ops keep their inputs' memory
format (a channels-last convolution's batch norm and ReLU stay channels-last), so a result
stored row-major would make every later convolution, pooling or graph output convert it back:
on a channels-last ResNet-50 that was 52 copy kernels a call.

Why it exists: loop IR nodes are stored contiguous when realized (see `ir.Pointwise`); the
permutation lives here, once, instead of a stride order threaded through every renderer.
"""

from __future__ import annotations

import torch

from .context import LoweringContext
from .indexing import index_vars
from .ir import BufRef, Pointwise, View, reindex
from .symbolic import from_torch


def dense_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dimensions of `t` from outermost to innermost in memory, when `t` is dense (no gaps,
    no overlap) in some order other than row-major; None otherwise. Size-1 dimensions keep
    their logical place (their stride means nothing)."""
    if t.dim() < 2:
        return None
    size, stride = tuple(t.shape), tuple(t.stride())
    if any(not isinstance(s, int) for s in size + stride):
        return None  # symbolic: stored row-major (correct; a permuted order is a speed matter)
    if t.is_contiguous():
        return None
    dims = [d for d in range(t.dim()) if size[d] != 1]
    dims.sort(key=lambda d: -stride[d])  # stable: equal strides keep logical order
    expect = 1
    for d in reversed(dims):
        if stride[d] != expect:
            return None
        expect *= size[d]
    order, it = [], iter(dims)
    for d in range(t.dim()):
        order.append(d if size[d] == 1 else next(it))
    return tuple(order)


def store_in_eager_order(ctx: LoweringContext, ref: object, val: object) -> object:
    """`ref` (a lowering's result) restored in `val`'s memory order when `ref` is a `Pointwise`
    with `val`'s shape and `val` is densely permuted; otherwise `ref` unchanged. A lowering
    with several results (max-pool's values and positions) gives a tuple: each is restored in
    its own value's order (a channels-last ResNet's pooled values were stored row-major, and
    both convolutions reading them converted them back)."""
    if isinstance(ref, tuple) and isinstance(val, (tuple, list)) and len(ref) == len(val):
        return tuple(store_in_eager_order(ctx, r, v) for r, v in zip(ref, val))
    if not isinstance(ref, BufRef) or not isinstance(val, torch.Tensor):
        return ref
    node = ctx.nodes.get(ref.name)
    if not isinstance(node, Pointwise) or tuple(node.size) != tuple(map(from_torch, val.shape)):
        return ref
    order = dense_order(val)
    if order is None:
        return ref
    n = len(order)
    logical = index_vars(n)
    # Loop variable k of the stored node walks logical dimension order[k].
    body = reindex(node.body, {logical[d]: logical[k] for k, d in enumerate(order)})
    stored = Pointwise(node.name, tuple(node.size[d] for d in order), node.dtype, body)
    ctx.nodes[node.name] = stored
    index = tuple(logical[d] for d in order)  # stored dimension k holds logical order[k]
    return ctx.add(View(ctx.fresh("view"), node.name, tuple(node.size), node.dtype, index))

"""Scatter a tied embedding's gradient into the matmul gradient it is added to.

Takes an ATen graph with `val` metadata (the GPU path runs it before lowering); rewrites it in
place. A language model that ties its output projection to its token embedding (GPT-2,
nanoGPT) gets the shared weight's gradient as

    add(mm(...), embedding_dense_backward(grad, indices, V, -1, False))

`embedding_dense_backward` fills a [V, D] table with zeros, sorts the indices and sums each
index's rows into it (on the H200, nanoGPT's 50304 x 768 float32 table: about 0.2 ms in eleven
kernels), and the add is then one more pass over three tables (0.11 ms). Adding the rows into a
copy of the matmul's gradient gives the same sum: `index_put(mm, [indices], grad,
accumulate=True)` copies the table once and scatters the rows into it (ATen's sort-based
accumulate, deterministic), as torch.compile's code also does (a copy, then atomic adds).

Only the plain case is rewritten: no padding index, no scaling by frequency, the embedding
gradient read by that one add alone, whose other operand has the table's shape and dtype (no
broadcasting). A lone `embedding_dense_backward` stays as it is: scattering into a fresh table
would need zeros and a copy of them, which costs more than ATen's kernel.

One lone case is rewritten all the same: a position embedding's, whose indices are
`arange(0, T)` (in the backward graph when the partition recomputes them; a view of it with T
elements, such as `[1, T]`, too). Each row is then indexed once, in order, so the table's
gradient is the output gradient's T rows followed by zeros: `constant_pad_nd(grad.view(T, D),
[0, 0, 0, N - T])`, one pointwise pass, where ATen fills a table and adds rows into it
(nanoGPT's 1024 x 768 position table: 27.5 us a step in ATen's kernel on the H200;
benchmarks/RESULTS.md, eleventh session).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import rewrite

aten = torch.ops.aten


@rewrite("scatter_embedding_grads")
def scatter_embedding_grads(gm: torch.fx.GraphModule, example_inputs: Sequence[object] = ()) -> int:
    """Scatter tied embedding gradients, pad position embedding gradients (module doc)."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.embedding_dense_backward.default:
            if not _plain(node):
                continue
            found = _sole_plain_add(node)
            if found is not None:
                _rewrite(gm.graph, node, *found)
                done += 1
            elif _rows_in_order(node):
                _pad_rows(gm.graph, node)
                done += 1
    if done:
        gm.recompile()
    return done


def _plain(node: torch.fx.Node) -> bool:
    """No padding index and no scaling by frequency."""
    names = ("grad_output", "indices", "num_weights", "padding_idx", "scale_grad_by_freq")
    args = dict(zip(names, node.args), **node.kwargs)
    return bool(args.get("padding_idx") == -1) and args.get("scale_grad_by_freq") is False


def _sole_plain_add(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(the `add` that is the embedding gradient's only reader, its other operand), if that
    operand is a tensor of the same shape, dtype and strides as the sum (a copy of it is the
    result)."""
    if len(node.users) != 1:
        return None
    (add,) = node.users
    if add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs:
        return None
    other = add.args[1] if add.args[0] is node else add.args[0]
    if other is node or not isinstance(other, torch.fx.Node):
        return None
    mine, theirs, total = (n.meta.get("val") for n in (node, other, add))
    if not (
        isinstance(mine, torch.Tensor)
        and isinstance(theirs, torch.Tensor)
        and isinstance(total, torch.Tensor)
    ):
        return None
    if theirs.shape != mine.shape or theirs.dtype != mine.dtype or total.dtype != mine.dtype:
        return None
    return (add, other) if theirs.stride() == total.stride() else None


def _rewrite(
    graph: torch.fx.Graph, node: torch.fx.Node, add: torch.fx.Node, other: torch.fx.Node
) -> None:
    """`index_put` gives a copy of the other operand (its layout), which is the add's result:
    the new node takes the add's `val`."""
    grad, indices = node.args[:2]
    with graph.inserting_before(add):
        total = graph.call_function(aten.index_put.default, (other, [indices], grad, True))
    total.meta["val"] = add.meta["val"]
    add.replace_all_uses_with(total)
    graph.erase_node(add)
    graph.erase_node(node)


_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)
_SAME_ORDER_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default)


def _rows_in_order(node: torch.fx.Node) -> bool:
    """Whether the indices are 0, 1, ..., T - 1 in order (an `arange`, or a view of one with the
    same elements), for a table of at least T rows and a contiguous gradient."""
    grad, indices, num_weights = node.args[:3]
    while isinstance(indices, torch.fx.Node) and indices.target in _SAME_ORDER_VIEWS:
        indices = indices.args[0]
    if not isinstance(indices, torch.fx.Node) or indices.target not in _ARANGES:
        return False
    if not isinstance(grad, torch.fx.Node):
        return False
    start = 0 if indices.target is aten.arange.default else indices.args[0]
    step = indices.args[2] if indices.target is aten.arange.start_step else 1
    values, g = indices.meta.get("val"), grad.meta.get("val")
    if not isinstance(values, torch.Tensor) or not isinstance(g, torch.Tensor):
        return False
    rows = values.numel()  # an arange is one-dimensional
    return bool(
        start == 0
        and step == 1
        and not values.dtype.is_floating_point
        and isinstance(num_weights, int)
        and rows <= num_weights
        and g.is_contiguous()
        and g.numel() == rows * g.shape[-1]
    )


def _pad_rows(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """`node` becomes the gradient's rows padded with zero rows to the table's size."""
    grad, _, num_weights = node.args[:3]
    assert isinstance(grad, torch.fx.Node)  # _rows_in_order checked it
    g = grad.meta["val"]
    rows, width = g.numel() // g.shape[-1], g.shape[-1]
    with graph.inserting_before(node):
        if tuple(g.shape) != (rows, width):
            flat = graph.call_function(aten.view.default, (grad, [rows, width]))
            flat.meta["val"] = aten.view.default(g, [rows, width])
            grad = flat
        padded = graph.call_function(
            aten.constant_pad_nd.default, (grad, [0, 0, 0, num_weights - rows], 0.0)
        )
    padded.meta["val"] = node.meta["val"]
    node.replace_all_uses_with(padded)
    graph.erase_node(node)

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
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def scatter_embedding_grads(gm: torch.fx.GraphModule) -> int:
    """Rewrite every tied embedding gradient sum (see the module doc); gives how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.embedding_dense_backward.default:
            found = _sole_plain_add(node)
            if found is not None and _plain(node):
                _rewrite(gm.graph, node, *found)
                done += 1
    if done:
        gm.recompile()
    return done


def _plain(node: torch.fx.Node) -> bool:
    """No padding index and no scaling by frequency."""
    names = ("grad_output", "indices", "num_weights", "padding_idx", "scale_grad_by_freq")
    args = dict(zip(names, node.args), **node.kwargs)
    return args.get("padding_idx") == -1 and args.get("scale_grad_by_freq") is False


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
    if not all(isinstance(v, torch.Tensor) for v in (mine, theirs, total)):
        return None
    if theirs.shape != mine.shape or theirs.dtype != mine.dtype or total.dtype != mine.dtype:
        return None
    return (add, other) if theirs.stride() == total.stride() else None


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, add, other) -> None:
    """`index_put` gives a copy of the other operand (its layout), which is the add's result:
    the new node takes the add's `val`."""
    grad, indices = node.args[:2]
    with graph.inserting_before(add):
        total = graph.call_function(aten.index_put.default, (other, [indices], grad, True))
    total.meta["val"] = add.meta["val"]
    add.replace_all_uses_with(total)
    graph.erase_node(add)
    graph.erase_node(node)

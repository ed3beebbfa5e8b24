"""Take the bias add out of `addmm` when only pointwise ops read the product.

Takes an ATen graph with `val` metadata (the GPU path runs it before lowering); rewrites it in
place. `addmm(bias, a, b)` becomes `mm(a, b) + bias` when every reader of the product (through
views: a linear layer on 3-D input is `view(addmm(bias, view(x), w.t()))`) is a pointwise op.
The add then fuses into the kernel that reads the product anyway (GELU, the residual add before
a layer norm), so it costs no memory pass, and cuBLAS runs its plain matmul instead of its
bias-epilogue one, whose kernel choice can be worse: on the H200, nanoGPT's float32 MLP output
projection (8192 x 3072 by 3072 x 768) took 894 us as `addmm` (cuBLASLt picked a 128x64 tile)
against 836 us as `mm` (128x128), 0.35 ms of a training step over its six layers.

Readers of the product's sizes alone (`sym_size`, which a graph traced with symbolic sizes has
beside most views: `x.view(-1, x.size(-1))` reads the length it keeps symbolic) read the same
sizes off the sum, so they do not keep the `addmm`; counting them as readers kept HF GPT-2's
output projections as `addmm` in every dynamic entry and in none of the static ones.

A product that anything else reads (an extern call, a graph output, a non-view reshaping op) keeps
its `addmm`: there the separate add would cost a pass over the whole product. The result is
rounded once more than `addmm`'s (the product, then the sum), as torch.compile's is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import rewrite

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
# readers of a tensor's layout, not its values: the sum has the product's layout
_LAYOUT_READERS = (
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
)


@rewrite("unfuse_bias_adds")
def unfuse_bias_adds(gm: torch.fx.GraphModule, example_inputs: Sequence[object] = ()) -> int:
    """Split `addmm` into `mm` + add where only pointwise ops read the product; gives how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.addmm.default:
            if _plain(node) and _only_pointwise_readers(node):
                _rewrite(gm.graph, node)
                done += 1
    if done:
        gm.recompile()
    return done


def _plain(node: torch.fx.Node) -> bool:
    """`addmm(bias, a, b)` with beta = alpha = 1 and a tensor bias."""
    extra = dict(node.kwargs)
    if len(node.args) > 3:
        extra.update(zip(("beta", "alpha"), node.args[3:]))
    return all(extra.get(k, 1) == 1 for k in ("beta", "alpha")) and set(extra) <= {
        "beta",
        "alpha",
    }


def _only_pointwise_readers(node: torch.fx.Node) -> bool:
    for user in node.users:
        if user.op != "call_function":
            return False
        if user.target in _LAYOUT_READERS:
            continue
        if user.target in _VIEWS:
            if not _only_pointwise_readers(user):
                return False
        elif torch.Tag.pointwise not in getattr(user.target, "tags", ()):
            return False
    return any(user.target not in _LAYOUT_READERS for user in node.users)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """`mm` and `add` both give what `addmm` gave (a row-major [M, N] of its dtype), so they take
    its `val`, and nothing downstream changes (propagating again from here cost BERT ~0.8 s)."""
    bias, a, b = node.args[:3]
    with graph.inserting_before(node):
        product = graph.call_function(aten.mm.default, (a, b))
        total = graph.call_function(aten.add.Tensor, (product, bias))
    product.meta["val"] = total.meta["val"] = node.meta.get("val")
    node.replace_all_uses_with(total)
    graph.erase_node(node)

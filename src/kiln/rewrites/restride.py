"""In-place restrides of intermediates become views: `as_strided_` -> `as_strided`.

Takes an ATen graph; rewrites it in place. Functionalization leaves metadata-only mutations of
intermediate tensors in a graph: `x.as_strided_(size, stride, offset)` changes how `x` itself
reads its storage (torch's decompositions use it to give a result eager's memory format, as
batch norm does for a channels-last input). No data changes, so it is the view
`y = x.as_strided(size, stride, offset)` with every later reader of `x` reading `y` instead.
The code generator takes functional graphs only; this makes these graphs functional. A restride
of a graph input is left alone (the caller's tensor would change): the graph is then refused
with the reason, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import rewrite

_IN_PLACE = torch.ops.aten.as_strided_.default
_VIEW = torch.ops.aten.as_strided.default


@rewrite("functionalize_restrides")
def functionalize_restrides(gm: torch.fx.GraphModule, example_inputs: Sequence[object] = ()) -> int:
    """Make in-place restrides of intermediates views (module doc); gives how many."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _IN_PLACE:
            continue
        base = node.args[0]
        if not isinstance(base, torch.fx.Node) or base.op == "placeholder":
            continue
        with gm.graph.inserting_after(node):
            view = gm.graph.call_function(_VIEW, node.args, node.kwargs)
        view.meta = dict(node.meta)
        later = [u for u in base.users if u is not node and order.get(u, -1) > order[node]]
        for user in later:
            user.replace_input_with(base, view)
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count

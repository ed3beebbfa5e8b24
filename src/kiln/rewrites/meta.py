"""Fake metadata: every node of an ATen graph gets its `val` (a fake tensor of its output).

Takes an ATen graph module and its example inputs; gives the same module with `node.meta["val"]`
on every placeholder and call (propagated with fake tensors from the example inputs when any is
missing, which costs a fake run of the whole graph; nothing when they are all there). A node
whose result is not a tensor (an assertion returning None) gets `val = None`, so a second call
finds nothing missing and does not propagate again. `fake_call` gives a node a rewrite made its
`val` without a run of the whole graph.

Why it exists: the later rewrites and the lowering read layouts (sizes, strides, dtype, device)
off these values instead of running anything; they are computed on the graph's own device, so a
GPU graph's metadata is the GPU's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import rewrite

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode


@rewrite("fake_metadata")
def fake_metadata(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> int:
    """Give every node its fake output `val` (module doc); gives how many nodes lacked one."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "placeholder")]
    missing = sum("val" not in n.meta for n in nodes)
    if missing:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)
    for n in nodes:
        n.meta.setdefault("val", None)
    return 0  # metadata only: the graph's code is unchanged


def ensure_meta(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> None:
    """`fake_metadata` for the passes and stages that need `val` on every node."""
    fake_metadata(gm, example_inputs)


def fake_call(node: torch.fx.Node, mode: FakeTensorMode, values: dict) -> object:
    """Run `node`'s op in fake `mode` on fakes of its inputs' `val`s (made in `mode` with the
    same sizes, strides and offsets, kept in `values` by node; a traced graph's values each
    carry their own mode, so a rewrite's new nodes are run in one of its own), and give the
    result, also set as the node's `val` and kept in `values`."""

    def value(a: torch.fx.Node) -> Any:
        if a not in values:
            v = a.meta["val"]
            if isinstance(v, torch.Tensor):
                with mode:
                    v = empty_with_layout(v)
            values[a] = v
        return values[a]

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
    op = node.target
    assert callable(op), node  # a call_function node
    with mode:
        values[node] = node.meta["val"] = op(*args, **kwargs)
    return values[node]


def empty_with_layout(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with `t`'s sizes, strides, storage offset and dtype, over a
    storage just long enough for them; made inside a fake mode it is a fake tensor."""
    numel = t.numel()
    span = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    base = torch.empty(max(span, 1) if numel else 0, dtype=t.dtype, device=t.device)
    return base.as_strided(t.shape, t.stride(), t.storage_offset() if numel else 0)

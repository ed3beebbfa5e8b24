"""Fake metadata: every node of an ATen graph gets its `val` (a fake tensor of its output).

Takes an ATen graph module and its example inputs; gives the same module with `node.meta["val"]`
on every placeholder and call (propagated with fake tensors from the example inputs when any is
missing, which costs a fake run of the whole graph; nothing when they are all there). A node
whose result is not a tensor (an assertion returning None) gets `val = None`, so a second call
finds nothing missing and does not propagate again.

Why it exists: the later rewrites and the lowering read layouts (sizes, strides, dtype, device)
off these values instead of running anything; they are computed on the graph's own device, so a
GPU graph's metadata is the GPU's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import rewrite


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

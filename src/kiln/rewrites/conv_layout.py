"""Channels-last convolutions: a graph pass on the ATen graph, before lowering.

Takes an ATen `GraphModule` with its example inputs (both built-in devices list it); gives the
same graph (changed in place) where every 2-D convolution reads a channels-last input: a
`clone(memory_format=channels_last)` goes in front of a convolution whose input is not
channels-last already, and fake tensors are propagated again, so the convolution's output and
the batch norms, ReLUs and
residual adds after it are channels-last too (eager's own memory-format rules), and the next
convolution's input is channels-last without a copy. `layouts.py` then stores each of those
results in that order. The weights stay as they are (oneDNN reorders them itself, at no
measurable cost on the suite's shapes).

Nothing changes when a graph output would change its strides (a training forward returns its
activations for the backward, which was traced with the old ones), nor for a graph with a
convolution's backward.

Why it exists: oneDNN's direct convolution is faster on channels-last data: 0.43 -> 0.30 ms
for the 16-channel 32x32 3x3 convolutions of the suite's ResNet (one thread), and convolutions
are 80% of that model's time. On the GPU, cuDNN's bfloat16 convolutions run on NHWC data and,
given NCHW, transpose in and out around every call: 6.3 ms of the 14.9 ms of GPU time of the
suite's ResNet-18 (batch 64, 224x224) on an H200. Inductor makes the same choice (its layout
optimization).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import rewrite
from .meta import ensure_meta

aten = torch.ops.aten
_CL = torch.channels_last


def _wants_channels_last(node: torch.fx.Node) -> bool:
    if node.target is not aten.convolution.default:
        return False
    x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    transposed = node.args[6] if len(node.args) > 6 else False
    return (
        isinstance(x, torch.Tensor)
        and x.dim() == 4
        and x.dtype in (torch.float32, torch.bfloat16)
        and not transposed
        and not x.is_contiguous(memory_format=_CL)
    )


def _output_strides(gm: torch.fx.GraphModule) -> list:
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    leaves = torch.fx.node.map_arg(out.args[0], lambda n: n)
    nodes = [n for n in torch.utils._pytree.tree_leaves(leaves) if isinstance(n, torch.fx.Node)]
    vals = [n.meta.get("val") for n in nodes]
    return [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in vals]


def _source(clone: torch.fx.Node) -> torch.fx.Node:
    """The node a clone inserted here copies: a convolution's input, which
    `_wants_channels_last` checked is a graph node."""
    src = clone.args[0]
    assert isinstance(src, torch.fx.Node)
    return src


def _propagate(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> None:
    for n in gm.graph.nodes:
        n.meta.pop("val", None)
    ensure_meta(gm, example_inputs)


@rewrite("channels_last_convolutions")
def channels_last_convolutions(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> int:
    """Make 2-D convolutions read channels-last inputs (module doc); 1 if the graph changed."""
    graph = gm.graph
    if any(n.target is aten.convolution_backward.default for n in graph.nodes):
        return 0
    convs = [n for n in graph.nodes if _wants_channels_last(n)]
    if not convs:
        return 0
    before = _output_strides(gm)
    clones = []
    for conv in convs:
        with graph.inserting_before(conv):
            clone = graph.call_function(aten.clone.default, (conv.args[0],), {"memory_format": _CL})
        conv.replace_input_with(conv.args[0], clone)
        clones.append(clone)
    _propagate(gm, example_inputs)
    if _output_strides(gm) != before:  # undo: the outputs must keep their strides
        for clone in clones:
            clone.replace_all_uses_with(_source(clone))
            graph.erase_node(clone)
        _propagate(gm, example_inputs)
        return 0
    for clone in clones:  # the input is channels-last already: no copy needed
        if _source(clone).meta["val"].is_contiguous(memory_format=_CL):
            clone.replace_all_uses_with(_source(clone))
            graph.erase_node(clone)
    gm.recompile()
    return 1

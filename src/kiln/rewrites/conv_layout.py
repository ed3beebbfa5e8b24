"""Channels-last convolutions: a graph pass on the ATen graph, before lowering.

Takes an ATen `GraphModule` with its example inputs (both built-in devices list it); gives the
same graph (changed in place) where every 2-D convolution reads a channels-last input: a
`clone(memory_format=channels_last)` goes in front of a convolution whose input is not
channels-last already, and fake tensors are propagated again, so the convolution's output and
the batch norms, ReLUs and
residual adds after it are channels-last too (eager's own memory-format rules), and the next
convolution's input is channels-last without a copy. `layouts.py` then stores each of those
results in that order. A convolution that reads a channels-last input gets a channels-last
weight too (`_channels_last_weights`): given a contiguous weight, ATen copies it into that
layout inside every call (a strided `copy_` per convolution, 5% of the suite's conv net on
one thread); as a `clone` in the graph the copy is one of kiln's kernels instead.

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
        return _channels_last_weights(gm, example_inputs)
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
    _channels_last_weights(gm, example_inputs)
    gm.recompile()
    return 1


def _reads_channels_last(conv: torch.fx.Node) -> bool:
    """A 2-D convolution whose input is channels-last and not also contiguous (where both hold,
    as with one channel, ATen's choice of layout follows the weight: a channels-last weight
    would change the output's strides)."""
    if conv.target is not aten.convolution.default or (len(conv.args) > 6 and conv.args[6]):
        return False
    x, w = conv.args[0], conv.args[1]
    if not (isinstance(x, torch.fx.Node) and isinstance(w, torch.fx.Node)):
        return False
    xv, wv = x.meta.get("val"), w.meta.get("val")
    return (
        isinstance(xv, torch.Tensor)
        and isinstance(wv, torch.Tensor)
        and xv.dim() == 4
        and wv.dim() == 4
        and xv.is_contiguous(memory_format=_CL)
        and not xv.is_contiguous()
        and not wv.is_contiguous(memory_format=_CL)
    )


def _channels_last_weights(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> int:
    """Give every convolution that reads a channels-last input a channels-last weight: one
    `clone` per weight, before its first convolution. Undone if any convolution's output
    strides change (they must not: the input's layout decides them). 1 if the graph changed."""
    graph = gm.graph
    convs = [n for n in graph.nodes if _reads_channels_last(n)]
    if not convs:
        return 0
    strides = {c: tuple(c.meta["val"].stride()) for c in convs}
    clones: dict[torch.fx.Node, torch.fx.Node] = {}
    for conv in convs:
        weight = conv.args[1]
        assert isinstance(weight, torch.fx.Node)
        if weight not in clones:
            with graph.inserting_before(conv):
                clones[weight] = graph.call_function(
                    aten.clone.default, (weight,), {"memory_format": _CL}
                )
        conv.replace_input_with(weight, clones[weight])
    _propagate(gm, example_inputs)
    if any(tuple(c.meta["val"].stride()) != s for c, s in strides.items()):
        for weight, clone in clones.items():
            clone.replace_all_uses_with(weight)
            graph.erase_node(clone)
        _propagate(gm, example_inputs)
        return 0
    gm.recompile()
    return 1

"""How the joint graph is traced: in one pass (`vjp` of the torch-level graph) when the graph
mutates none of its inputs, in two (functional forward, then its joint) when it does. The one
pass gives the same joint graph as the two, and the compiled function matches eager in both."""

from __future__ import annotations

import collections

import torch
import torch.fx
from aot_helpers import compare, lift

from kiln.autograd import decomps, tracing
from kiln.autograd.analyze import analyze
from kiln.autograd.partition import partition_joint


class Block(torch.nn.Module):
    """In-place ops on intermediates, a no-grad region, a view of an intermediate returned."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.lin(x)
        h.mul_(2.0).add_(1.0)
        with torch.no_grad():
            scale = h.abs().amax(-1, keepdim=True) + 1.0
        y = self.norm(torch.nn.functional.gelu(h) / scale)
        return y, y.view(-1)[:8]


def counting(x, w, calls):
    """Updates `calls` in place: an input mutation."""
    calls.add_(1)
    return ((x @ w).tanh() * calls,)


def _ops(gm: torch.fx.GraphModule) -> collections.Counter:
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _traced_with(monkeypatch, gm, inputs):
    """The joint graph `trace_training` gives, and how many functional-forward traces it made."""
    stage_one = []
    real = tracing.trace_functional_forward
    monkeypatch.setattr(
        tracing, "trace_functional_forward", lambda *a: stage_one.append(1) or real(*a)
    )
    meta = analyze(gm, inputs, True)
    joint = tracing.trace_training(gm, meta, inputs, True, decomps.default_decompositions())
    return meta, joint, len(stage_one)


def test_a_graph_without_input_mutation_is_traced_in_one_pass(monkeypatch):
    gm, params = lift(Block(), 1)
    inputs = [torch.randn(4, 16, requires_grad=True), *params]
    meta, joint, stage_one = _traced_with(monkeypatch, gm, inputs)
    assert stage_one == 0
    assert meta.bases  # the view output's base is a forward output too
    # the same joint graph as the two-pass way, and the same split
    fw = tracing.trace_functional_forward(gm, meta, inputs, True)
    two = tracing.trace_joint(fw, inputs, decomps.default_decompositions())
    assert _ops(joint.gm) == _ops(two.gm)
    assert (joint.num_primals, joint.num_fw_outputs) == (two.num_primals, two.num_fw_outputs)
    assert (joint.diff_inputs, joint.diff_outputs) == (two.diff_inputs, two.diff_outputs)
    assert partition_joint(joint).saved_bytes == partition_joint(two).saved_bytes
    compare(gm, inputs)


def test_a_graph_that_mutates_an_input_is_made_functional_first(monkeypatch):
    gm = torch.fx.symbolic_trace(counting)
    inputs = [torch.randn(3, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)]
    inputs.append(torch.zeros(()))
    meta, joint, stage_one = _traced_with(monkeypatch, gm, inputs)
    assert meta.mutated and stage_one == 1
    assert joint.num_fw_outputs == len(meta.value_specs)
    compare(gm, inputs)

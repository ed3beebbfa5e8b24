"""MLPs through aot_eager: outputs and every gradient against eager, mixed requires_grad,
inference under no_grad, unused parameters, non-differentiable outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from aot_helpers import clone_inputs, compare, lift

from kiln.autograd import aot_compile
from kiln.autograd.backend import aot_eager


class MLP(nn.Module):
    def __init__(self, act, d_in=12, d_hidden=32, d_out=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)
        self.act = act

    def forward(self, x):
        h = self.act(self.fc1(x))
        h = self.act(self.fc2(h)) + h
        return (self.fc3(h),)


@pytest.mark.parametrize("act", [F.relu, F.gelu, torch.tanh, torch.sigmoid, F.silu])
def test_mlp_matches_eager(act):
    gm, params = lift(MLP(act), 1)
    x = torch.randn(7, 12)
    compare(gm, [x, *params])


def test_mlp_with_loss_and_input_grad():
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(F.gelu)

        def forward(self, x, target):
            logits = self.mlp(x)[0]
            return (F.cross_entropy(logits, target), logits.softmax(-1))

    gm, params = lift(WithLoss(), 2)
    x = torch.randn(9, 12, requires_grad=True)
    target = torch.randint(0, 5, (9,))
    compare(gm, [x, target, *params])


def test_mixed_requires_grad():
    gm, params = lift(MLP(F.relu), 1)
    frozen = [p.detach().clone() for p in params[:2]]  # fc1 frozen, the rest trains
    x = torch.randn(6, 12, requires_grad=True)
    compiled = compare(gm, [x, *frozen, *params[2:]])
    # the same compiled callable, called with another requires_grad pattern, recompiles
    compare(gm, [x.detach(), *params], compiled=compiled)
    assert len(compiled.entries) == 2


def test_no_grad_call_traces_forward_only():
    gm, params = lift(MLP(F.relu), 1)
    x = torch.randn(4, 12)
    seen = []

    def record(name):
        def compiler(g, example_inputs):
            seen.append(name)
            return g.forward

        return compiler

    with torch.no_grad():
        compiled = aot_compile(
            gm,
            [x, *params],
            fw_compiler=record("fw"),
            bw_compiler=record("bw"),
            inference_compiler=record("inference"),
        )
        out = compiled(x, *params)
    assert seen == ["inference"]
    assert not out[0].requires_grad
    torch.testing.assert_close(out[0], gm(x, *params)[0])
    # grad mode on, nothing requires grad: still forward only
    plain = [p.detach() for p in params]
    out = compiled(x, *plain)
    assert seen == ["inference", "inference"] and not out[0].requires_grad
    # grad mode on and parameters require grad: forward + backward
    out = compiled(x, *params)
    assert seen[2:] == ["bw", "fw"] and out[0].requires_grad  # the backward compiles first


def test_unused_parameter_gets_no_grad():
    def f(x, w, unused, b):
        return (torch.mm(x, w) + b, unused.detach() * 2)

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(3, 4), torch.randn(4, 5), torch.randn(2), torch.randn(5)]
    args = [a.requires_grad_() for a in args]
    compare(gm, args)
    got = clone_inputs(args)
    aot_eager(gm, got)(*got)[0].sum().backward()
    assert got[2].grad is None and got[1].grad is not None


def test_non_differentiable_outputs():
    def f(x, w):
        y = x @ w
        return (y, y.argmax(-1), y > 0, y.detach().exp())

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(5, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)]
    compare(gm, args)
    got = aot_eager(gm, clone_inputs(args))(*clone_inputs(args))
    assert [o.requires_grad for o in got] == [True, False, False, False]


def test_decompositions_are_applied_and_optional():
    def f(x, w):
        return (F.gelu(x @ w).sum(-1),)

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(3, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)]
    graphs = {}

    def keep(name):
        def compiler(g, example_inputs):
            graphs[name] = g
            return g.forward

        return compiler

    aot_compile(gm, clone_inputs(args), fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    # decomposed: no gelu_backward anywhere; its erf runs in whichever graph the cut puts it
    ops = {str(n.target) for g in graphs.values() for n in g.graph.nodes if n.op == "call_function"}
    assert "aten.gelu_backward.default" not in ops and "aten.erf.default" in ops
    compiled = aot_compile(
        gm, clone_inputs(args), fw_compiler=keep("fw"), bw_compiler=keep("bw"), decompositions={}
    )
    bw_ops = {str(n.target) for n in graphs["bw"].graph.nodes if n.op == "call_function"}
    assert "aten.gelu_backward.default" in bw_ops
    compare(gm, args, compiled=compiled)

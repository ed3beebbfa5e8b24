"""Parameters reached through a path kiln does not follow — `self.layers[:n]` builds a new
`ModuleList` — are graph inputs held by reference (as transformers' Llama needs), not
constants: AOT autograd takes the graph and training matches eager."""

from __future__ import annotations

import copy

import torch
from torch import nn

import kiln


class Sliced(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.used = 2

    def forward(self, x):
        for layer in self.layers[: self.used]:
            x = torch.relu(layer(x))
        return x


def test_parameters_behind_a_sliced_module_list_are_inputs():
    graphs = []

    def inspecting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = Sliced()
    compiled = kiln.compile(copy.deepcopy(model), backend=inspecting)
    compiled(torch.randn(4, 8))
    (gm,) = graphs
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]  # no parameter as a constant
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1 + 4  # x, two layers' weight and bias


def test_training_through_a_sliced_module_list_matches_eager():
    torch.manual_seed(1)
    model = Sliced()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(4, 8)
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), ref(x))

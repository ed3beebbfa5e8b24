"""A captured graph whose inputs are all guarded tensors (`CaptureInfo.fixed_call_key`) keeps
one AOT entry and computes no per-call key; what the key would have caught (a parameter's
requires_grad, the grad mode) still changes the result, because capture's guards recompile."""

from __future__ import annotations

import gc

import torch
import torch.nn as nn

import kiln
from kiln.autograd.compile import AotCompiled


def _aot_objects() -> list[AotCompiled]:
    # by type(): isinstance would dereference a dead weakref.proxy among the objects and raise
    return [o for o in gc.get_objects() if issubclass(type(o), AotCompiled)]


def test_captured_graph_uses_one_entry_without_a_key():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(5, 8)
    # the objects themselves, held: a freed object's id can be reused by the new one
    before = _aot_objects()
    held = {id(o) for o in before}
    compiled(x).sum().backward()
    (aot,) = [o for o in _aot_objects() if id(o) not in held]
    assert aot.fixed_key and aot.only is not None

    calls = []
    original = AotCompiled.__dict__["key"]  # the staticmethod itself, restored as it was
    AotCompiled.key = staticmethod(lambda args: calls.append(1) or original.__func__(args))
    try:
        for _ in range(3):
            x = torch.randn(5, 8)
            model.zero_grad()
            compiled(x).sum().backward()
            got = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            model(x).sum().backward()
            for g, p in zip(got, model.parameters()):
                torch.testing.assert_close(g, p.grad)
    finally:
        AotCompiled.key = original
    assert calls == []


def test_freezing_a_parameter_between_calls_still_drops_its_gradient():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    compiled = kiln.compile(model, backend="aot_eager")
    compiled(torch.randn(4, 6)).sum().backward()
    model[0].weight.requires_grad_(False)
    model.zero_grad()
    x = torch.randn(4, 6)
    compiled(x).sum().backward()
    assert model[0].weight.grad is None
    got = model[2].weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(got, model[2].weight.grad)


def test_no_grad_call_after_a_training_call_returns_a_plain_tensor():
    torch.manual_seed(2)
    model = nn.Linear(5, 2)
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(3, 5)
    assert compiled(x).requires_grad
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, model(x).detach())

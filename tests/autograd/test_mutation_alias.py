"""Input mutation, aliased and view outputs, and grad-mode regions behave as in eager."""

from __future__ import annotations

import operator

import pytest
import torch
from aot_helpers import clone_inputs, compare

from kiln.autograd import AotUnsupported
from kiln.autograd.backend import aot_eager

trace = torch.fx.symbolic_trace


def _rand(*shape, grad=False):
    return torch.randn(*shape).requires_grad_(grad)


def test_in_place_on_inputs_is_written_back():
    def f(x, buf, counter, w):
        buf.mul_(0.9).add_(x.detach().mean(0), alpha=0.1)  # an EMA, like running stats
        counter.add_(1)
        y = torch.tanh(x @ w)
        return (y * buf,)

    gm = trace(f)
    args = [_rand(4, 6, grad=True), _rand(6), torch.tensor(3), _rand(6, 6, grad=True)]
    compare(gm, args)
    got = clone_inputs(args)
    aot_eager(gm, clone_inputs(args))(*got)
    assert got[2].item() == 4 and not torch.equal(got[1], args[1])


def test_mutation_of_input_slice_and_view():
    def f(x, buf):
        buf[1:3].copy_(x[0, :2] * 2)  # mutation through a view of the input
        v = buf.view(2, 4)
        v.add_(1)
        return (buf.sum() * x,)

    gm = trace(f)
    compare(gm, [_rand(4, 8, grad=True), _rand(8)])


def test_mutated_input_that_requires_grad():
    """In-place on a non-leaf input that requires grad: eager rebases its history."""

    def f(x, w):
        x.mul_(w)
        return (x.sin(),)

    gm = trace(f)
    a, w = _rand(3, 5, grad=True), _rand(3, 5, grad=True)
    compiled = aot_eager(gm, [a.detach() * 1, w.detach()])
    for fn in (gm, compiled):
        a.grad = w.grad = None
        x = a * 2  # non-leaf
        out = fn(x, w)
        out[0].sum().backward()
        torch.testing.assert_close(x, a * 2 * w)
        if fn is gm:
            ref = (out[0].detach(), a.grad.clone(), w.grad.clone(), x._version)
        else:
            torch.testing.assert_close(out[0], ref[0])
            torch.testing.assert_close(a.grad, ref[1])
            torch.testing.assert_close(w.grad, ref[2])
            assert x.grad_fn is not None


def test_outputs_aliasing_inputs():
    def f(x, w):
        return (x, x.view(-1), x.t(), x[1], w @ w)

    gm = trace(f)
    args = [_rand(4, 4, grad=True), _rand(4, 4, grad=True)]
    compare(gm, args)
    got = clone_inputs(args)
    outs = aot_eager(gm, clone_inputs(args))(*got)
    x = got[0]
    assert outs[0] is x
    for view in outs[1:4]:
        assert view._is_view() and view._base is x
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    with torch.no_grad():  # a write through the returned view shows in the input, as in eager
        outs[2][0, 1] = 100.0
    assert x[1, 0].item() == 100.0


def test_outputs_aliasing_each_other():
    def f(x, w):
        y = x @ w
        z = (x + 1).relu()
        return (y, y.view(-1), y, z.t(), z[:, 0])

    gm = trace(f)
    args = [_rand(3, 4, grad=True), _rand(4, 4, grad=True)]
    compare(gm, args)
    got = clone_inputs(args)
    y, flat, same, zt, zcol = aot_eager(gm, clone_inputs(args))(*got)
    assert same is y
    assert flat._base is y and flat.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    # z was never returned, yet its two views share its storage, as eager's do
    assert zt._base is zcol._base and zt._base is not None
    with torch.no_grad():
        y[0, 0] = 7.0
    assert flat[0].item() == 7.0


def test_output_and_its_detached_alias():
    def f(x, w):
        y = torch.tanh(x @ w)
        return (y, y.detach(), y.detach()[0])

    gm = trace(f)
    compare(gm, [_rand(3, 4, grad=True), _rand(4, 4, grad=True)])


def test_mutated_input_returned():
    def f(x, buf):
        buf.add_(x)
        return (buf, buf * 2)

    gm = trace(f)
    args = [_rand(5), _rand(5)]
    compare(gm, args)
    got = clone_inputs(args)
    out = aot_eager(gm, clone_inputs(args))(*got)
    assert out[0] is got[1]


def _graph_with_no_grad_region() -> torch.fx.GraphModule:
    """What capture records for

        with torch.no_grad():
            scale = (x @ w).abs().mean()
        return (x @ w) * scale, scale

    (symbolic_trace would run `_set_grad_enabled` instead of recording it)."""
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.call_function(torch._C._set_grad_enabled, (False,))
    mm = g.call_function(torch.matmul, (x, w))
    scale = g.call_method("mean", (g.call_method("abs", (mm,)),))
    g.call_function(torch._C._set_grad_enabled, (True,))
    y = g.call_function(operator.mul, (g.call_function(torch.matmul, (x, w)), scale))
    g.output((y, scale))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_grad_mode_regions_in_the_graph():
    gm = _graph_with_no_grad_region()
    args = [_rand(4, 4, grad=True), _rand(4, 4, grad=True)]
    compare(gm, args)
    got = clone_inputs(args)
    y, scale = aot_eager(gm, clone_inputs(args))(*got)
    assert y.requires_grad and not scale.requires_grad
    assert torch.is_grad_enabled()
    y.sum().backward()  # the gradient does not flow through `scale`
    torch.testing.assert_close(got[1].grad, got[0].t() @ torch.ones(4, 4) * scale)


def test_output_not_requiring_grad_mixed_with_ones_that_do():
    def f(x, c):
        return (x * c, c + 1, (x * c).detach())

    gm = trace(f)
    compare(gm, [_rand(3, 3, grad=True), _rand(3, 3)])


def test_non_tensor_and_integer_inputs():
    def f(x, idx, w):
        return (w[idx] * x, idx + 1)

    gm = trace(f)
    compare(gm, [_rand(3, 5, grad=True), torch.tensor([0, 2, 2]), _rand(4, 5, grad=True)])


def test_metadata_mutation_is_refused_with_a_fix():
    def f(x):
        x.t_()
        return (x + 1,)

    with pytest.raises(AotUnsupported, match="shape or strides in place.*Fix: make"):
        aot_eager(trace(f), [_rand(3, 4)])


def test_mutated_input_aliasing_another_input_is_refused():
    def f(a, b):
        a.add_(1)
        return (a + b,)

    x = _rand(4)
    with pytest.raises(AotUnsupported, match="shares memory with input 1"):
        aot_eager(trace(f), [x, x.view(4)])


def test_aliasing_check_looks_each_input_up_once():
    """Many mutated inputs (an optimizer step: its parameters and states) are checked against
    the others by their storages, grouped once: the check compared each mutated input with
    every input (GPT-2's AdamW step: 876,901 storage lookups, seconds of its compile); the
    refusal still names the aliasing input, and a step over separate tensors compiles with
    eager's values."""
    from unittest import mock

    from kiln.autograd import analyze

    n = 40
    g = torch.fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n)]
    for x in xs:
        g.call_method("mul_", (x, 0.5))
    g.output((g.call_function(operator.add, (xs[0], 1)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    args = [_rand(3) for _ in range(n)]
    real = analyze._storage
    calls = []

    def counted(t):
        calls.append(1)
        return real(t)

    got = clone_inputs(args)
    with mock.patch.object(analyze, "_storage", counted):
        out = aot_eager(gm, clone_inputs(args))(*got)
    torch.testing.assert_close(out[0], args[0] * 0.5 + 1)
    for a, b in zip(args, got):
        torch.testing.assert_close(b, a * 0.5)
    assert len(calls) <= 6 * n, len(calls)  # linear in the inputs, not n * n
    aliased = [args[0], args[0].view(3)] + [_rand(3) for _ in range(n - 2)]
    with pytest.raises(AotUnsupported, match="input 0 is mutated in place and shares memory "):
        aot_eager(gm, aliased)

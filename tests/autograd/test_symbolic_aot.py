"""AOT autograd on symbolic sizes: one trace serves every size, and its shape facts are checked.

A graph capture made with dynamic sizes is traced once, with capture's fake tensors and shape
environment: forward and backward (or the inference graph) have symbolic sizes, the backward
takes the sizes it needs as ints, and every later size reuses them. Before, `aot_compile` kept
an entry per input shape (a trace and a build for every new length). Every test compares with
eager PyTorch on fresh random data at each size, and counts the AOT traces and the graphs
handed to the compilers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from aot_helpers import clone_inputs

import kiln
from kiln.autograd import aot_compile
from kiln.autograd import compile as aot
from kiln.autograd.backend import eager_graph
from kiln.contracts import takes_capture_info


@pytest.fixture
def traces(monkeypatch):
    """Every AOT trace made during the test (one per compiled entry): the graph traced."""
    made: list = []
    for name in ("trace_training", "trace_inference"):
        real = getattr(aot, name)

        def counting(*args, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            made.append(out.gm)
            return out

        monkeypatch.setattr(aot, name, counting)
    kiln.reset()
    yield made
    kiln.reset()


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.find_nodes(op="placeholder"):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) or (
            isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape)
        ):
            return True
    return False


def counting_backend(compiled_graphs: list, **aot_kwargs):
    """AOT autograd on eager kernels, recording (kind, graph) of every graph compiled."""

    def compiler(kind):
        def compile_one(gm, example_inputs):
            compiled_graphs.append((kind, gm))
            return eager_graph(gm, example_inputs)

        return compile_one

    @takes_capture_info
    def backend(gm, example_inputs, info=None):
        return aot_compile(
            gm,
            example_inputs,
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            fixed_call_key=info.fixed_call_key,
            **aot_kwargs,
        )

    return backend


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 16)

    def forward(self, x):
        h = self.norm(F.gelu(self.fc(x)))
        return self.out(h).softmax(-1) + x


def _train_and_compare(model, compiled, x):
    ref = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is None for g in ref.values())
    x_ref = x.detach().clone().requires_grad_(True)
    out = compiled(x)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    expected = model(x_ref)
    expected.backward(grad_out)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)
    model.zero_grad(set_to_none=True)


def test_training_at_every_size_is_traced_and_compiled_once(traces):
    torch.manual_seed(0)
    model = Block()
    graphs: list = []
    compiled = kiln.compile(model, backend=counting_backend(graphs), dynamic=True)
    for b, t in [(3, 5), (2, 9), (4, 13), (3, 6), (5, 17)]:
        _train_and_compare(model, compiled, torch.randn(b, t, 16, requires_grad=True))
    assert len(traces) == 1 and _symbolic(traces[0]), f"{len(traces)} AOT traces"
    kinds = sorted(kind for kind, _ in graphs)
    assert kinds == ["backward", "forward"], kinds
    assert all(_symbolic(gm) for _, gm in graphs)


def test_inference_at_every_size_is_traced_and_compiled_once(traces):
    torch.manual_seed(1)
    model = Block().eval()
    graphs: list = []
    compiled = kiln.compile(model, backend=counting_backend(graphs), dynamic=True)
    with torch.no_grad():
        for b, t in [(3, 5), (2, 9), (4, 13), (2, 7), (3, 6)]:
            x = torch.randn(b, t, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(traces) == 1 and _symbolic(traces[0]), f"{len(traces)} AOT traces"
    assert [kind for kind, _ in graphs] == ["inference"]
    assert _symbolic(graphs[0][1])


def test_sizes_and_views_returned_are_computed_per_call(traces):
    def f(x, y):
        z = x * y.sum()
        return z[:, 1:].t(), x.shape[0] * 3 + x.shape[1], z.view(-1)

    compiled = kiln.compile(f, backend="aot_eager", dynamic=True)
    for n, m in [(4, 5), (6, 3), (9, 8)]:
        x = torch.randn(n, m, requires_grad=True)
        y = torch.randn(m)
        xe = clone_inputs([x])[0]
        got, want = compiled(x, y), f(xe, y)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is int
        torch.testing.assert_close(got[2], want[2])
        assert got[0]._base is got[2]._base or got[0]._base is got[2]
        (got[0].sum() + got[2].pow(2).sum()).backward()
        (want[0].sum() + want[2].pow(2).sum()).backward()
        torch.testing.assert_close(x.grad, xe.grad)
    assert len(traces) == 1 and _symbolic(traces[0]), f"{len(traces)} AOT traces"


def test_input_mutation_with_symbolic_sizes(traces):
    def f(x, stats):
        stats.mul_(0.9).add_(x.detach().mean(0) * 0.1)
        return (x * stats).tanh()

    compiled = kiln.compile(f, backend="aot_eager", dynamic=True)
    stats, stats_ref = torch.randn(8), None
    stats_ref = stats.clone()
    for n in (5, 11, 7):
        x = torch.randn(n, 8, requires_grad=True)
        xe = clone_inputs([x])[0]
        out, want = compiled(x, stats), f(xe, stats_ref)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(stats, stats_ref)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g)
        torch.testing.assert_close(x.grad, xe.grad)
    assert len(traces) == 1 and _symbolic(traces[0]), f"{len(traces)} AOT traces"


def _mean_split_in_pairs(x, dim, keepdim=False, dtype=None):
    """A decomposition of `mean` over the last dimension that reads a size: even lengths sum
    the elements two by two. Run at an odd length, the graph traced for even ones would be
    wrong (at length 3 the halves are 2 and 1 long and broadcast: a wrong value, no error)."""
    if list(dim) == [-1] and not keepdim and dtype is None and x.shape[-1] % 2 == 0:
        return (x[..., 0::2] + x[..., 1::2]).sum(-1) / x.shape[-1]
    return NotImplemented


def _capture_graph(fn, example):
    """The graph capture makes of `fn` with dynamic sizes, and its example inputs."""
    got = []

    def backend(gm, example_inputs):
        got.append((gm, example_inputs))
        return gm.forward

    kiln.compile(fn, backend=backend, dynamic=True)(example)
    return got[0]


def test_a_shape_fact_aot_tracing_adds_is_checked_on_every_call(traces):
    """The decomposition makes the trace rely on "the last size is even", which capture never
    checked: aot_compile's entry checks it, and an odd length gets an entry traced for its own
    sizes (not the even-length graph, which would give a wrong mean)."""

    def f(x):
        return x.mean(-1) * 2

    gm, example = _capture_graph(f, torch.randn(3, 8))
    table = {torch.ops.aten.mean.dim: _mean_split_in_pairs}
    compiled = aot_compile(
        gm, example, fw_compiler=eager_graph, bw_compiler=eager_graph, decompositions=table
    )
    for n in (8, 6, 3, 10, 3, 5):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x)[0], f(x))
    # one symbolic trace for the even lengths, one per odd length (traced for its sizes)
    assert [_symbolic(gm) for gm in traces] == [True, False, False]


def test_capture_guards_the_shape_facts_of_the_aot_trace(traces):
    """The same decomposition behind kiln.compile: capture reads the shape environment's
    guards after the backend ran, so the "even" fact is one of its guards; an odd length
    recompiles (a symbolic entry for odd lengths), never reusing the even one."""
    graphs: list = []
    table = {torch.ops.aten.mean.dim: _mean_split_in_pairs}

    def f(x):
        return x.mean(-1) * 2

    compiled = kiln.compile(f, backend=counting_backend(graphs, decompositions=table), dynamic=True)
    for n in (8, 6, 3, 10, 5, 7, 4):
        x = torch.randn(2, n, requires_grad=True)
        xe = clone_inputs([x])[0]
        out, want = compiled(x), f(xe)
        torch.testing.assert_close(out, want)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, xe.grad)
    assert [_symbolic(gm) for gm in traces] == [True, True]

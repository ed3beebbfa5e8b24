"""A graph with symbolic sizes that the code generator declines is compiled once per size.

`specialize_per_size` (backends/specialize.py) keeps AOT autograd's one symbolic trace and
builds a concrete copy of the declined graph for each size signature it is called with; each
build is reported; past the limit, or when a concrete copy is declined too, new sizes run the
symbolic graph on eager kernels. Results are compared with eager on fresh random data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
import kiln.codegen
from kiln.autograd.backend import eager_graph
from kiln.backends import builtin
from kiln.backends.specialize import has_symbolic_placeholders, specialize_per_size


def program(x, w):
    return (F.gelu(x @ w) * x.shape[0]).softmax(-1)


def _symbolic_graph():
    graph = make_fx(lambda x, w: (program(x, w),), tracing_mode="symbolic")
    return graph(torch.randn(4, 8), torch.randn(8, 8))


def _run(compiled, *args):
    return compiled(list(args))


class Attempts:
    """A code generator that declines symbolic graphs and compiles concrete ones (on eager
    kernels), counting both."""

    def __init__(self, decline_concrete: bool = False):
        self.symbolic = 0
        self.concrete: list[tuple] = []
        self.decline_concrete = decline_concrete

    def __call__(self, gm, example_inputs):
        if has_symbolic_placeholders(gm):
            self.symbolic += 1
            return None, "symbolic sizes are not supported"
        self.concrete.append(tuple(tuple(x.shape) for x in example_inputs))
        if self.decline_concrete:
            return None, "this device takes nothing"
        return eager_graph(gm, example_inputs), ""


def test_one_build_per_size_each_reported():
    gm = _symbolic_graph()
    attempts, reports = Attempts(), []
    compiled = specialize_per_size(gm, "declined", attempts, reports.append, limit=8)
    w = torch.randn(8, 8)
    for n in (3, 5, 3, 7, 5, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(_run(compiled, x, w)[0], program(x, w))
    assert attempts.concrete == [((3, 8), (8, 8)), ((5, 8), (8, 8)), ((7, 8), (8, 8))]
    assert len(reports) == 3 and all("compiled for sizes" in r for r in reports), reports


def test_past_the_limit_new_sizes_run_on_eager_kernels():
    gm = _symbolic_graph()
    attempts, reports = Attempts(), []
    compiled = specialize_per_size(gm, "declined", attempts, reports.append, limit=2)
    w = torch.randn(8, 8)
    for n in (3, 5, 6, 9, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(_run(compiled, x, w)[0], program(x, w))
    assert len(attempts.concrete) == 2
    assert any("more than 2 size specializations" in r for r in reports), reports


def test_a_declined_concrete_copy_stops_specializing():
    gm = _symbolic_graph()
    attempts, reports = Attempts(decline_concrete=True), []
    compiled = specialize_per_size(gm, "declined", attempts, reports.append, limit=8)
    w = torch.randn(8, 8)
    for n in (3, 5, 6):
        x = torch.randn(n, 8)
        torch.testing.assert_close(_run(compiled, x, w)[0], program(x, w))
    assert len(attempts.concrete) == 1  # tried once, then eager kernels for every size
    assert len(reports) == 1 and "declined too" in reports[0]


def test_inductor_builds_a_declined_symbolic_graph_per_size(monkeypatch):
    """kiln.compile's default backend: AOT autograd traces once with symbolic sizes; every
    graph the code generator did not take with symbolic sizes is built per size, and each such
    build is in `fallbacks()`; none runs on eager kernels."""
    calls: list = []
    real = kiln.codegen.compile_graph

    def recording(gm, example_inputs, *args, **kwargs):
        out = real(gm, example_inputs, *args, **kwargs)
        calls.append((has_symbolic_placeholders(gm), out))
        return out

    monkeypatch.setattr(kiln.codegen, "compile_graph", recording)
    kiln.reset()
    before = len(builtin.fallbacks())
    compiled = kiln.compile(program, dynamic=True)
    w = torch.randn(8, 8)
    for n in (3, 5, 3, 7, 5):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, w), program(x, w))
    new = builtin.fallbacks()[before:]
    assert all(f.stage == "code generation per size" for f in new), new
    symbolic = [out for sym, out in calls if sym]
    concrete = [out for sym, out in calls if not sym]
    assert len(symbolic) == 1, "one symbolic graph, compiled once"
    if isinstance(symbolic[0], kiln.codegen.CompiledGraph):
        assert concrete == [] and new == []
    else:  # declined: one build per size the compiled graph ran at (capture ran the first)
        assert len(concrete) == len(new) == 3
        assert all(isinstance(c, kiln.codegen.CompiledGraph) for c in concrete)
    kiln.reset()
